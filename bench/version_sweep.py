"""Whether `preflight diagnose` names the same cause when the same failure is made under another torch: the
single-host cases of tests/data/logs/make_logs.py (real runs: torchrun, gloo, a DataLoader, a small /dev/shm) run again
under each --python given, and each new log diagnosed beside the shipped log of the same name, which this machine's
torch made. The signatures were written from the shipped logs and the sources' format strings; a version whose words
differ shows here as a log diagnosed otherwise, or not at all.

Each --python is a virtual environment's python with one of PyPI's torch wheels (a CUDA build runs on the CPU here; its
torchrun is taken from the same bin/). make_logs.py runs on this python, every job it starts on the other
(`--torch`), and writes to a folder of its own (`--out`), so the shipped logs are never touched. Per log: the same
codes in the same order (same), the same first code (same first), other codes or none (differs), or no log (the case
wrote none, its launcher refused an option it lacks, or the job was still waiting when make_logs stopped it at its
bound). The cases need root (mount namespaces for /dev/shm), as make_logs.py does.

Usage: ``python bench/version_sweep.py --python VENV/bin/python [--python ...] [--cases A,B] [--hosts] [--markdown]``;
``--smoke``: this machine's python and one case (port-in-use), which must reproduce its shipped diagnosis.
"""

from __future__ import annotations

import argparse
import functools
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from preflight.diagnose import diagnose_file

REPO = Path(__file__).resolve().parent.parent
LOGS = REPO / "tests" / "data" / "logs"
# make_logs.py's cases that run on one host with no sandbox and no second python. Left out: cpu-build, which says
# whether the torch is a CPU build (PyPI's CUDA builds report the missing driver instead, PF100 for PF105), and the
# cases that build namespace hosts or need another program.
CASES = ("unused-parameters", "inplace", "port-in-use", "sampler-with-shuffle", "collective-timeout",
         "collective-size-mismatch", "interface-missing", "rendezvous-timeout", "rendezvous-refused", "dev-shm-full",
         "dev-shm-bus-error", "dev-shm-semaphore", "open-file-limit", "filesystem-full", "launch-environment", "sigterm",
         "peer-exits", "spawn-signal", "monitored-barrier", "late-rank", "clean")
# With --hosts, the cases across network-namespace hosts too (make_logs.py builds and removes them: prefix pflogs,
# 198.18.190.0/24): gloo's view of a name that resolves to loopback, to nowhere or to an address no host has, an MTU
# black hole, a rail astray, ports exhausted, a link that goes down, a node that is lost, an endpoint that drops every
# packet.
HOST_CASES = ("sandbox", "hostname-foreign", "mtu-blackhole", "rail-astray", "ports-exhausted", "link-down", "node-loss",
              "rendezvous-dropped")
CASE_TIMEOUT_S = 400  # make_logs bounds each job at 120 s; a case runs at most three
OUTCOMES = ("same", "same first", "differs", "no log")
REFUSED = "error: unrecognized arguments"  # argparse's words when an older torchrun lacks an option the case gives
BOUNDED = "[make_logs: killed after "  # make_logs' mark on a job it stopped at its bound: still waiting, no failure yet


def codes(path: Path) -> list[str]:
    return [d.code for d in diagnose_file(str(path)).diagnoses]


@functools.cache
def shipped_codes(name: str) -> list[str]:
    """The shipped log's codes, read once for every release compared with it."""
    return codes(LOGS / name)


def torch_version(python: str) -> str:
    result = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True,
                            timeout=180)
    if result.returncode != 0:
        raise SystemExit(f"version_sweep: {python} cannot import torch: {result.stderr.strip().splitlines()[-1:]}")
    return result.stdout.strip().splitlines()[-1]


def make_logs(python: str, cases: list[str], folder: Path) -> dict[str, list[str]]:
    """make_logs.py's cases with every job under python (its --torch), their logs written to folder (its --out): the
    logs each case wrote, as its own lines name them."""
    wrote = {}
    for case in cases:
        started = time.monotonic()
        try:
            result = subprocess.run([sys.executable, str(LOGS / "make_logs.py"), "--torch", python, "--out", str(folder), case],
                                    cwd=folder, capture_output=True, text=True, timeout=CASE_TIMEOUT_S)
            output = result.stdout + result.stderr
        except subprocess.TimeoutExpired:
            output = f"(past {CASE_TIMEOUT_S} s)"
        wrote[case] = re.findall(rf"^{re.escape(case)}: wrote (\S+\.log) \(", output, re.M)
        said = output.strip().splitlines()[-1:] or ["(nothing)"]
        print(f"  {case}: {said[0][:140]} ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    return wrote


def compare(folder: Path, wrote: dict[str, list[str]]) -> list[tuple[str, str, list[str], list[str]]]:
    """(log, outcome, codes now, shipped codes) for every log written, and a row for each case that wrote none."""
    rows = []
    for case, names in wrote.items():
        if not names:
            rows.append((case, "no log", [], []))
        for name in names:
            path, shipped = folder / name, shipped_codes(name)
            text = path.read_text(encoding="utf-8", errors="replace")
            if REFUSED in text or BOUNDED in text:
                rows.append((name, "no log", [], shipped))
                continue
            now = codes(path)
            outcome = "same" if now == shipped else "same first" if now[:1] == shipped[:1] and now else "differs"
            rows.append((name, outcome, now, shipped))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", default=[], metavar="PYTHON", help="a python with another torch")
    parser.add_argument("--cases", help=f"comma-separated make_logs.py cases (default: {len(CASES)} single-host ones)")
    parser.add_argument("--hosts", action="store_true", help=f"add the {len(HOST_CASES)} cases across namespace hosts")
    parser.add_argument("--smoke", action="store_true", help="this machine's python, the port-in-use case only")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = parser.parse_args()
    pythons = args.python or ([sys.executable] if args.smoke else [])
    if not pythons:
        parser.error("give --python (or --smoke)")
    cases = ["port-in-use"] if args.smoke else (args.cases.split(",") if args.cases else list(CASES))
    cases += list(HOST_CASES) if args.hosts and not args.smoke else []
    table, details = [], []
    for python in pythons:
        version = torch_version(python)
        print(f"torch {version} ({python}):", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix="preflight-sweep-") as tmp:
            rows = compare(Path(tmp), make_logs(python, cases, Path(tmp)))
        counts = {o: sum(1 for r in rows if r[1] == o) for o in OUTCOMES}
        table.append((version, len(rows), counts))
        details += [f"torch {version}: {name}: {outcome}, {now or 'nothing'} where the shipped log gives {shipped or 'nothing'}"
                    for name, outcome, now, shipped in rows if outcome != "same"]
    if args.markdown:
        print("| torch | logs | " + " | ".join(OUTCOMES) + " |")
        print("|---|---:|" + "---:|" * len(OUTCOMES))
        for version, n, counts in table:
            print(f"| {version} | {n} | " + " | ".join(str(counts[o]) for o in OUTCOMES) + " |")
    else:
        for version, n, counts in table:
            print(f"torch {version:16} {n:3} logs  " + "  ".join(f"{o} {counts[o]}" for o in OUTCOMES))
    print("\n".join(details))
    return 1 if args.smoke and any(counts["same"] != n for _, n, counts in table) else 0


if __name__ == "__main__":
    sys.exit(main())
