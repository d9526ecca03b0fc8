"""What the storage stage adds to the default check, on namespace hosts built on this machine (root needed): the whole
default check (facts, connectivity, collective, sweep) with one shared storage path at the default write_bytes (8 MiB
per host) against the same check with no path (the stage skipped), runs alternating so that background load hits both
alike; and the stage's own wall time from the report (storage.elapsed_s). Goal: it adds <= 2 s on 4 hosts.

The shared path is a folder of this machine, which every namespace host sees (one ext4 on this VM's disk).

Usage: ``python bench/storage_speed.py [--hosts 4] [--repeat 5] [--markdown]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from preflight.sandbox import Sandbox


def check(folder: Path, *overrides: str) -> tuple[dict[str, Any], float]:
    began = time.perf_counter()
    done = subprocess.run(["preflight", "check", "--json", "--config-dir", str(folder / "conf"), "cluster=bench",
                           f"state_dir={folder / 'state'}", *overrides], capture_output=True, text=True, timeout=900, check=False)
    elapsed = time.perf_counter() - began
    if not done.stdout:
        raise SystemExit(f"preflight check did not run: {done.stderr[-800:]}")
    report = json.loads(done.stdout)
    if report["status"] != "pass":
        raise SystemExit(f"the check did not pass: {[f for f in report['findings'] if f['status'] != 'pass'][:3]}")
    return report, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    prefix = "pfstore"
    Sandbox.down_prefix(prefix)
    sandbox = Sandbox.up(args.hosts, prefix=prefix, index=241)
    folder = Path(tempfile.mkdtemp(prefix="preflight-bench-"))
    shared = Path(tempfile.mkdtemp(prefix="preflight-bench-ckpt-", dir="/tmp"))
    try:
        sandbox.write_cluster_config(folder / "conf" / "cluster" / "bench.yaml", name="bench")
        with_path = f"storage.paths=[{{path: {shared}, shared: true}}]"
        check(folder)  # composes and caches both configs; warms the hosts' page cache for torch
        check(folder, with_path)
        without, with_storage, stage, facts, facts_storage = [], [], [], [], []
        for _ in range(args.repeat):
            without.append(check(folder)[1])
            report, seconds = check(folder, with_path)
            with_storage.append(seconds)
            stage.append(report["storage"]["elapsed_s"])
            facts.append(check(folder, "playbook=facts")[1])
            facts_storage.append(check(folder, "playbook=storage", with_path)[1])
        median = statistics.median
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
        sandbox.down()
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(shared, ignore_errors=True)


if __name__ == "__main__":
    main()
