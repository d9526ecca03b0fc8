"""`preflight check playbook=facts` against `pdsh -R ssh` running the same probe, on 8, 16 and 32
namespace hosts built on this machine (root needed), in one run.

Both reach every host over real SSH with the same key and known_hosts, 64 hosts at once, and run
the same probe with the same python: pdsh runs the probe file (it cannot feed stdin to every
host), preflight sends it on stdin. Runs alternate between the two so that background load hits
both alike. Usage: ``python bench/ssh_fanout.py [--sizes 8 16 32] [--repeat 5] [--markdown]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from preflight.sandbox import Sandbox

PROBE = Path(__file__).resolve().parent.parent / "preflight" / "probe.py"
GOAL = 0.8  # preflight / pdsh at 32 hosts


def time_pdsh(sandbox: Sandbox) -> float:
    """Wall seconds for pdsh to run the probe on every host; fails unless every host printed facts."""
    env = {
        **os.environ,
        "PDSH_SSH_ARGS_APPEND": f"-F none -i {sandbox.identity} -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=yes "
                                f"-o UserKnownHostsFile={sandbox.known_hosts} -o GlobalKnownHostsFile=none -o ConnectTimeout=10",
    }
    hosts = ",".join(h.address for h in sandbox.hosts)
    began = time.perf_counter()
    done = subprocess.run(["pdsh", "-R", "ssh", "-f", "64", "-l", "root", "-w", hosts, f"{sys.executable} {PROBE}"],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    elapsed = time.perf_counter() - began
    answered = {line.split(":", 1)[0] for line in done.stdout.splitlines() if '"probe"' in line}
    if done.returncode != 0 or len(answered) != len(sandbox.hosts):
        raise SystemExit(f"pdsh: {len(answered)} of {len(sandbox.hosts)} hosts answered: {done.stderr[-500:]}")
    return elapsed


def time_preflight(sandbox: Sandbox, folder: Path) -> float:
    """Wall seconds for the whole `preflight check` command; fails unless every host passed."""
    began = time.perf_counter()
    done = subprocess.run(["preflight", "check", "--json", "--config-dir", str(folder / "conf"), "cluster=bench", "playbook=facts",
                           f"state_dir={folder / 'state'}"], capture_output=True, text=True, timeout=300, check=False)
    elapsed = time.perf_counter() - began
    report = json.loads(done.stdout) if done.stdout else {}
    reached = [h for h in report.get("hosts", []) if h["facts"] is not None]
    if len(reached) != len(sandbox.hosts):
        raise SystemExit(f"preflight: {len(reached)} of {len(sandbox.hosts)} hosts answered: {done.stderr[-500:]}")
    return elapsed


def main() -> None:
    """Build each cluster size, time both tools alternately, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown for docs/benchmarks.md")
    args = parser.parse_args()
    if shutil.which("pdsh") is None or shutil.which("preflight") is None:
        raise SystemExit("needs pdsh (Debian package pdsh) and preflight on PATH")
    rows = []
    for index, size in enumerate(args.sizes):
        with tempfile.TemporaryDirectory() as tmp, Sandbox.up(size, prefix=f"bench{index}", index=200 + index) as sandbox:
            folder = Path(tmp)
            sandbox.write_cluster_config(folder / "conf" / "cluster" / "bench.yaml", name="bench")
            time_pdsh(sandbox)  # warm the page cache for both tools alike
            time_preflight(sandbox, folder)
            pdsh, preflight = [], []
            for _ in range(args.repeat):
                pdsh.append(time_pdsh(sandbox))
                preflight.append(time_preflight(sandbox, folder))
            rows.append((size, statistics.median(pdsh), statistics.median(preflight)))
            print(f"{size} hosts: pdsh {rows[-1][1]:.2f} s, preflight {rows[-1][2]:.2f} s", file=sys.stderr, flush=True)
    if args.markdown:
        print("| hosts | pdsh -R ssh (median) | preflight check (median) | preflight ÷ pdsh |")
        print("|---|---|---|---|")
        for size, pdsh_s, preflight_s in rows:
            print(f"| {size} | {pdsh_s:.2f} s | {preflight_s:.2f} s | {preflight_s / pdsh_s:.2f} |")
    else:
        for size, pdsh_s, preflight_s in rows:
            print(f"{size:>3} hosts  pdsh {pdsh_s:6.2f} s  preflight {preflight_s:6.2f} s  ratio {preflight_s / pdsh_s:.2f}")
    ratio = rows[-1][2] / rows[-1][1]
    print(f"ratio at {rows[-1][0]} hosts: {ratio:.2f} (goal <= {GOAL})", file=sys.stderr)


if __name__ == "__main__":
    main()
