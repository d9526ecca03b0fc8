"""What the neighbour test and the compute probe cost the default check, and how fast it names a slow host, on namespace
hosts built on this machine (root needed), each figure beside a baseline measured in the same run, runs alternating so
that background load hits both alike:

1. A healthy cluster: the default check (facts, connectivity, collective with the neighbour test, compute probe and
   adaptive sweep) against a bare ``torchrun`` launch across the same hosts (one rank per host: init_process_group and
   one barrier, as bench/check_speed.py's). Goal: <= 1.5x. Beside it, the same check without the neighbour test and
   compute probe (``collective.neighbour_time_s=0 collective.compute_time_s=0``): their cost.
2. One host rate-limited to 40 Mbit/s both ways (tbf), and one host whose processes get ``--cpu-percent`` of one CPU
   (a cgroup quota from the start of the check): is it named by the default check in its first run (PF620 slow
   network; PF206 CPU quota, read before any launch; PF622 or PF623 slow compute or start), and the check's wall time
   against the healthy check's. Goal: named, <= 1.5x.

The rate-limited host is h3 and the throttled one h2 (on 2 hosts both are h2, one fault at a time).

Usage: ``python bench/speed_relative.py [--hosts 4] [--repeat 2] [--cpu-percent 15] [--markdown] [--prefix pfspeed --index 241]
[--smoke]``; ``--smoke`` takes the steps at the least cost (2 hosts, once, no warm-up check; the healthy check, the check
without the neighbour test and compute probe and the CPU-throttled host are left out, being the rate-limited host's
steps with other arguments): figures that mean nothing.
"""

from __future__ import annotations

import argparse
import math
import statistics
from typing import Any

from check_speed import bare_torchrun, bench_cluster, check

OFF = ["collective.neighbour_time_s=0", "collective.compute_time_s=0"]


def named(report: dict[str, Any], codes: tuple[str, ...]) -> list[str]:
    return sorted({f"{f['code']} {f['host']} ({f['status']})" for f in report["findings"]
                   if f["code"] in codes and f["status"] in ("fail", "warn")})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--cpu-percent", type=float, default=15.0)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--prefix", default="pfspeed", help="the hosts' sandbox prefix (removed first if a killed run left it)")
    parser.add_argument("--index", type=int, default=241, help="the hosts' subnet: the index-th /24 of 198.18.0.0/15")
    parser.add_argument("--smoke", action="store_true", help="the least cost (2 hosts, once, one fault)")
    args = parser.parse_args()
    if args.smoke:
        args.hosts, args.repeat = 2, 1
    if args.hosts < 2:
        parser.error("--hosts must be at least 2: a faulted host and the master")
    with bench_cluster(args.prefix, args.index, args.hosts) as (sandbox, folder):
        slow_net, slow_cpu = sandbox.hosts[min(2, args.hosts - 1)].name, sandbox.hosts[1].name
        if not args.smoke:
            check(folder)  # composes and caches the config; warms the hosts' page cache for torch
        full: list[float] = []
        without: list[float] = []
        bare: list[float] = []
        limited: list[float] = []
        throttled: list[float] = []
        seen: dict[str, list[str]] = {"limited": [], "throttled": [], "healthy": []}
        for _ in range(args.repeat):
            if not args.smoke:
                report, seconds = check(folder)
                full.append(seconds)
                seen["healthy"] += named(report, ("PF206", "PF620", "PF621", "PF622", "PF623"))
                report, seconds = check(folder, *OFF)
                without.append(seconds)
            bare.append(bare_torchrun(sandbox, folder / "bare.py"))
            faults = [("limited", slow_net, lambda h: sandbox.rate_limit(h, rate="40mbit"), limited),
                      ("throttled", slow_cpu, lambda h: sandbox.throttle_cpu(h, args.cpu_percent), throttled)]
            for fault, host, apply, seconds_of in faults[:1] if args.smoke else faults:
                apply(host)
                try:
                    report, seconds = check(folder)
                finally:
                    sandbox.heal(host)
                seconds_of.append(seconds)
                seen[fault] += named(report, ("PF206", "PF620", "PF622", "PF623"))
        def median(values: list[float]) -> float:
            return statistics.median(values) if values else math.nan  # a step --smoke leaves out

        rows = [
            ("healthy: default check (with the neighbour test and compute probe)", f"{median(full):.1f} s"),
            ("healthy: the same check without them (their cost)", f"{median(without):.1f} s"),
            ("healthy: bare torchrun launch (init_process_group + one barrier)", f"{median(bare):.1f} s"),
            ("default check / bare torchrun launch", f"{median(full) / median(bare):.2f} (goal <= 1.5)"),
            (f"{slow_net} at 40 Mbit/s: default check", f"{median(limited):.1f} s = {median(limited) / median(full):.2f}x the "
             f"healthy check (goal <= 1.5); named: {', '.join(sorted(set(seen['limited']))) or 'nothing'}"),
            (f"{slow_cpu} at {args.cpu_percent:g}% of one CPU: default check", f"{median(throttled):.1f} s = "
             f"{median(throttled) / median(full):.2f}x the healthy check (goal <= 1.5); named: "
             f"{', '.join(sorted(set(seen['throttled']))) or 'nothing'}"),
            ("healthy: named (a warning or a failure)", ", ".join(sorted(set(seen["healthy"]))) or "nothing"),
        ]
        if args.markdown:
            print(f"| figure ({args.hosts} hosts, median of {args.repeat}) | value |\n|---|---|")
        for label, value in rows:
            print(f"| {label} | {value} |" if args.markdown else f"{label}: {value}")


if __name__ == "__main__":
    main()
