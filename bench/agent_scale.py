"""Agent mode at scale: the default playbook (facts and clock, connectivity, the collective, storage) run by `preflight
agent` on every namespace host under torchrun, beside `preflight check` over SSH on the same hosts, at 16, 32 and 64
hosts in one run (root needed). Goal: agent mode no slower than check at 64 hosts.

For each mode: wall time (check: the command; agent mode: from the first host's launch to the last host's exit, torchrun's
rendezvous and every torch import included), the controller's CPU (check: the `preflight check` process and its children
on this side, its SSH clients; agent mode: rank 0's agent, measured by /usr/bin/time around it), and the CPU of every
process the hosts ran (a cpuacct cgroup holding every host's sshd, so everything started on a host through SSH, the
check's torchrun and probes as the agents), and the most private memory (Pss_Anon) the hosts' processes held at once,
sampled every MEMORY_EVERY_S. The SSH sessions that start the agents stand in for srun; their clients on this side are
counted nowhere.

Both modes get the overrides a 32-host check needs on this 2-core machine (docs/benchmarks.md, "The band at 32 hosts"),
each a deadline of the machine's, not a rule of the judge: ``collective.rendezvous_timeout_s`` 4 s a host (and torchrun's
``join_timeout`` as much, for the agents' own launch), ``collective.verify_bytes`` 64 KiB, the sweep to 1 MiB, and every
link at ``--fabric-mbit`` (480) shared out over the hosts (tbf), so that the links, not the two cores, carry the ring.
Every run has a deadline, and the whole bench one (``--budget-min``): a run that would start past it is reported as not
run, one that outlives its deadline as such, and the bench goes on to its table. A run is stopped, its processes on the
hosts killed, when the machine's available memory falls under ``--min-available-mb``: 64 hosts' agents ran this 24 GB
VM out of memory (docs/benchmarks.md).

Usage: ``python bench/agent_scale.py [--sizes 16,32,64] [--budget-min 38] [--markdown] [--prefix pfagent --index 200]
[--keep DIR] [--min-available-mb 1500] [--smoke]``; ``--smoke`` takes every step at the least cost (2 hosts): figures that mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shlex
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from check_speed import PORT, bench_cluster

from preflight.sandbox import Sandbox, cgroups

ROOT = Path(__file__).resolve().parent.parent
AGENT_PORT = 29641
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
# What an interrupted check takes to end what it started on the hosts before it is killed.
STOP_GRACE_S = 30.0
GUARD_EVERY_S = 2.0
# How often the guard also adds up the hosts' private memory: reading every process's smaps_rollup costs the shared cores
# a little (about 0.5 ms a torch process), so less often than the guard's own check.
MEMORY_EVERY_S = 6.0


@dataclass
class Run:
    """One mode's run on one size: what it reported and what it cost."""

    status: str  # the report's status, or why there is none
    named: str  # the failed hosts, or ""
    wall_s: float | None
    controller_cpu_s: float | None
    hosts_cpu_s: float | None
    inside_s: float | None = None  # the report's own elapsed_s: from the command's start (rank 0's) to its report
    hosts_peak_mb: int | None = None  # the most private memory (Pss_Anon) the hosts' processes held at once, as sampled


@dataclass
class Guard:
    """What memory_guard saw of a run: whether it stopped it, and the most the hosts' processes held."""

    tripped: threading.Event
    peak_mb: int = 0


@contextmanager
def host_cpu(sandbox: Sandbox, prefix: str) -> Iterator[Path | None]:
    """A cpuacct cgroup holding every host's sshd (and whatever else lives in its namespace), so that what SSH starts
    there from now on is counted in it; None where this machine has no cgroup v1 cpuacct to make one in."""
    if not (CPUACCT / "cpuacct.usage").is_file():
        yield None
        return
    path = CPUACCT / f"preflight-bench-{prefix}"
    path.mkdir(exist_ok=True)
    try:
        for host in sandbox.hosts:
            cgroups.move(path, sandbox.pids(host.name))
        yield path
    finally:
        cgroups.release(path)


def available_mb() -> int:
    for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    raise SystemExit("/proc/meminfo has no MemAvailable")


