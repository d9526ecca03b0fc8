"""How long the probe takes on this machine, run as the transport runs it (``python3 -``, the script on stdin).

The same run times a bare ``python3 -c pass`` as its baseline, so the numbers say what the probe adds to the
interpreter's own start-up on this host. Each run's CPU time (user + system) is reported beside its wall time: on a
machine shared with other work the wall time measures the load as much as the probe.
With ``--against FILE`` (an earlier probe, such as ``git show REV:preflight/probe.py``) that file is timed in the same
rounds, and the ratio of the two medians says what the change costs.
Usage: ``python bench/probe_speed.py [-n 20] [--python PATH] [--against FILE] [--markdown]``.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from preflight import bundle

GOAL_S = 0.2  # on a CPU host (the GPU node's issue); the probe's NVML path adds what the driver takes


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of values (fraction 0.9 for p90)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def children_cpu_s() -> float:
    """User + system CPU seconds of this process's waited-for children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_runs(argv: list[str], stdin: str, runs: int, cpu: list[float] | None = None) -> tuple[list[float], str]:
    """Wall seconds of each of runs runs of argv (their CPU seconds appended to cpu, when given), and the last run's
    stdout; any failed run stops the benchmark."""
    times, stdout = [], ""
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), children_cpu_s()
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60, check=False)
        times.append(time.perf_counter() - start)
        if cpu is not None:
            cpu.append(children_cpu_s() - start_cpu)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited with {done.returncode}: {done.stderr.strip()[-300:]}")
        stdout = done.stdout
    return times, stdout


def main() -> int:
    """Time the probe and the baseline, alternating so both see the same machine load, and print the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--runs", type=int, default=20, help="runs of each command (default 20)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to run (default: this one)")
    parser.add_argument("--against", type=Path, help="an earlier probe's file, timed in the same rounds")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown for docs/benchmarks.md")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    source = bundle.text(bundle.FACTS)
    against = args.against.read_text(encoding="utf-8") if args.against else None
    time_runs([args.python, "-"], source, 1)  # warm the page cache so the first timed run is not an outlier
    probe: list[float] = []
    baseline: list[float] = []
    elapsed: list[float] = []
    probe_cpu: list[float] = []
    baseline_cpu: list[float] = []
    earlier: list[float] = []
    earlier_cpu: list[float] = []
    for _ in range(args.runs):
        if against is not None:
            earlier += time_runs([args.python, "-"], against, 1, earlier_cpu)[0]
        times, stdout = time_runs([args.python, "-"], source, 1, probe_cpu)
        probe += times
        elapsed.append(json.loads(stdout)["probe"]["elapsed_s"])
        baseline += time_runs([args.python, "-c", "pass"], "", 1, baseline_cpu)[0]
    print(f"python: {args.python} ({args.runs} runs each)")
    if args.markdown:
        print("| what | median | p90 |\n|---|---|---|")
    rows = [("python3 - < the probe's bundle", probe), *([(f"python3 - < {args.against}", earlier)] if earlier else []),
            ("python3 -c pass", baseline), ("probe's own elapsed_s", elapsed), ("probe CPU (user+sys)", probe_cpu),
            ("baseline CPU", baseline_cpu), *([(f"{args.against.name} CPU", earlier_cpu)] if earlier else [])]
    for label, values in rows:
        median, p90 = statistics.median(values), percentile(values, 0.9)
        print(f"| {label} | {median:.3f} s | {p90:.3f} s |" if args.markdown else f"{label:24} median {median:.3f} s   p90 {p90:.3f} s")
    ratio = statistics.median(probe) / statistics.median(baseline)
    print(f"ratio probe/baseline (medians): {ratio:.2f}x; the probe adds {statistics.median(probe) - statistics.median(baseline):.3f} s")
    print(f"probe median {statistics.median(probe):.3f} s (goal < {GOAL_S} s)")
    if earlier:
        print(f"ratio probe/{args.against.name} (medians): wall {statistics.median(probe) / statistics.median(earlier):.3f}x, "
              f"CPU {statistics.median(probe_cpu) / statistics.median(earlier_cpu):.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
