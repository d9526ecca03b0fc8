"""What rails cost the connectivity test (#38): on one set of namespace hosts with 2 rails each (root needed), the
connectivity playbook (facts, then the mesh test) with the hosts' rails declared (2 rails: rail r of every host to its
peers' rail r), with 1 rail (``interfaces: [eth1]``), and with none (the one-interface mesh of a cluster without rails),
runs alternating so that background load hits each alike. Figures: the connectivity stage's own seconds (its section's
``elapsed_s``) and the whole check's wall seconds, medians. Goal: 2 rails at most 1.5x 1 rail.

Usage: ``python bench/rail_connectivity.py [--hosts 4] [--repeat 5] [--markdown] [--prefix pfrail --index 236] [--smoke]``;
``--smoke`` runs each once on 3 hosts: figures that mean nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from preflight.sandbox import Sandbox
from preflight.sandbox.layout import rail_ifname

PORT = 29500


def check(folder: Path, hosts: int, rails: int | None) -> tuple[dict[str, Any], float]:
    """One connectivity check with rails rails declared on every host (None: none, the one-interface mesh)."""
    names = ",".join(rail_ifname(r) for r in range(rails or 0))
    declared = [f"cluster.hosts.{i}.interfaces=[{names}]" for i in range(hosts)]
    began = time.perf_counter()
    done = subprocess.run(["preflight", "check", "--json", "--config-dir", str(folder / "conf"), "cluster=bench", "playbook=connectivity",
                           f"state_dir={folder / 'state'}", f"network.master_port={PORT}", *declared],
                          capture_output=True, text=True, timeout=300, check=False)
    elapsed = time.perf_counter() - began
    if not done.stdout:
        raise SystemExit(f"preflight check did not run: {done.stderr[-800:]}")
    report: dict[str, Any] = json.loads(done.stdout)  # the report, as JSON
    if report["status"] != "pass":
        raise SystemExit(f"the healthy check did not pass ({rails} rails): {[f for f in report['findings'] if f['status'] != 'pass'][:3]}")
    if len(report["connectivity"].get("rails", [])) != (rails or 0):
        raise SystemExit(f"the check tested {len(report['connectivity'].get('rails', []))} rails, not {rails or 0}")
    return report, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--prefix", default="pfrail", help="the hosts' sandbox prefix (removed first if a killed run left it)")
    parser.add_argument("--index", type=int, default=236, help="the hosts' first subnet: the index-th /24 of 198.18.0.0/15 (4 in all)")
    parser.add_argument("--smoke", action="store_true", help="each once, on 3 hosts")
    args = parser.parse_args()
    if args.smoke:
        args.hosts, args.repeat = 3, 1
    Sandbox.down_prefix(args.prefix)
    sandbox = Sandbox.up(args.hosts, prefix=args.prefix, index=args.index, rails=2)
    folder = Path(tempfile.mkdtemp(prefix="preflight-bench-"))
    variants: dict[int | None, tuple[list[float], list[float]]] = {None: ([], []), 1: ([], []), 2: ([], [])}
    try:
        sandbox.write_cluster_config(folder / "conf" / "cluster" / "bench.yaml", name="bench")
        if not args.smoke:
            check(folder, args.hosts, 2)  # composes and caches the config
        for _ in range(args.repeat):
            for rails, (stage, whole) in variants.items():
                report, seconds = check(folder, args.hosts, rails)
                stage.append(report["connectivity"]["elapsed_s"])
                whole.append(seconds)
    finally:
        sandbox.down()
        subprocess.run(["rm", "-rf", str(folder)], check=False)
    median = statistics.median
    names = {None: "no rails (one interface per host)", 1: "1 rail (eth1)", 2: "2 rails (eth1, eth2)"}
    ratio = median(variants[2][0]) / median(variants[1][0])
    if args.markdown:
        print(f"| connectivity playbook, {args.hosts} hosts (median of {args.repeat}) | stage s | check wall s |\n|---|---|---|")
        for rails, (stage, whole) in variants.items():
            print(f"| {names[rails]} | {median(stage):.2f} | {median(whole):.1f} |")
        print(f"| stage, 2 rails / 1 rail | {ratio:.2f} (goal <= 1.5) | |")
    else:
        for rails, (stage, whole) in variants.items():
            print(f"{names[rails]}: stage {median(stage):.2f} s, check {median(whole):.1f} s (stage runs {stage})")
        print(f"stage 2 rails / 1 rail: {ratio:.2f}")


if __name__ == "__main__":
    main()
