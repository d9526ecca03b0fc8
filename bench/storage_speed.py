"""What the storage stage adds to the default check, on namespace hosts built on this machine (root needed): the whole
default check (facts, connectivity, collective, sweep) with one shared storage path at the default write_bytes (8 MiB
per host) against the same check with no path (the stage skipped), runs alternating so that background load hits both
alike; and the stage's own wall time from the report (storage.elapsed_s). Goal: it adds <= 2 s on 4 hosts.

The shared path is a folder of this machine, which every namespace host sees (one ext4 on this VM's disk).

Usage: ``python bench/storage_speed.py [--hosts 4] [--repeat 5] [--markdown] [--prefix pfstore --index 242] [--smoke]``;
``--smoke`` takes every step at the least cost (2 hosts, once, no warm-up checks; the default check without the path is
left out, being the step with the path with one argument less): figures that mean nothing.
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from check_speed import bench_cluster, check


def passing_check(folder: Path, *overrides: str) -> tuple[dict[str, Any], float]:
    """check_speed's check, which must pass: a failing one would time something else."""
    report, elapsed = check(folder, *overrides)
    if report["status"] != "pass":
        raise SystemExit(f"the check did not pass: {[f for f in report['findings'] if f['status'] != 'pass'][:3]}")
    return report, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--prefix", default="pfstore", help="the hosts' sandbox prefix (removed first if a killed run left it)")
    parser.add_argument("--index", type=int, default=242, help="the hosts' subnet: the index-th /24 of 198.18.0.0/15")
    parser.add_argument("--smoke", action="store_true", help="every step at the least cost (2 hosts, once)")
    args = parser.parse_args()
    if args.smoke:
        args.hosts, args.repeat = 2, 1
    shared = Path(tempfile.mkdtemp(prefix="preflight-bench-ckpt-", dir="/tmp"))
    try:
        with bench_cluster(args.prefix, args.index, args.hosts) as (_sandbox, folder):
            with_path = f"storage.paths=[{{path: {shared}, shared: true}}]"
            if not args.smoke:
                passing_check(folder)  # composes and caches both configs; warms the hosts' page cache for torch
                passing_check(folder, with_path)
            without, with_storage, stage, facts, facts_storage = [], [], [], [], []
            for _ in range(args.repeat):
                if not args.smoke:
                    without.append(passing_check(folder)[1])
                report, seconds = passing_check(folder, with_path)
                with_storage.append(seconds)
                stage.append(report["storage"]["elapsed_s"])
                facts.append(passing_check(folder, "playbook=facts")[1])
                facts_storage.append(passing_check(folder, "playbook=storage", with_path)[1])
            def median(values: list[float]) -> float:
                return statistics.median(values) if values else math.nan  # a step --smoke leaves out

            rows = [
                ("default check, no storage path (the stage skipped)", median(without)),
                ("default check, one shared path, 8 MiB per host", median(with_storage)),
                ("  the difference of the medians", median(with_storage) - median(without)),
                ("  the storage stage's own elapsed_s (three rounds)", median(stage)),
                ("playbook=facts", median(facts)),
                ("playbook=storage (facts + storage), one shared path", median(facts_storage)),
            ]
            if args.markdown:
                print(f"| what ({args.hosts} hosts, median of {args.repeat}) | seconds |\n|---|---|")
                for what, value in rows:
                    print(f"| {what.strip()} | {value:.2f} |")
            else:
                for what, value in rows:
                    print(f"{what:60s} {value:7.2f} s")
            print(f"stage elapsed_s each run: {', '.join(f'{s:.2f}' for s in stage)}")
    finally:
        shutil.rmtree(shared, ignore_errors=True)


if __name__ == "__main__":
    main()
