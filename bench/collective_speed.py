"""The collective stage's speed on namespace hosts built on this machine (root needed), in one run:

1. busbw of preflight's sweep against a plain torch.distributed loop (``bench/plain_loop.py``)
   started by torchrun on the same hosts, ranks, interfaces and sizes; runs alternate so that
   background load hits both alike. The ratio preflight / plain is the goal (>= 0.95).
2. iperf3 between two of the same namespaces, beside it: what the link itself carries.
3. The whole default ``preflight check`` (facts, collective, sweep with the default sizes) on the
   same hosts, end to end (goal: under 30 s on this 2-core machine).

Preflight's sweep is asked for what the plain loop measures: both ops (on gloo it measures all_reduce alone by default)
at every size, with the same warm-up and timed iterations (its adaptive sweep off).

Usage: ``python bench/collective_speed.py [--hosts 4] [--repeat 3] [--markdown] [--prefix bcoll --index 220] [--smoke]``;
``--smoke`` takes every step at the least cost (2 hosts, once, the smallest size, 1 s of iperf3; the whole default check
is left out, being the step of preflight's sweep with fewer arguments): figures that mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from preflight.sandbox import Sandbox

PLAIN_LOOP = Path(__file__).resolve().parent / "plain_loop.py"
SIZES = [1 << 20, 4 << 20, 16 << 20]
OPS = ["all_gather", "all_reduce"]
WARMUP, ITERS = 5, 20
GOAL_RATIO = 0.95
GOAL_CHECK_S = 30.0


def preflight_check(folder: Path, *overrides: str) -> tuple[dict[str, Any], float]:
    """The report and wall seconds of one `preflight check --json` on the bench cluster; fails unless it passed."""
    began = time.perf_counter()
    done = subprocess.run(["preflight", "check", "--json", "--config-dir", str(folder / "conf"), "cluster=bench",
                           f"state_dir={folder / 'state'}", *overrides], capture_output=True, text=True, timeout=600, check=False)
    elapsed = time.perf_counter() - began
    report = json.loads(done.stdout) if done.stdout else {}
    if report.get("status") != "pass" or (report.get("collective") or {}).get("status") != "pass":
        raise SystemExit(f"preflight check did not pass: {done.stderr[-800:] or json.dumps(report.get('findings', [])[:3])}")
    return report, elapsed


@dataclass(frozen=True)
class Plan:
    """What both loops time, each op at each size after its warm-ups (preflight's sweep also times the powers of two
    between the sizes, which the table leaves out)."""

    sizes: list[int]
    warmup: int
    iters: int


FULL = Plan(SIZES, WARMUP, ITERS)
SMOKE = Plan(SIZES[:1], 1, 2)


def preflight_busbw(folder: Path, plan: Plan) -> dict[tuple[str, int], float]:
    """(op, bytes) -> busbw mean over ranks, GB/s, from preflight's sweep of OPS at the plan's sizes."""
    report, _ = preflight_check(folder, "playbook=full", f"collective.sweep_ops=[{','.join(OPS)}]", "collective.sweep_adaptive=false",
                                f"collective.sweep_min_bytes={plan.sizes[0]}", f"collective.sweep_max_bytes={plan.sizes[-1]}",
                                f"collective.warmup={plan.warmup}", f"collective.iters={plan.iters}", "collective.isolate=false")
    return {(row["op"], row["bytes"]): row["busbw_mean_GBps"] for row in report["collective"]["sweep"]}


def plain_busbw(sandbox: Sandbox, port: int, plan: Plan) -> dict[tuple[str, int], float]:
    """(op, bytes) -> busbw mean over ranks, GB/s, from the plain loop under torchrun on every host."""
    master = sandbox.master.address
    outputs: dict[str, subprocess.CompletedProcess[str]] = {}
    config = json.dumps({"sizes": plan.sizes, "ops": OPS, "warmup": plan.warmup, "iters": plan.iters})

    def launch(index: int, name: str) -> None:
        host = sandbox.host(name)
        argv = ["env", f"GLOO_SOCKET_IFNAME={host.ifname}", sys.executable, "-m", "torch.distributed.run",
                "--nnodes", str(len(sandbox.hosts)), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"{master}:{port}", "--rdzv-id", f"plain{port}",
                "--rdzv-conf", f"join_timeout=60,read_timeout=60,is_host={1 if index == 0 else 0}",
                "--local-addr", host.address, "--max-restarts", "0", str(PLAIN_LOOP), config]
        outputs[name] = sandbox.run_in(name, argv, timeout=300)

    threads = [threading.Thread(target=launch, args=(i, h.name)) for i, h in enumerate(sandbox.hosts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=320)
    rows: dict[tuple[str, int], list[float]] = {}
    for name, done in outputs.items():
        if done.returncode != 0:
            raise SystemExit(f"the plain loop failed on {name}: {done.stderr[-800:]}")
        for line in done.stdout.splitlines():
            if line.startswith("PLAIN "):
                row = json.loads(line[len("PLAIN "):])
                rows.setdefault((row["op"], row["bytes"]), []).append(row["busbw_GBps"])
    if len(outputs) != len(sandbox.hosts) or not rows:
        raise SystemExit("the plain loop did not report on every host")
    return {key: statistics.mean(values) for key, values in rows.items()}


def iperf3_gbps(sandbox: Sandbox, seconds: int) -> float:
    """TCP throughput from the second host to the first, GB/s (1e9 bytes), as iperf3 measures it."""
    server_host, client_host = sandbox.hosts[0], sandbox.hosts[1]
    # -1: the server exits after one client; timeouts bound both sides.
    server = threading.Thread(target=sandbox.run_in, args=(server_host.name, ["timeout", "30", "iperf3", "-s", "-1", "-p", "5201"]),
                              kwargs={"timeout": 40})
    server.start()
    time.sleep(0.5)
    done = sandbox.run_in(client_host.name, ["iperf3", "-c", server_host.address, "-p", "5201", "-t", str(seconds), "-J"],
                          timeout=seconds + 20)
    server.join(timeout=40)
    if done.returncode != 0:
        raise SystemExit(f"iperf3 failed: {done.stderr[-500:] or done.stdout[-500:]}")
    return float(json.loads(done.stdout)["end"]["sum_received"]["bits_per_second"]) / 8 / 1e9


def main() -> None:
    """Build the hosts, run the three measurements, print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--markdown", action="store_true", help="print the tables as markdown for docs/benchmarks.md")
    parser.add_argument("--prefix", default="bcoll", help="the hosts' sandbox prefix (removed first if a killed run left it)")
    parser.add_argument("--index", type=int, default=220, help="the hosts' subnet: the index-th /24 of 198.18.0.0/15")
    parser.add_argument("--smoke", action="store_true", help="every step at the least cost (2 hosts, once, one size)")
    args = parser.parse_args()
    if shutil.which("iperf3") is None or shutil.which("preflight") is None:
        raise SystemExit("needs iperf3 (Debian package iperf3) and preflight on PATH")
    plan, iperf3_s = (SMOKE, 1) if args.smoke else (FULL, 3)
    if args.smoke:
        args.hosts, args.repeat = 2, 1
    Sandbox.down_prefix(args.prefix)
    with tempfile.TemporaryDirectory() as tmp, Sandbox.up(args.hosts, prefix=args.prefix, index=args.index) as sandbox:
        folder = Path(tmp)
        sandbox.write_cluster_config(folder / "conf" / "cluster" / "bench.yaml", name="bench")
        ours: dict[tuple[str, int], list[float]] = {}
        plain: dict[tuple[str, int], list[float]] = {}
        for k in range(args.repeat):
            for key, value in preflight_busbw(folder, plan).items():
                ours.setdefault(key, []).append(value)
            for key, value in plain_busbw(sandbox, 29600 + k, plan).items():
                plain.setdefault(key, []).append(value)
        link = statistics.median(iperf3_gbps(sandbox, iperf3_s) for _ in range(args.repeat))
        checks = [] if args.smoke else [preflight_check(folder)[1] for _ in range(args.repeat)]
    table = [(op, size, statistics.median(plain[(op, size)]), statistics.median(ours[(op, size)])) for op in OPS for size in plan.sizes]
    ratios = [o / p for _op, _size, p, o in table]
    check_s = statistics.median(checks) if checks else math.nan  # a step --smoke leaves out
    if args.markdown:
        print("| op | bytes | plain loop busbw | preflight busbw | preflight ÷ plain |\n|---|---|---|---|---|")
        for (op, size, p, o), ratio in zip(table, ratios, strict=True):
            print(f"| {op} | {size:,} | {p:.3f} GB/s | {o:.3f} GB/s | {ratio:.2f} |")
        print(f"\niperf3 between h2 and h1: {link:.2f} GB/s ({link * 8:.1f} Gbit/s), median of {args.repeat}.")
        print(f"\nWhole `preflight check` (facts + collective + sweep, default sizes) on {args.hosts} hosts: "
              f"{check_s:.1f} s median of {args.repeat} ({', '.join(f'{c:.1f}' for c in checks)}).")
    else:
        for (op, size, p, o), ratio in zip(table, ratios, strict=True):
            print(f"{op:>10} {size:>10}  plain {p:8.3f} GB/s  preflight {o:8.3f} GB/s  ratio {ratio:.2f}")
        print(f"iperf3 {link:.2f} GB/s; whole check {check_s:.1f} s ({', '.join(f'{c:.1f}' for c in checks)})")
    print(f"\nmedian ratio {statistics.median(ratios):.2f} (goal >= {GOAL_RATIO}); whole check {check_s:.1f} s (goal < {GOAL_CHECK_S:g} s)")


if __name__ == "__main__":
    main()
