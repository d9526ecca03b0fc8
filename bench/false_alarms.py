"""How often the default check names a healthy host: `preflight check` as users run it (no playbook given: the default,
playbook=full) on healthy namespace hosts built on this machine (root needed), N runs in a row per cluster size.

Per run: the code, host and status of every finding that warns or fails (host * is the whole cluster), the check's exit
code, its wall time and the neighbour test's repeats that ran (more than collective.speed.<backend>.repeats: extra ones
for a suspect slow only while its ranks were starved of CPU, starved_repeats). Per cluster size: the runs, the runs in
which a host (or the cluster, *) was failed, those in which one was warned, those left incomplete (exit 3), and in how
many runs each code warned or failed. Every host is healthy, so each of those is a false alarm. The runs of a size share
the cluster's state folder, as a user's checks of one cluster do: from the second run on, its bandwidth is also judged
against the history of the runs before it (PF613).

It measures and does not judge: it exits 0 once its tables are printed, whatever the checks said; only a check that
crashed (an exit code other than 0, 1 or 3, or no report) stops it.

Usage: ``python bench/false_alarms.py [--hosts 4 6] [--runs 20] [--markdown] [--prefix pfalarm --index 244]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from check_speed import bench_cluster

CHECK_TIMEOUT_S = 900.0  # a whole default check on a loaded 2-core machine takes 10 to 60 s
CHECK_EXITS = (0, 1, 3)  # passed, a check failed, incomplete (preflight's exit codes); any other is a crash


@dataclass(frozen=True)
class Run:
    """One default check of a healthy cluster: what it warned or failed, as (code, host, status), sorted."""

    hosts: int
    number: int
    exit_code: int
    seconds: float
    named: list[tuple[str, str, str]]
    repeats: int  # the neighbour test's repeats that ran (its links' largest repeat): past the settings' repeats, extra
    # ones for a suspect slow only while starved of CPU (collective.speed.<backend>.starved_repeats)

    def hosts_with(self, status: str) -> list[str]:
        return sorted({host for _code, host, s in self.named if s == status})

    def described(self) -> str:
        return ", ".join(f"{code} {host} ({status})" for code, host, status in self.named) or "nothing"


def default_check(folder: Path, hosts: int, number: int) -> Run:
    """One `preflight check --json` with no playbook or setting of the bench's own, on the bench cluster."""
    began = time.perf_counter()
    try:
        done = subprocess.run(["preflight", "check", "--json", "--config-dir", str(folder / "conf"), "cluster=bench",
                               f"state_dir={folder / 'state'}"], capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as e:
        raise SystemExit(f"run {number} on {hosts} hosts: the check ran past {CHECK_TIMEOUT_S:g} s") from e
    seconds = time.perf_counter() - began
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        report = None
    if done.returncode not in CHECK_EXITS or not isinstance(report, dict):
        raise SystemExit(f"run {number} on {hosts} hosts: the check crashed (exit {done.returncode}, "
                         f"{'a report' if report else 'no report'}): {done.stderr.strip()[-800:]}")
    named = sorted({(f["code"], f["host"], f["status"]) for f in report["findings"] if f["status"] in ("warn", "fail")})
    speed = (report.get("collective") or {}).get("speed") or {}
    repeats = max((int(link["repeat"]) for link in speed.get("links", [])), default=0)
    return Run(hosts, number, done.returncode, seconds, named, repeats)


def summary(runs: list[Run]) -> tuple[int, int, int, str]:
    """Runs with a host failed, with a host warned, incomplete; and each code with the number of runs it was named in."""
    codes: Counter[str] = Counter()
    for run in runs:
        codes.update({f"{code} ({status})" for code, _host, status in run.named})
    return (sum(1 for r in runs if r.hosts_with("fail")), sum(1 for r in runs if r.hosts_with("warn")),
            sum(1 for r in runs if r.exit_code == 3), ", ".join(f"{code}: {n}" for code, n in sorted(codes.items())) or "none")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[4, 6], help="cluster sizes, one after another")
    parser.add_argument("--runs", type=int, default=20, help="default checks per cluster size")
    parser.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    parser.add_argument("--prefix", default="pfalarm", help="the hosts' sandbox prefix (removed first if a killed run left it)")
    parser.add_argument("--index", type=int, default=244, help="the hosts' subnet: the index-th /24 of 198.18.0.0/15")
    args = parser.parse_args()
    if args.runs < 1 or min(args.hosts) < 2:
        parser.error("--runs must be at least 1 and every --hosts at least 2")
    runs: list[Run] = []
    for hosts in args.hosts:
        with bench_cluster(args.prefix, args.index, hosts) as (_sandbox, folder):
            for number in range(1, args.runs + 1):
                runs.append(default_check(folder, hosts, number))
                print(f"{hosts} hosts, run {number}: exit {runs[-1].exit_code}, {runs[-1].seconds:.1f} s, {runs[-1].repeats} "
                      f"repeat(s) run, named {runs[-1].described()}", file=sys.stderr, flush=True)
    per_run = [[str(r.hosts), str(r.number), str(r.exit_code), f"{r.seconds:.1f}", str(r.repeats), r.described()] for r in runs]
    per_size = []
    for hosts in args.hosts:
        of_size = [r for r in runs if r.hosts == hosts]
        failed, warned, incomplete, codes = summary(of_size)
        per_size.append([str(hosts), str(len(of_size)), str(failed), str(warned), str(incomplete), codes])
    for header, rows in ((["hosts", "run", "exit", "seconds", "repeats run", "warned or failed (code host status)"], per_run),
                         (["hosts", "runs", "runs with a host failed", "runs with a host warned", "runs incomplete",
                           "codes (runs named in)"], per_size)):
        if args.markdown:
            print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
            print("\n".join("| " + " | ".join(row) + " |" for row in rows))
        else:
            print("\n".join("  ".join(row) for row in [header, *rows]))
        print()


if __name__ == "__main__":
    main()
