"""How fast `preflight check` answers on namespace hosts built on this machine (root needed), each figure beside a
baseline measured in the same run, runs alternating so that background load hits both alike:

1. A filtered rendezvous port (``iptables -I INPUT -p tcp --dport PORT -j DROP`` on the master): the default check,
   which names the port in its connectivity stage before any torchrun, against the same check without that stage
   (``playbook.stages=[facts,collective,sweep]``: what a check did before it, waiting out the rendezvous and splitting
   the hosts). Goal: named in <= 10 s of check wall time on 4 hosts.
2. A healthy cluster: the whole default check (facts, connectivity, collective with the adaptive sweep) against a bare
   ``torchrun`` launch across the same hosts, with the same launch arguments and interfaces, whose one rank per host
   only does init_process_group and one barrier. Goal: <= 1.5x. The sweep's busbw at its largest size is shown beside
   the fixed sweep's (``collective.sweep_adaptive=false``), which must stay within 10%.

Usage: ``python bench/check_speed.py [--hosts 4] [--repeat 3] [--markdown] [--prefix pfbench --index 240] [--smoke]``;
``--smoke`` takes every step at the least cost (2 hosts, once, no warm-up check, sweeps up to 1 MiB, a 5 s rendezvous
deadline and no isolation for the check that waits the filtered port out; the fixed sweep's check is left out, being
the healthy check's step with one more argument): figures that mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from preflight.sandbox import Sandbox

PORT = 29500
BARE = """import os, torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
print("bare rank", os.environ["RANK"], "done")
"""


@contextmanager
def bench_cluster(prefix: str, index: int, hosts: int, rails: int = 0) -> Iterator[tuple[Sandbox, Path]]:
    """A fresh sandbox of hosts (sandbox prefix, subnet index and rails as Sandbox.up takes them) and a folder holding its
    cluster config (cluster=bench) and the bare launch's script, both removed on the way out."""
    Sandbox.down_prefix(prefix)
    sandbox = Sandbox.up(hosts, prefix=prefix, index=index, rails=rails)
    folder = Path(tempfile.mkdtemp(prefix="preflight-bench-"))
    try:
        sandbox.write_cluster_config(folder / "conf" / "cluster" / "bench.yaml", name="bench")
        script = folder / "bare.py"
        script.write_text(BARE, encoding="utf-8")
        script.chmod(0o644)
        folder.chmod(0o755)
        yield sandbox, folder
    finally:
        sandbox.down()
        subprocess.run(["rm", "-rf", str(folder)], check=False)


def check(folder: Path, *overrides: str) -> tuple[dict[str, Any], float]:
    began = time.perf_counter()
    done = subprocess.run(["preflight", "check", "--json", "--config-dir", str(folder / "conf"), "cluster=bench",
                           f"state_dir={folder / 'state'}", f"network.master_port={PORT}", *overrides],
                          capture_output=True, text=True, timeout=900, check=False)
    elapsed = time.perf_counter() - began
    if not done.stdout:
        raise SystemExit(f"preflight check did not run: {done.stderr[-800:]}")
    return json.loads(done.stdout), elapsed


