"""`preflight check playbook=facts` against `pdsh -R ssh` running the same probe, on 8, 32, 128 and 240 namespace
hosts built on this machine (root needed), in one run: wall time, and the controller's own CPU per host.

Both reach every host over real SSH with the same key and known_hosts, 64 hosts at once, and run the same probe with
the same python: pdsh runs the probe file (it cannot feed stdin to every host), preflight sends it on stdin. Runs
alternate between the two so that background load hits both alike. The controller's CPU is what the process and the
children it waited for used (os.wait4's rusage): pdsh with its `ssh` clients, preflight alone. On a real cluster every
host has its own CPUs, so that is what the controller pays; here the hosts' sshd and probes share this machine's cores.

Every cluster is checked from the moment it is up. A run in which any host did not answer (`unknown` in preflight's
report, no facts line from pdsh) is counted and shown; the first preflight run of each size composes the config
(later ones take it from the cache) and is shown apart.

Usage: ``python bench/ssh_fanout.py [--sizes 8 32 128 240] [--repeat 5] [--markdown] [--prefix bench --index 200]``; each
size's hosts are built when the previous size's are gone, under the same prefix and subnet.
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from preflight import bundle
from preflight.sandbox import Sandbox

TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Measured:
    """One command's wall seconds, the CPU seconds of it and its waited-for children, and its output."""

    wall_s: float
    cpu_s: float
    exit_code: int
    stdout: str
    stderr: str


def run_measured(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Measured:
    """Run argv to its end (killed at TIMEOUT_S) and take its rusage from wait4."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        began = time.perf_counter()
        process = subprocess.Popen(list(argv), stdout=out, stderr=err, env=None if env is None else dict(env))
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - began > TIMEOUT_S:
                process.kill()
            time.sleep(0.002)
        wall = time.perf_counter() - began
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return Measured(wall, usage.ru_utime + usage.ru_stime, process.returncode, out.read().decode(errors="replace"),
                        err.read().decode(errors="replace"))


def pdsh_run(sandbox: Sandbox, probe: Path) -> tuple[Measured, int]:
    """pdsh running the probe (its bundle, at probe) on every host; with the number of hosts that printed no facts."""
    env = {
        **os.environ,
        "PDSH_SSH_ARGS_APPEND": f"-F none -i {sandbox.identity} -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=yes "
                                f"-o UserKnownHostsFile={sandbox.known_hosts} -o GlobalKnownHostsFile=none -o ConnectTimeout=10",
    }
    hosts = ",".join(h.address for h in sandbox.hosts)
    measured = run_measured(["pdsh", "-R", "ssh", "-f", "64", "-l", "root", "-w", hosts, f"{sys.executable} {probe}"], env)
    answered = {line.split(":", 1)[0] for line in measured.stdout.splitlines() if '"probe"' in line}
    return measured, len(sandbox.hosts) - len(answered)


def preflight_run(sandbox: Sandbox, folder: Path) -> tuple[Measured, int]:
    """The whole `preflight check` command; with the number of hosts whose status is not pass."""
    measured = run_measured(["preflight", "check", "--json", "--config-dir", str(folder / "conf"), "cluster=bench", "playbook=facts",
                             f"state_dir={folder / 'state'}"])
    report = json.loads(measured.stdout) if measured.stdout.startswith("{") else {}
    passed = sum(1 for h in report.get("hosts", []) if h["status"] == "pass")
    return measured, len(sandbox.hosts) - passed


@dataclass
class Row:
    """The runs of one cluster size."""

    hosts: int
    pdsh: list[Measured] = field(default_factory=list)
    preflight: list[Measured] = field(default_factory=list)
    first: Measured | None = None  # preflight's first run: the config composed, not cached
    runs_with_missing: dict[str, list[int]] = field(default_factory=lambda: {"pdsh": [], "preflight": []})

    def median(self, tool: str, what: str) -> float:
        runs = self.pdsh if tool == "pdsh" else self.preflight
        return statistics.median(getattr(m, what) for m in runs)


def measure(size: int, prefix: str, index: int, repeat: int) -> Row:
    """Build `size` hosts (sandbox prefix and subnet index as Sandbox.up takes them), check them at once, then time both
    tools alternately."""
    row = Row(size)
    Sandbox.down_prefix(prefix)
    with tempfile.TemporaryDirectory() as tmp, Sandbox.up(size, prefix=prefix, index=index) as sandbox:
        folder = Path(tmp)
        (folder / "probe.py").write_text(bundle.text(bundle.FACTS), encoding="utf-8")
        sandbox.write_cluster_config(folder / "conf" / "cluster" / "bench.yaml", name="bench")
        row.first, missing = preflight_run(sandbox, folder)  # right after bring-up, and the config composed
        row.runs_with_missing["preflight"].append(missing)
        for _ in range(repeat):
            tools = (("pdsh", lambda: pdsh_run(sandbox, folder / "probe.py")), ("preflight", lambda: preflight_run(sandbox, folder)))
            for tool, run in tools:
                measured, missing = run()
                (row.pdsh if tool == "pdsh" else row.preflight).append(measured)
                row.runs_with_missing[tool].append(missing)
    return row


def main() -> None:
    """Build each cluster size, time both tools alternately, print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 32, 128, 240])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown for docs/benchmarks.md")
    parser.add_argument("--prefix", default="bench", help="the hosts' sandbox prefix (removed first if a killed run left it)")
    parser.add_argument("--index", type=int, default=200, help="the hosts' subnet: the index-th /24 of 198.18.0.0/15")
    args = parser.parse_args()
    if shutil.which("pdsh") is None or shutil.which("preflight") is None:
        raise SystemExit("needs pdsh (Debian package pdsh) and preflight on PATH")
    rows = []
    for size in args.sizes:
        row = measure(size, args.prefix, args.index, args.repeat)
        rows.append(row)
        print(f"{size} hosts: pdsh {row.median('pdsh', 'wall_s'):.2f} s, preflight {row.median('preflight', 'wall_s'):.2f} s; "
              f"hosts missing per run: {row.runs_with_missing}", file=sys.stderr, flush=True)
    header = ["hosts", "pdsh wall", "preflight wall", "wall ÷ pdsh", "pdsh CPU/host", "preflight CPU/host", "CPU ÷ pdsh",
              "first run (composes)", "hosts not answered, every run"]
    lines = []
    for row in rows:
        pdsh_wall, pf_wall = row.median("pdsh", "wall_s"), row.median("preflight", "wall_s")
        pdsh_cpu, pf_cpu = row.median("pdsh", "cpu_s") / row.hosts, row.median("preflight", "cpu_s") / row.hosts
        first = f"{row.first.wall_s:.2f} s" if row.first else "-"
        missing = f"pdsh {row.runs_with_missing['pdsh']}, preflight {row.runs_with_missing['preflight']}"
        lines.append([str(row.hosts), f"{pdsh_wall:.2f} s", f"{pf_wall:.2f} s", f"{pf_wall / pdsh_wall:.2f}", f"{pdsh_cpu * 1000:.1f} ms",
                      f"{pf_cpu * 1000:.1f} ms", f"{pf_cpu / pdsh_cpu:.2f}", first, missing])
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for line in lines:
            print("| " + " | ".join(line) + " |")
    else:
        for line in lines:
            print("  ".join(line))


if __name__ == "__main__":
    main()
