"""How composing and validating a large cluster file grows with its hosts, and how long `preflight check` takes to find
every host unreachable.

For each size: a cluster file of that many hosts (addresses from 198.18.0.1) is written to a temporary folder, then
`load_spec` (Hydra compose, OmegaConf, the schema check, the typed tree) runs in a fresh process with the config cache
off, then again with it on, twice (the first run writes the entry, the second reads it). With --check, `preflight
check` then runs inside a network namespace with no route (`unshare --net`, root only), where every connect fails at
once: every host must come back unknown, exit 3. Wall and CPU seconds per run, and CPU milliseconds per host.
Usage: ``python bench/cluster_file_scale.py [--sizes 1000 4000 12000] [--check] [--smoke] [--markdown]``.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOAD = """
import sys
from preflight.compose import load_spec
spec = load_spec(["cluster=big"], config_dir=sys.argv[1])
print(len(spec.config.cluster.hosts))
"""


def write_cluster(folder: Path, hosts: int) -> None:
    first = ipaddress.ip_address("198.18.0.1")
    lines = ["name: big", "master: h00000", "hosts:"]
    lines += [f"  - {{name: h{i:05d}, address: '{first + i}', user: root}}" for i in range(hosts)]
    (folder / "cluster").mkdir(parents=True, exist_ok=True)
    (folder / "cluster" / "big.yaml").write_text("\n".join(lines) + "\n")


def timed(argv: list[str], env: dict[str, str], allowed: int = 0, timeout: float = 1800) -> tuple[float, float, str]:
    """Wall and CPU seconds (the child's user + system) of one run, and its stdout; another exit stops the bench."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != allowed:
        raise SystemExit(f"{' '.join(argv[:4])}... exited with {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000, 12000], help="hosts per cluster file")
    parser.add_argument("--check", action="store_true", help="also run `preflight check` with no route (needs root)")
    parser.add_argument("--smoke", action="store_true", help="one cluster of 50 hosts, to see that the bench runs")
    parser.add_argument("--markdown", action="store_true", help="a table for docs/benchmarks.md")
    args = parser.parse_args()
    sizes = [50] if args.smoke else args.sizes
    if args.check and (os.geteuid() != 0 or shutil.which("unshare") is None):
        raise SystemExit("--check needs root and unshare (a network namespace of its own)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="cluster-scale-") as scratch:
        for hosts in sizes:
            folder = Path(scratch) / f"conf-{hosts}"
            write_cluster(folder, hosts)
            off = {**os.environ, "PREFLIGHT_CONFIG_CACHE": "off"}
            cached = {**os.environ, "PREFLIGHT_CONFIG_CACHE": str(Path(scratch) / f"cache-{hosts}")}
            load = [sys.executable, "-c", LOAD, str(folder)]
            compose_wall, compose_cpu, out = timed(load, off)
            if out.strip() != str(hosts):
                raise SystemExit(f"{hosts} hosts composed as {out.strip()}")
            timed(load, cached)
            cached_wall, cached_cpu, _ = timed(load, cached)
            row = [f"{hosts:,}", f"{compose_wall:.1f}", f"{compose_cpu:.1f}", f"{1000 * compose_cpu / hosts:.2f}",
                   f"{cached_wall:.1f}", f"{cached_cpu:.1f}"]
            if args.check:
                shutil.which("preflight") or sys.exit("the console script `preflight` is not installed")
                argv = ["unshare", "--net", "--", "preflight", "check", "--json", "--config-dir", str(folder), "cluster=big",
                        f"state_dir={Path(scratch) / f'state-{hosts}'}"]
                check_wall, check_cpu, report = timed(argv, off, allowed=3)
                statuses = {host["status"] for host in json.loads(report)["hosts"]}
                if statuses != {"unknown"}:
                    raise SystemExit(f"{hosts} hosts with no route came back {sorted(statuses)}, not all unknown")
                row += [f"{check_wall:.1f}", f"{check_cpu:.1f}"]
            rows.append(row)
    header = ["hosts", "compose wall s", "compose CPU s", "CPU ms/host", "cached wall s", "cached CPU s"]
    header += ["check (no route) wall s", "check CPU s"] if args.check else []
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join("---:" for _ in header) + "|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
        for row in rows:
            print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
