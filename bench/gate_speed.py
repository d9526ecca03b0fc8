"""How long `preflight gate` takes on this machine, against what any gate must pay and what a torch-based one would.

Each round runs, in turn: the installed `preflight gate` (the whole command: start-up, Hydra compose, the probe,
the checks, the line), `python3 -c pass` (the interpreter's floor), the probe alone as the gate runs it, and
`python3 -c "import torch"` (the least a gate that imports torch pays). The ratios say what the gate adds to the
floor and how far below a torch import it stays. Usage: ``python bench/gate_speed.py [-n 20] [-- GATE_ARGS...]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

from probe_speed import percentile

from preflight import bundle

GOAL_S = 1.0  # Slurm runs the gate on every node; it must not be the slow part of a job's start


def timed(argv: list[str], stdin: str = "", allowed: tuple[int, ...] = (0,)) -> float:
    """Wall seconds of one run; a run that exits otherwise than allowed stops the benchmark."""
    start = time.perf_counter()
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode not in allowed:
        raise SystemExit(f"{' '.join(argv)} exited with {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}")
    return elapsed


def main() -> int:
    """Alternate the four commands so that all see the same machine load, and print medians, p90 and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--runs", type=int, default=20, help="rounds (default 20)")
    parser.add_argument("gate_args", nargs="*", help="arguments for `preflight gate` (after --)")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    exe = shutil.which("preflight")
    if exe is None:
        parser.error("the console script `preflight` is not installed (pip install -e .)")
    python, source = sys.executable, bundle.text(bundle.FACTS)
    # A failing check is still a full gate run (exit 1); only bad input (2) or a crash stops the benchmark.
    commands = {
        "preflight gate": lambda: timed([exe, "gate", *args.gate_args], allowed=(0, 1, 3)),
        "python3 -c pass (floor)": lambda: timed([python, "-c", "pass"]),
        "probe alone": lambda: timed([python, "-"], source),
        "python3 -c 'import torch'": lambda: timed([python, "-c", "import torch"]),
    }
    for run in commands.values():
        run()  # warm the page cache so that no first run is an outlier
    times: dict[str, list[float]] = {label: [] for label in commands}
    for _ in range(args.runs):
        for label, run in commands.items():
            times[label].append(run())
    line = subprocess.run([exe, "gate", *args.gate_args], capture_output=True, text=True, timeout=120, check=False).stdout.strip()
    print(f"machine: {platform.node()} ({platform.machine()}, {len(os.sched_getaffinity(0))} cpus); "
          f"python {platform.python_version()}; {args.runs} rounds")
    print(f"the gate said: {line}")
    print("| what | median | p90 |\n|---|---|---|")
    for label, values in times.items():
        print(f"| {label} | {statistics.median(values):.3f} s | {percentile(values, 0.9):.3f} s |")
    gate, floor, torch = (statistics.median(times[k]) for k in ("preflight gate", "python3 -c pass (floor)", "python3 -c 'import torch'"))
    print(f"gate / floor: {gate / floor:.1f}x; gate / import torch: {gate / torch:.2f}; gate median {gate:.3f} s (goal < {GOAL_S} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