def bare_torchrun(sandbox: Sandbox, script: Path) -> float:
    """Wall seconds of one torchrun launch across every host at once, over SSH like the check's."""
    master = sandbox.hosts[0]
    torchrun = shlex.quote(str(Path(master.python).parent / "torchrun"))
    run_id = f"bare-{uuid.uuid4().hex[:8]}"
    began = time.perf_counter()
    started = []
    for index, host in enumerate(sandbox.hosts):
        args = (f"--nnodes {len(sandbox.hosts)} --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint {master.address}:{PORT} "
                f"--rdzv-id {run_id} --rdzv-conf is_host={1 if index == 0 else 0} --local-addr {host.address} --max-restarts 0")
        command = f"GLOO_SOCKET_IFNAME={host.ifname} {torchrun} {args} {shlex.quote(str(script))}"
        started.append(subprocess.Popen(sandbox.ssh_argv(host.name, command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for process in started:
        out, err = process.communicate(timeout=300)
        if process.returncode != 0 or "done" not in out:
            raise SystemExit(f"the bare launch failed: {err[-800:]}")
    return time.perf_counter() - began


def largest_busbw(report: dict[str, Any]) -> tuple[int, float]:
    rows = report["collective"]["sweep"]
    top = max(row["bytes"] for row in rows)
    return top, max(row["busbw_min_GBps"] for row in rows if row["bytes"] == top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--prefix", default="pfbench", help="the hosts' sandbox prefix (removed first if a killed run left it)")
    parser.add_argument("--index", type=int, default=240, help="the hosts' subnet: the index-th /24 of 198.18.0.0/15")
    parser.add_argument("--smoke", action="store_true", help="every step at the least cost (2 hosts, once)")
    args = parser.parse_args()
    # Without the connectivity stage the filtered port is waited out: its rendezvous deadline, then the split. The fixed
    # sweep's sizes above 1 MiB are a third of its check's CPU on 2 hosts.
    waited_out = ["collective.rendezvous_timeout_s=5", "collective.isolate=false"] if args.smoke else []
    sweep = ["collective.sweep_max_bytes=1048576"] if args.smoke else []
    if args.smoke:
        args.hosts, args.repeat = 2, 1
    with bench_cluster(args.prefix, args.index, args.hosts) as (sandbox, folder):
        if not args.smoke:
            check(folder)  # composes and caches the config; warms the hosts' page cache for torch
        named, without, full, bare, adaptive_bw, fixed_bw = [], [], [], [], [], []
        drop = ["iptables", "-w", "5", "-I", "INPUT", "-p", "tcp", "--dport", str(PORT), "-j", "DROP"]
        for _ in range(args.repeat):
            sandbox.run_in(sandbox.hosts[0].name, drop).check_returncode()
            try:
                report, seconds = check(folder)
                pf609 = [f for f in report["findings"] if f["code"] == "PF609" and f["status"] == "fail"]
                if not pf609 or f":{PORT} is filtered" not in pf609[0]["message"]:
                    raise SystemExit(f"the filtered port was not named: {report['findings'][:3]}")
                named.append(seconds)
                report, seconds = check(folder, "playbook.stages=[facts,collective,sweep]", *waited_out)
                without.append(seconds)
            finally:
                sandbox.run_in(sandbox.hosts[0].name, ["iptables", "-w", "5", "-D", *drop[4:]]).check_returncode()
            report, seconds = check(folder, *sweep)
            if report["status"] != "pass":
                raise SystemExit(f"the healthy check did not pass: {report['findings'][:3]}")
            full.append(seconds)
            adaptive_bw.append(largest_busbw(report))
            bare.append(bare_torchrun(sandbox, folder / "bare.py"))
            if not args.smoke:
                report, _ = check(folder, "collective.sweep_adaptive=false", *sweep)
                fixed_bw.append(largest_busbw(report))
        median = statistics.median
        rows = [
            ("filtered rendezvous port, default check (named, PF609)", median(named), "s"),
            ("filtered rendezvous port, check without the connectivity stage", median(without), "s"),
            ("healthy: default check (facts, connectivity, collective, adaptive sweep)", median(full), "s"),
            ("healthy: bare torchrun launch (init_process_group + one barrier)", median(bare), "s"),
        ]
        ratio = median(full) / median(bare)
        a_size, a_bw = max(adaptive_bw)
        f_size, f_bw = max(fixed_bw, default=(0, math.nan))  # a step --smoke leaves out
        if args.markdown:
            print(f"| figure ({args.hosts} hosts, median of {args.repeat}) | value |\n|---|---|")
            for label, value, unit in rows:
                print(f"| {label} | {value:.1f} {unit} |")
            print(f"| default check / bare torchrun launch | {ratio:.2f} (goal <= 1.5) |")
            print(f"| busbw at the largest size: adaptive sweep ({a_size:,} B) / fixed sweep ({f_size:,} B) | "
                  f"{a_bw:.3f} / {f_bw:.3f} GB/s = {a_bw / f_bw:.2f} (goal >= 0.90) |")
        else:
            for label, value, unit in rows:
                print(f"{label}: {value:.1f} {unit}")
            print(f"check / bare: {ratio:.2f}; busbw largest adaptive {a_size} B {a_bw:.3f} vs fixed {f_size} B {f_bw:.3f} GB/s")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