def private_mb(pid: int) -> int:
    """Process pid's private memory (Pss_Anon, MB); 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text(encoding="utf-8").splitlines():
            if line.startswith("Pss_Anon:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0


@contextmanager
def memory_guard(sandbox: Sandbox, floor_mb: int) -> Iterator[Guard]:
    """While a run goes on, every GUARD_EVERY_S: if this machine's available memory is under floor_mb, every process on
    the hosts but those they had before the run is killed, which ends the run before the kernel's OOM killer picks a
    victim among everyone's processes (the guard's event says it happened); every MEMORY_EVERY_S, the private memory of
    those processes is added up, and the guard keeps the most."""
    idle = {pid for host in sandbox.hosts for pid in sandbox.pids(host.name)}
    guard, stop = Guard(threading.Event()), threading.Event()
    tripped = guard.tripped

    def watch() -> None:
        sampled = 0.0
        while not stop.wait(GUARD_EVERY_S):
            if time.monotonic() - sampled >= MEMORY_EVERY_S:
                sampled = time.monotonic()
                held = sum(private_mb(pid) for host in sandbox.hosts for pid in set(sandbox.pids(host.name)) - idle)
                guard.peak_mb = max(guard.peak_mb, held)
            if available_mb() >= floor_mb:
                continue
            tripped.set()
            for host in sandbox.hosts:
                for pid in set(sandbox.pids(host.name)) - idle:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)

    thread = threading.Thread(target=watch, name="memory-guard", daemon=True)
    thread.start()
    try:
        yield guard
    finally:
        stop.set()
        thread.join(timeout=10)


def usage_s(group: Path | None) -> float | None:
    return None if group is None else int((group / "cpuacct.usage").read_text(encoding="utf-8")) / 1e9


def children_cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def failed(report: dict[str, Any]) -> str:
    return ", ".join(h["name"] for h in report["hosts"] if h["status"] == "fail")


def overrides(folder: Path, hosts: int, state: str) -> list[str]:
    return ["cluster=bench", f"state_dir={folder / state}", f"network.master_port={PORT}",
            "collective.sweep_max_bytes=1048576", "collective.verify_bytes=65536",
            f"collective.rendezvous_timeout_s={max(30, 4 * hosts)}"]


def by_check(folder: Path, hosts: int, group: Path | None, deadline_s: float) -> Run:
    before, on_hosts, began = children_cpu_s(), usage_s(group), time.monotonic()
    process = subprocess.Popen(["preflight", "check", "--json", "--config-dir", str(folder / "conf"), *overrides(folder, hosts, "check")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        # Interrupted as a user interrupts it, so that it ends what it started on the hosts before the agents run there.
        process.send_signal(signal.SIGINT)
        try:
            process.communicate(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
        return Run(f"did not finish within {deadline_s:.0f} s (interrupted)", "", None, children_cpu_s() - before,
                   spent(group, on_hosts))
    wall = time.monotonic() - began
    hosts_cpu = spent(group, on_hosts)
    if not out:
        return Run(f"no report (exit {process.returncode}): {err.strip().splitlines()[-1:]}", "", wall, None, hosts_cpu)
    report = json.loads(out)
    return Run(report["status"], failed(report), wall, children_cpu_s() - before, hosts_cpu, report["elapsed_s"])


def spent(group: Path | None, before: float | None) -> float | None:
    """The hosts' CPU seconds since before (usage_s's reading)."""
    now = usage_s(group)
    return None if now is None or before is None else now - before


def by_agents(sandbox: Sandbox, folder: Path, group: Path | None, deadline_s: float) -> Run:
    """`preflight agent` on every host under torchrun, started over SSH as srun would start it; rank 0 is the agent that
    printed the report."""
    hosts = len(sandbox.hosts)
    master = sandbox.hosts[0]
    torchrun = str(Path(master.python).parent / "torchrun")
    run_id = f"scale-{uuid.uuid4().hex[:8]}"
    timer = shutil_which_time()
    preflight = shutil.which("preflight") or "preflight"
    commands = {}
    for host in sandbox.hosts:
        argv = [torchrun, f"--nnodes={hosts}", "--nproc-per-node=1", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={master.address}:{AGENT_PORT}", f"--rdzv-id={run_id}", f"--local-addr={host.address}",
                f"--rdzv-conf=is_host={int(host is master)},join_timeout={max(60, 4 * hosts)}", "--max-restarts=0",
                "--no-python", timer, "-o", str(folder / f"cpu-{host.name}.txt"), "-f", "%U %S",
                preflight, "agent", "--json", "--config-dir", str(folder / "conf"), *overrides(folder, hosts, "agents")]
        # This repository's preflight on every host (an SSH session starts with a fresh environment).
        commands[host.name] = f"cd {shlex.quote(str(folder))} && PYTHONPATH={shlex.quote(str(ROOT))} {shlex.join(argv)}"
    on_hosts, began = usage_s(group), time.monotonic()
    started = {name: subprocess.Popen(sandbox.ssh_argv(name, command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for name, command in commands.items()}
    printed: dict[str, str] = {}
    errors: dict[str, str] = {}
    try:
        for name, process in started.items():
            out, err = process.communicate(timeout=max(1.0, began + deadline_s - time.monotonic()))
            if out.strip():
                printed[name] = out
            if process.returncode not in (0, 1):
                errors[name] = err.strip().splitlines()[-1:][0] if err.strip() else f"exit {process.returncode}"
    except subprocess.TimeoutExpired:
        return Run(f"did not finish within {deadline_s:.0f} s", "", None, None, spent(group, on_hosts))
    finally:
        for process in started.values():
            if process.poll() is None:
                process.kill()
                process.communicate()
    wall = time.monotonic() - began
    hosts_cpu = spent(group, on_hosts)
    if len(printed) != 1:
        return Run(f"{len(printed)} reports printed; {errors or 'no error'}", "", wall, None, hosts_cpu)
    ((lead, out),) = printed.items()
    report = json.loads(out)
    user, system = (float(x) for x in (folder / f"cpu-{lead}.txt").read_text(encoding="utf-8").split()[-2:])
    return Run(report["status"], failed(report), wall, user + system, hosts_cpu, report["elapsed_s"])


def shutil_which_time() -> str:
    timer = "/usr/bin/time"
    if not os.access(timer, os.X_OK):
        raise SystemExit(f"{timer} is needed to measure rank 0's agent (apt-get install time)")
    return timer


def cell(value: float | None, unit: str = "s") -> str:
    return "-" if value is None else f"{value:.1f} {unit}"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="16,32,64", help="the cluster sizes, in hosts, comma-separated")
    parser.add_argument("--fabric-mbit", type=int, default=480, help="what all the ring's links carry at once, Mbit/s")
    parser.add_argument("--budget-min", type=float, default=38.0, help="the whole bench's deadline, minutes")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    parser.add_argument("--prefix", default="pfagent", help="the hosts' sandbox prefix (removed first if a killed run left it)")
    parser.add_argument("--index", type=int, default=204, help="the hosts' subnet: the index-th /24 of 198.18.0.0/15")
    parser.add_argument("--min-available-mb", type=int, default=1500,
                        help="a run is stopped (its processes on the hosts killed) when the machine's available memory falls under this")
    parser.add_argument("--keep", type=Path, default=None, help="a folder to keep each run's report in, as HOSTS-MODE.json")
    parser.add_argument("--smoke", action="store_true", help="every step at the least cost (2 hosts)")
    args = parser.parse_args()
    try:
        sizes = [int(s) for s in ("2" if args.smoke else args.sizes).split(",")]
    except ValueError:
        parser.error(f"--sizes: {args.sizes!r} is not a list of host counts")
    if any(s < 2 or s > 250 for s in sizes):
        parser.error("--sizes: each size is 2 to 250 hosts (one /24)")
    end = time.monotonic() + args.budget_min * 60
    rows: list[tuple[int, str, Run]] = []
    for hosts in sizes:
        # A run's own deadline: 10 s a host and a minute, at most what is left of the budget (the sandbox's build and
        # teardown take their share of it too).
        if end - time.monotonic() < 60:
            rows += [(hosts, mode, Run("not run: the bench's budget was spent", "", None, None, None)) for mode in ("check", "agent")]
            continue
        with bench_cluster(args.prefix, args.index, hosts) as (sandbox, folder), host_cpu(sandbox, args.prefix) as group:
            for host in sandbox.hosts:
                sandbox.rate_limit(host.name, rate=f"{max(1, args.fabric_mbit // hosts)}mbit", burst="256kbit")
            for mode in ("check", "agent"):
                deadline = min(60.0 + 10 * hosts, end - time.monotonic() - 30)
                if deadline < 30:
                    rows.append((hosts, mode, Run("not run: the bench's budget was spent", "", None, None, None)))
                    continue
                began = time.monotonic()
                with memory_guard(sandbox, args.min_available_mb) as guard:
                    run = by_check(folder, hosts, group, deadline) if mode == "check" else by_agents(sandbox, folder, group, deadline)
                if guard.tripped.is_set():
                    run = Run(f"stopped after {time.monotonic() - began:.0f} s: available memory under {args.min_available_mb} MB",
                              "", None, run.controller_cpu_s, run.hosts_cpu_s)
                run.hosts_peak_mb = guard.peak_mb
                rows.append((hosts, mode, run))
                saved = folder / ("check" if mode == "check" else "agents") / "report.json"
                if args.keep is not None and saved.is_file():
                    args.keep.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(saved, args.keep / f"{hosts}-{mode}.json")
                print(f"# {hosts} hosts, {mode}: {run}", flush=True)
    header = ("hosts", "mode", "wall", "report's elapsed_s", "controller CPU", "all hosts' CPU", "hosts' peak memory", "status",
              "failed hosts")
    if args.markdown:
        print(f"| {' | '.join(header)} |\n|{'---|' * len(header)}")
    for hosts, mode, run in rows:
        row = (str(hosts), mode, cell(run.wall_s), cell(run.inside_s), cell(run.controller_cpu_s), cell(run.hosts_cpu_s),
               "-" if not run.hosts_peak_mb else f"{run.hosts_peak_mb} MB", run.status, run.named or "none")
        print(f"| {' | '.join(row)} |" if args.markdown else ", ".join(row))


if __name__ == "__main__":
    main()
