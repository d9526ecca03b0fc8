"""What checking rail by rail costs: the default check of namespace hosts with two rails each (one rank per rail, every
rail's neighbour test, repeats and judgement) against the default check of the same hosts with one rail
(``cluster.hosts.K.interfaces=[eth1]``: one rank per host, on rail 0), runs alternating in one run so that background
load hits both alike. Goal: <= 1.5x. Also whether one host's rail 1 rate-limited (tbf, 100 Mbit/s both ways) is named on
that rail and nowhere else.

Usage: ``python bench/rails_cost.py [--hosts 4] [--repeat 3] [--markdown] [--prefix pfrails --index 236] [--smoke]``;
``--smoke`` takes the steps at the least cost (2 hosts, once, no warm-up check, no fault): figures that mean nothing.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from check_speed import bench_cluster, check

RAILS = 2


def named(report: dict[str, Any]) -> list[str]:
    """The slow-network findings, each as 'code host: the rail it names'."""
    return sorted({f"{f['code']} {f['host']}: {f['message'].split(':', 1)[0]}" for f in report["findings"]
                   if f["code"] in ("PF620", "PF621") and f["status"] in ("fail", "warn")})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--prefix", default="pfrails", help="the hosts' sandbox prefix (removed first if a killed run left it)")
    parser.add_argument("--index", type=int, default=236, help="the hosts' first subnet: the index-th /24 of 198.18.0.0/15")
    parser.add_argument("--smoke", action="store_true", help="the least cost (2 hosts, once, no fault)")
    args = parser.parse_args()
    if args.smoke:
        args.hosts, args.repeat = 2, 1
    if args.hosts < 2:
        parser.error("--hosts must be at least 2")
    with bench_cluster(args.prefix, args.index, args.hosts, rails=RAILS) as (sandbox, folder):
        one_rail = [f"cluster.hosts.{k}.interfaces=[eth1]" for k in range(args.hosts)]
        if not args.smoke:
            check(folder)  # composes and caches the config; warms the hosts' page cache for torch
        two: list[float] = []
        one: list[float] = []
        statuses: list[str] = []
        for _ in range(args.repeat):
            report, seconds = check(folder)
            two.append(seconds)
            statuses.append(f"{RAILS} rails {report['status']} ({report['collective']['nproc_per_node']} ranks/host)")
            report, seconds = check(folder, *one_rail)
            one.append(seconds)
            statuses.append(f"1 rail {report['status']} ({report['collective']['nproc_per_node']} rank/host)")
        fault = "not run (--smoke)"
        if not args.smoke:
            slow = sandbox.hosts[2].name
            sandbox.rate_limit(slow, rate="100mbit", rail=1)
            try:
                report, _ = check(folder)
            finally:
                sandbox.heal(slow)
            fault = f"{slow} rail 1 at 100 Mbit/s: {report['status']}; named: {'; '.join(named(report)) or 'nothing'}"
        def runs(seconds: list[float]) -> str:
            return f"{statistics.median(seconds):.1f} s ({', '.join(f'{s:.1f}' for s in seconds)})"

        rows = [
            (f"default check, {args.hosts} hosts x {RAILS} rails", runs(two)),
            ("default check, the same hosts with 1 rail", runs(one)),
            (f"{RAILS} rails / 1 rail", f"{statistics.median(two) / statistics.median(one):.2f} (goal <= 1.5)"),
            ("verdicts", ", ".join(sorted(set(statuses)))),
            ("a slow rail", fault),
        ]
        if args.markdown:
            print(f"| figure ({args.hosts} hosts, median of {args.repeat}) | value |\n|---|---|")
        for label, value in rows:
            print(f"| {label} | {value} |" if args.markdown else f"{label}: {value}")


if __name__ == "__main__":
    main()
