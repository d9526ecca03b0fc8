"""The collective stage: torchrun on every host with the launch that will be emitted, a worker
that all_gathers and verifies every byte and sweeps bandwidth; hard deadlines; culprits found by
splitting the hosts.

Every run is bounded three times over: the worker's own per-phase watchdog, torchrun's
rendezvous timeouts, and the transport's deadline (``timeout -k`` on the host, then the channel).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from preflight.errors import Incomplete
from preflight.findings import CLUSTER, Finding, Status
from preflight.gather import host_python
from preflight.interrupt import Activity, hosts_phrase
from preflight.launch import Launch, LaunchError, derive_launch
from preflight.records import HostRecord
from preflight.spec import Backend, PreflightConfig
from preflight.transport import RemoteCommand, Transport
from preflight.transport.base import CommandResult
from preflight.transport.reap import TAG_VARIABLE
from preflight.worker import PHASES, parse_lines

WORKER_PATH = Path(__file__).resolve().parent / "worker.py"
# Python and torch start-up of torchrun's agent and of each worker (2 s each on a busy 2-core
# host) comes before any phase deadline starts counting.
STARTUP_ALLOWANCE_S = 60.0
# Writes stdin to worker.py in a fresh private folder and prints the folder. The folder is named as preflight.transport.reap
# says, so that an interrupt's cleanup finds it even when this command was cut before it could say where it is.
_STAGE = (f"import os, re, sys, tempfile\ntag = os.environ.get({TAG_VARIABLE!r}, 'run')\n"
          "host = re.sub('[^A-Za-z0-9.-]', '', os.uname().nodename)\n"
          "d = tempfile.mkdtemp(prefix=f'preflight-{tag}-{host}-')\n"
          "with open(os.path.join(d, 'worker.py'), 'w') as f:\n    f.write(sys.stdin.read())\nprint(d)\n")
_UNSTAGE = "import shutil, sys\nshutil.rmtree(sys.argv[1], ignore_errors=True)\n"
# A port the kernel calls free on the master, low enough that the splitting's ports above it stay valid.
_FREE_PORT = ("import socket\nfor _ in range(50):\n    s = socket.socket()\n    s.bind(('', 0))\n    port = s.getsockname()[1]\n"
              "    s.close()\n    if port <= 64000:\n        print(port)\n        break\n")
# Prints who already listens on the port argv[1] ("PID COMMAND LINE", or "?" for a process it cannot see), nothing when
# the port is free (or cannot be told: torchrun then says why).
_PORT_HOLDER = r"""
import errno, os, socket, sys
port = int(sys.argv[1])
with socket.socket() as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("", port))
        sys.exit(0)
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            sys.exit(0)
listening = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        with open(table) as f:
            rows = [line.split() for line in f.read().splitlines()[1:]]
    except OSError:
        continue
    listening |= {"socket:[%s]" % r[9] for r in rows if r[3] == "0A" and int(r[1].rsplit(":", 1)[1], 16) == port}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if any(os.readlink("/proc/%s/fd/%s" % (pid, fd)) in listening for fd in os.listdir("/proc/%s/fd" % pid)):
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                print(pid, f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:500])
            sys.exit(0)
    except OSError:
        continue
print("?")
"""
_RDZV_ID = re.compile(r"--rdzv[-_]id[= ](preflight-[0-9a-f]+)")


@cache
def worker_source() -> str:
    """The worker script's text, copied to each host."""
    return WORKER_PATH.read_text(encoding="utf-8")


def sweep_sizes(config: PreflightConfig, backend: Backend) -> list[int]:
    """Message sizes of the sweep: powers of two between the configured (or per-backend) bounds."""
    low = config.collective.sweep_min_bytes or (1 << 20 if backend == Backend.nccl else 64 << 10)
    high = config.collective.sweep_max_bytes or (1 << 30 if backend == Backend.nccl else 64 << 20)
    sizes, size = [], low
    while size <= high:
        sizes.append(size)
        size *= 2
    return sizes


def _deadlines(config: PreflightConfig, sweep: bool) -> dict[str, float]:
    c = config.collective
    return {"init": c.init_timeout_s, "identity": c.identity_timeout_s, "verify": c.verify_timeout_s,
            "sweep": c.sweep_timeout_s if sweep else c.finish_timeout_s, "finish": c.finish_timeout_s}


@dataclass
class RunOutcome:
    """One launch over a set of hosts and what came of it."""

    launch: Launch
    status: str  # pass, fail or hang
    phase: str | None  # where it failed or hung; "rendezvous" when no worker started
    message: str  # one line, naming hosts and phase
    named_hosts: list[str] = field(default_factory=list)  # hosts this run alone points at
    results: list[dict[str, Any]] = field(default_factory=list)  # the ranks' result events
    port_taken: bool = False  # the master's torchrun found its rendezvous port in use


@dataclass
class Isolation:
    """What splitting the hosts found."""

    rounds: int
    culprits: list[str]
    healthy: list[str]
    note: str


class Collective:
    """Runs launches on hosts whose worker has been staged; remove the stage with close()."""

    def __init__(self, config: PreflightConfig, transport: Transport, backend: Backend, records: Sequence[HostRecord],
                 activity: Activity | None = None) -> None:
        self.config = config
        self.transport = transport
        self.backend = backend
        self.records = {r.host.name: r for r in records}
        self.staged: dict[str, str] = {}
        self.unstaged: dict[str, str] = {}  # host -> why the worker could not be copied there
        self.activity = activity or Activity("collective", "")

    def stage(self) -> None:
        """Copy the worker into a fresh temporary folder on every host."""
        self.activity.now("collective", f"copying the worker to {hosts_phrase(len(self.records))}")
        commands = [RemoteCommand(host=r.host, argv=[host_python(r.host), "-c", _STAGE], stdin=worker_source(),
                                  timeout_s=self.config.ssh.command_timeout_s) for r in self.records.values()]
        for command, result in zip(commands, self.transport.run(commands), strict=True):
            folder = result.stdout.strip()
            if result.ok and folder.startswith("/"):
                self.staged[command.host.name] = folder
            else:
                self.unstaged[command.host.name] = result.reason or _last_line(result.stderr) or "could not copy the worker"

    def free_port(self, host: str) -> int | None:
        """A port that is free on host now, or None when none could be found."""
        self.activity.now("collective", f"finding a free port on {host}")
        record = self.records[host]
        (result,) = self.transport.run([RemoteCommand(host=record.host, argv=[host_python(record.host), "-c", _FREE_PORT],
                                                      timeout_s=self.config.ssh.command_timeout_s)])
        text = result.stdout.strip()
        return int(text) if result.ok and text.isdigit() else None

    def port_holder(self, host: str, port: int) -> str | None:
        """Who already listens on port on host, in words; None when the port is free (or it cannot be told)."""
        self.activity.now("collective", f"checking port {port} on {host}")
        record = self.records[host]
        (result,) = self.transport.run([RemoteCommand(host=record.host, argv=[host_python(record.host), "-c", _PORT_HOLDER, str(port)],
                                                      timeout_s=self.config.ssh.command_timeout_s)])
        answer = result.stdout.strip()
        if not result.ok or not answer:
            return None
        pid, _, command = answer.partition(" ")
        launch = _RDZV_ID.search(command)
        if launch and "torch.distributed.run" in command:
            return f"another preflight check (the torchrun of its launch {launch.group(1)}, pid {pid})"
        return f"pid {pid} ({command[:120]})" if command else "a process preflight cannot see (another user's)"

    def close(self) -> None:
        """Remove the worker's folder from every host."""
        self.activity.now("collective", f"removing the worker from {hosts_phrase(len(self.staged))}")
        commands = [RemoteCommand(host=self.records[name].host, argv=[host_python(self.records[name].host), "-c", _UNSTAGE, folder],
                                  timeout_s=self.config.ssh.command_timeout_s) for name, folder in self.staged.items()]
        self.transport.run(commands)
        self.staged.clear()

    def _commands(self, launch: Launch, sweep: bool, extra_env: dict[str, str]) -> list[RemoteCommand]:
        deadlines = _deadlines(self.config, sweep)
        total = self.config.collective.rendezvous_timeout_s + sum(deadlines.values()) + STARTUP_ALLOWANCE_S
        commands = []
        for host in launch.hosts:
            record = self.records[host.name]
            worker_config = {
                "run_id": launch.rdzv_id, "backend": launch.backend.value, "seed": self.config.collective.seed, "host": host.name,
                "deadlines_s": deadlines, "verify_bytes": self.config.collective.verify_bytes,
                "sweep": {"sizes": sweep_sizes(self.config, launch.backend) if sweep else [], "ops": list(self.config.collective.sweep_ops),
                          "warmup": self.config.collective.warmup, "iters": self.config.collective.iters},
            }
            env = [f"{k}={v}" for k, v in sorted({**host.env, **extra_env}.items())]
            python, worker = host_python(record.host), f"{self.staged[host.name]}/worker.py"
            config_json = json.dumps(worker_config, separators=(",", ":"))
            # The worker's supervisor mode runs torchrun in a session of its own and cuts a rank stuck past its phase's
            # deadline on this host, so one stuck host does not hold the run until the transport's outer deadline.
            argv = ["env", *env, python, worker, "supervise", str(launch.nproc_per_node), config_json, "--",
                    python, "-m", "torch.distributed.run", *host.torchrun_args, worker, config_json]
            commands.append(RemoteCommand(host=record.host, argv=argv, timeout_s=total))
        return commands

    def launch_for(self, hosts: Sequence[str], port: int) -> Launch:
        """The launch over these hosts, the first being the master."""
        timeout = self.config.collective.rendezvous_timeout_s
        return derive_launch(self.config, self.backend, [self.records[h] for h in hosts], port, f"preflight-{uuid.uuid4().hex[:12]}",
                             join_timeout_s=timeout, read_timeout_s=timeout)

    def run(self, groups: Sequence[tuple[Sequence[str], int]], *, sweep: bool, extra_env: dict[str, str] | None = None) -> list[RunOutcome]:
        """Run one launch per (hosts, port) group, all at once; one outcome per group."""
        launches = [self.launch_for(hosts, port) for hosts, port in groups]
        count = sum(launch.nnodes for launch in launches)
        self.activity.now("collective", f"torchrun on {hosts_phrase(count)}" + (f" in {len(groups)} groups" if len(groups) > 1 else ""),
                          sweep=sweep)
        batches = [self._commands(launch, sweep, extra_env or {}) for launch in launches]
        flat = [c for batch in batches for c in batch]
        results = iter(self.transport.run(flat, all_at_once=True))
        return [judge(launch, [next(results) for _ in batch]) for launch, batch in zip(launches, batches, strict=True)]


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


_EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception|Timeout)\b.*?: \S")


def _torchrun_reason(stderr: str) -> str:
    """Why torchrun stopped: the first exception of its traceback (the root cause, before the
    exceptions raised while handling it), else its last line."""
    for line in stderr.splitlines():
        if _EXCEPTION_LINE.match(line.strip()):
            return line.strip()[:300]
    return _last_line(stderr)


def _is_timeout(reason: str) -> bool:
    return any(word in reason.lower() for word in ("timed out", "timeout"))


def judge(launch: Launch, results: Sequence[CommandResult]) -> RunOutcome:
    """What one launch's output says: pass, or the phase and hosts of its failure or hang."""
    expected = launch.nnodes * launch.nproc_per_node
    events = {r.host: parse_lines(r.stdout) for r in results}
    finals = [e for evs in events.values() for e in evs if e.get("event") == "result"]
    errors = [e for evs in events.values() for e in evs if e.get("event") == "error"]
    timeouts = [e for evs in events.values() for e in evs if e.get("event") == "timeout"]
    silent = [r.host for r in results if not any(e.get("event") == "phase" for e in events[r.host])]
    where = f"{launch.nnodes} host(s) x {launch.nproc_per_node} rank(s) at {launch.master}:{launch.master_port}"
    if len(finals) == expected and all(r.ok for r in results) and not errors:
        wrong = sum(int(f["verify"]["wrong"]) for f in finals)
        problems = sorted({p for f in finals for p in f.get("problems", [])})
        if wrong or problems:
            named = sorted({f["host"] for f in finals if f["verify"]["wrong"]})
            detail = f"{wrong} wrong element(s) received" if wrong else "; ".join(problems)
            return RunOutcome(launch, "fail", "verify" if wrong else "identity", f"{where}: {detail}", named, finals)
        return RunOutcome(launch, "pass", None, f"{where}: every byte of the all_gather verified", [], finals)
    if not any(events.values()) or len(silent) == len(results):
        # No worker started anywhere: the rendezvous never completed.
        reasons = {r.host: (r.reason if not r.reached else _torchrun_reason(r.stderr)) for r in results}
        hung = any(_is_timeout(why or "") for why in reasons.values())
        first = next((f"{h}: {why}" for h, why in reasons.items() if why), "no output")
        others = [h for h in silent if h != launch.master]
        # When even the master cannot reach its own store, the store's host and port are the suspects.
        master_failed = bool(reasons.get(launch.master)) and all(reasons.values())
        taken = any(word in (reasons.get(launch.master) or "").lower() for word in ("eaddrinuse", "address already in use"))
        return RunOutcome(launch, "hang" if hung else "fail", "rendezvous",
                          f"{where}: the rendezvous never completed ({first})", [launch.master] if master_failed else others,
                          port_taken=taken)
    phase_index = {p: i for i, p in enumerate(PHASES)}
    vanished, seen = _vanished_ranks(events)
    # torchrun stops a rank's siblings when it exits: beside a rank stopped by a peer's failure, a silent end is no cause.
    stopped_by_peer = {str(e.get("host")) for e in errors if isinstance(e.get("after"), dict)}
    vanished = [v for v in vanished if v[0] not in stopped_by_peer]
    if vanished and len(vanished) < seen:
        # Ranks that stopped without a word (killed, crashed) are the root cause; their peers'
        # errors ("connection closed by peer") only follow from them.
        host, rank, phase = min(vanished, key=lambda v: phase_index.get(v[2], 99))
        why = next((_torchrun_reason(r.stderr) or r.reason or "" for r in results if r.host == host), "")
        named = sorted({v[0] for v in vanished})
        return RunOutcome(launch, "fail", phase, f"{where}: rank {rank} on {host} died in {phase} without a word"
                          f"{f' ({why})' if why else ''}; its peers failed after it", named, finals)
    if errors:
        # A rank stopped by a peer's failure carries that failure in "after": the peer is the root cause, even when
        # its own line was lost.
        own = [e for e in errors if not isinstance(e.get("after"), dict)]
        root = min(own, key=lambda e: (phase_index.get(e.get("phase", ""), 99), e.get("t", 0.0))) if own else errors[0]["after"]
        named = sorted({root["host"], *silent})
        return RunOutcome(launch, "fail", str(root.get("phase")),
                          f"{where}: rank {root.get('rank')} on {root['host']} failed in {root.get('phase')}: {root.get('error')}",
                          named, finals)
    reached_phase = {h: max((phase_index.get(e.get("phase", ""), -1) for e in evs if e.get("event") == "phase"), default=-1)
                     for h, evs in events.items()}
    phase = PHASES[min(phase_index.get(t.get("phase", ""), 0) for t in timeouts)] if timeouts else \
        PHASES[max(0, min(reached_phase.values()))]
    # Hosts that stopped reporting before the others (hung earlier, or cut by the transport) are the suspects.
    furthest = max(reached_phase.values())
    stuck = {str(t["host"]) for t in timeouts if t.get("stuck")}  # cut by the host's supervisor: deaf to its own watchdog
    suspects = sorted({h for h, p in reached_phase.items() if p < furthest} | set(silent) | stuck)
    joined = sorted({int(e["rank"]) for evs in events.values() for e in evs if e.get("event") == "phase" and "rank" in e})
    detail = f"ranks {joined} joined; " if joined else ""
    if suspects:
        detail += "stopped reporting first: " + ", ".join(suspects)
    else:
        # Every rank waited in the same collective: no host stands out here; splitting the set names it.
        deadline = next((t.get("deadline_s") for t in timeouts if t.get("phase") == phase), None)
        detail += f"every rank waited out the {phase} deadline" + (f" ({deadline:g} s)" if isinstance(deadline, (int, float)) else "")
    return RunOutcome(launch, "hang", phase, f"{where}: HANG in {phase}: {detail}", suspects, finals)


def _vanished_ranks(events: dict[str, list[dict[str, Any]]]) -> tuple[list[tuple[str, int, str]], int]:
    """(host, rank, last phase) of every rank that started but ended with no result, error or timeout; and how many
    ranks said anything at all."""
    last_phase: dict[tuple[str, int], str] = {}
    ended: set[tuple[str, int]] = set()
    seen: set[tuple[str, int]] = set()
    for evs in events.values():
        for e in evs:
            # A rank that failed before torchrun's RANK was read reports rank null: it cannot be told apart.
            if not isinstance(e.get("rank"), int) or "host" not in e:
                continue
            key = (str(e["host"]), e["rank"])
            seen.add(key)
            if e.get("event") == "phase":
                last_phase[key] = str(e.get("phase"))
            elif e.get("event") in ("result", "error", "timeout"):
                ended.add(key)
    return sorted((host, rank, phase) for (host, rank), phase in last_phase.items() if (host, rank) not in ended), len(seen)


def isolate(collective: Collective, hosts: Sequence[str], port: int, *, sweep: bool) -> Isolation:
    """Split the failing set in halves, run the halves at once on distinct ports, recurse into
    the failing ones, and confirm each single suspect paired with a known-good host."""
    good: list[str] = []
    culprits: list[str] = []
    pending = _halves(list(hosts))
    rounds = 0
    while pending:
        rounds += 1
        groups: list[tuple[list[str], int]] = []
        partners = iter(good)
        for k, group in enumerate(pending):
            members = list(group)
            if len(members) == 1:
                partner = next(partners, None)
                if partner is not None:
                    # A host alone may pass where it fails with others (a blocked port): pair it.
                    members = [partner, members[0]]
            groups.append((members, port + 1 + k))
        outcomes = collective.run(groups, sweep=sweep)
        failing: list[list[str]] = []
        for group, outcome in zip(pending, outcomes, strict=True):
            if outcome.status == "pass":
                good.extend(group)
            elif len(group) == 1:
                culprits.extend(group)
            else:
                failing.append(group)
        pending = [half for group in failing for half in _halves(group)]
    healthy = [h for h in hosts if h not in culprits]
    note = "" if culprits else "every subset passed: the failure needs the whole set (a port or route between hosts)"
    return Isolation(rounds=rounds, culprits=culprits, healthy=healthy, note=note)


def _halves(hosts: list[str]) -> list[list[str]]:
    middle = (len(hosts) + 1) // 2
    return [part for part in (hosts[:middle], hosts[middle:]) if part]


def summarize_sweep(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (op, size): busbw min and mean over ranks, algbw mean, as the report's table."""
    table: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for result in results:
        for row in result.get("sweep", []):
            table.setdefault((row["op"], int(row["bytes"])), []).append(row)
    rows = []
    for (op, size), entries in sorted(table.items()):
        busbw = [float(e["busbw_GBps"]) for e in entries]
        algbw = [float(e["algbw_GBps"]) for e in entries]
        rows.append({"op": op, "bytes": size, "ranks": len(entries), "busbw_min_GBps": round(min(busbw), 3),
                     "busbw_mean_GBps": round(sum(busbw) / len(busbw), 3), "algbw_mean_GBps": round(sum(algbw) / len(algbw), 3)})
    return rows


def bandwidth_findings(config: PreflightConfig, records: Sequence[HostRecord], nproc: int, sweep: list[dict[str, Any]]) -> list[Finding]:
    """Compare the largest messages' busbw with the matching hardware profile; none: report only."""
    gpu_names = {d["name"] for r in records for d in r.facts["gpu"]["devices"]}
    profile = next((p for p in config.collective.profiles
                    if p.gpus_per_host == nproc and gpu_names and all(p.gpu_name in n for n in gpu_names)), None)
    if not sweep:
        return []
    if profile is None:
        best = max(sweep, key=lambda r: (r["bytes"], r["busbw_min_GBps"]))
        return [Finding("PF604", Status.passed, CLUSTER,
                        f"no bandwidth profile for this hardware: report only (largest message {best['bytes']} B: "
                        f"{best['op']} busbw {best['busbw_min_GBps']} GB/s min)")]
    findings = []
    for op, floor in (("all_reduce", profile.all_reduce_busbw_gbps), ("all_gather", profile.all_gather_busbw_gbps)):
        rows = [r for r in sweep if r["op"] == op and r["bytes"] >= profile.min_bytes]
        if not floor or not rows:
            continue
        worst = min(rows, key=lambda r: r["busbw_min_GBps"])
        status = Status.passed if worst["busbw_min_GBps"] >= floor else Status.fail
        findings.append(Finding("PF604", status, CLUSTER,
                                f"{op} busbw {worst['busbw_min_GBps']} GB/s at {worst['bytes']} B (profile {profile.gpu_name} x"
                                f"{profile.gpus_per_host}: >= {floor} GB/s)",
                                "" if status == Status.passed else "check NVLink/NVSwitch health (nvidia-smi nvlink -s), "
                                "NCCL_P2P/NCCL_IB settings and PCIe/NIC topology (nvidia-smi topo -m)"))
    return findings


# Rerun a failed intra-node launch with one NCCL transport off at a time, to say which is broken.
INTRA_NODE_SUSPECTS = (
    ("NCCL_P2P_DISABLE", "GPU peer-to-peer (the 545 driver hang lives here)", "intra-node traffic through host memory: much slower"),
    ("NCCL_SHM_DISABLE", "the shared-memory transport (/dev/shm)", "intra-node traffic through sockets: much slower"),
)


def intra_node_findings(collective: Collective, hosts: Sequence[str], port: int) -> list[Finding]:
    """For each host alone, rerun with P2P off and with SHM off; a run that then passes names the broken transport."""
    findings = []
    for k, host in enumerate(hosts):
        (alone,) = collective.run([([host], port + 3 * k)], sweep=False)
        if alone.status == "pass":
            continue
        for j, (variable, transport, cost) in enumerate(INTRA_NODE_SUSPECTS, start=1):
            (retry,) = collective.run([([host], port + 3 * k + j)], sweep=False, extra_env={variable: "1"})
            if retry.status == "pass":
                findings.append(Finding("PF606", Status.fail, host, f"the intra-node collective fails, and passes with {variable}=1: "
                                        f"{transport} is broken", f"fix the driver/topology; {variable}=1 is a workaround ({cost})",
                                        {variable: "1"}))
                break
        else:
            findings.append(Finding("PF606", Status.fail, host, f"the intra-node collective fails on this host alone: {alone.message}",
                                    "run nccl-tests on this host; check dmesg for Xid errors"))
    return findings


def _repeat(collective: Collective, hosts: Sequence[str], port: int, sweep: bool, repeats: int
            ) -> tuple[RunOutcome, list[dict[str, Any]]]:
    """The full set's launch, `repeats` times in a row until one does not pass: the outcome that counts (the first
    failure, else the slowest pass, whose sweep the bandwidth thresholds then judge) and a line per run."""
    outcomes: list[RunOutcome] = []
    for _ in range(repeats):
        (outcome,) = collective.run([(hosts, port)], sweep=sweep)
        outcomes.append(outcome)
        if outcome.status != "pass":
            break
    runs = [{"status": o.status, "phase": o.phase, "message": o.message, "peak_busbw_GBps": _peak_busbw(o)} for o in outcomes]
    last = outcomes[-1]
    if last.status != "pass":
        counted = last
        if repeats > 1:
            counted = replace(last, message=f"repeat {len(outcomes)} of {repeats}: {last.message}")
    else:
        counted = min(outcomes, key=lambda o: _peak_busbw(o) or 0.0)
        if repeats > 1:
            counted = replace(counted, message=f"{counted.message} ({repeats} runs in a row passed)")
    return counted, runs


def _peak_busbw(outcome: RunOutcome) -> float | None:
    rows = summarize_sweep(outcome.results) if outcome.status == "pass" else []
    return max((row["busbw_min_GBps"] for row in rows), default=None)


def _port_in_use(config: PreflightConfig, master: str, port: int, holder: str) -> Incomplete:
    advice = "wait for it to end, or pass network.master_port=0 to pick a free port" if config.network.master_port else \
        "run the check again, it picks another free port"
    return Incomplete(f"the master's rendezvous port {master}:{port} is in use by {holder}, so the collective cannot start; {advice}")


def run_collective_stage(
    config: PreflightConfig, transport: Transport, backend: Backend, records: Sequence[HostRecord], sweep: bool,
    activity: Activity | None = None,
) -> tuple[list[Finding], dict[str, Any]]:
    """The whole stage: the full set, then isolation when it fails; findings and the report section. Incomplete when
    the master's rendezvous port is taken (by another check on the same cluster, say): no launch can tell anything then."""
    master = config.cluster.master
    ordered = sorted(records, key=lambda r: r.host.name != master)  # the master first: it hosts the store
    usable = [r for r in ordered if r.facts["torch"]["installed"]]
    section: dict[str, Any] = {"backend": backend.value, "status": "skipped", "hosts": [r.host.name for r in usable],
                               "master": None, "port": config.network.master_port, "nproc_per_node": None, "world_size": None,
                               "message": "", "verify": None, "sweep": [], "isolation": None}
    if not usable or usable[0].host.name != master:
        section["message"] = "the master could not be checked or has no torch: no collective"
        return [Finding("PF601", Status.unknown, CLUSTER, section["message"], "fix the master host first")], section
    collective = Collective(config, transport, backend, usable, activity)
    interrupted = False
    try:
        collective.stage()
        findings = [Finding("PF601", Status.unknown, name, f"the worker could not be copied: {why}", "check the host's /tmp and python")
                    for name, why in collective.unstaged.items()]
        hosts = [r.host.name for r in usable if r.host.name in collective.staged]
        if master not in hosts:
            section["message"] = "the worker could not be copied to the master: no collective"
            return findings, section
        port = config.network.master_port or collective.free_port(master)
        if not port:
            section["message"] = f"no free port found on {master} for the rendezvous"
            return [*findings, Finding("PF601", Status.unknown, master, section["message"], "set network.master_port")], section
        section["port"] = port
        # A port someone else holds would only fail the rendezvous after its deadline, and the splitting then blame the set.
        holder = collective.port_holder(master, port) if config.network.master_port else None
        if holder is not None:
            raise _port_in_use(config, master, port, holder)
        try:
            outcome, runs = _repeat(collective, hosts, port, sweep, config.playbook.repeats)
        except LaunchError as e:
            section["message"] = str(e)
            return [*findings, Finding("PF601", Status.fail, e.host, str(e), "give the host an IPv4 address on its interface")], section
        if outcome.port_taken:
            # Taken between the check above and torchrun's start: another check started at the same moment.
            raise _port_in_use(config, master, port, collective.port_holder(master, port) or "another process (free again now)")
        section.update(master=outcome.launch.master, nproc_per_node=outcome.launch.nproc_per_node,
                       world_size=outcome.launch.nnodes * outcome.launch.nproc_per_node, status=outcome.status,
                       message=outcome.message, phase=outcome.phase, repeats=runs)
        if outcome.status == "pass":
            verified = outcome.results[0]["verify"]
            section["verify"] = {"bytes_per_rank": verified["bytes"], "wrong": 0, "ranks": len(outcome.results)}
            section["sweep"] = summarize_sweep(outcome.results)
            findings.append(Finding("PF601", Status.passed, CLUSTER, outcome.message))
            findings += bandwidth_findings(config, usable, outcome.launch.nproc_per_node, section["sweep"])
            return findings, section
        code = "PF602" if outcome.phase in ("verify", "identity") and outcome.status == "fail" else "PF601"
        findings.append(Finding(code, Status.fail, CLUSTER, outcome.message,
                                "see `preflight explain " + code + "`; the hosts named are the first to look at"))
        if backend == Backend.nccl and outcome.launch.nproc_per_node > 1:
            findings += intra_node_findings(collective, hosts, port + 100)
        if config.collective.isolate and len(hosts) > 1:
            found = isolate(collective, hosts, port, sweep=False)
            section["isolation"] = {"rounds": found.rounds, "culprits": found.culprits, "healthy": found.healthy, "note": found.note,
                                    "confirmed": None}
            if found.culprits and master in found.healthy:
                # The healthy hosts together, on the master port, without the culprits: the launch emit-launch may give
                # with launch.exclude_failed, so that what it emits is a set that passed as a whole.
                (confirmed,) = collective.run([(found.healthy, port)], sweep=False)
                section["isolation"]["confirmed"] = {"hosts": found.healthy, "port": port,
                                                     "status": confirmed.status, "message": confirmed.message}
            for culprit in found.culprits:
                findings.append(Finding("PF605", Status.fail, culprit,
                                        f"fails the collective with any other host (found by splitting in {found.rounds} round(s)); "
                                        f"healthy: {', '.join(found.healthy) or 'none'}",
                                        "fix this host, or leave it out of cluster.hosts"))
            if not found.culprits:
                findings.append(Finding("PF605", Status.fail, CLUSTER, found.note, "check the master port and the routes between hosts"))
        return findings, section
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        # An interrupt's cleanup (HostRouter.stop) removes the folders after killing what runs from them, within its own
        # deadline; close() here would wait on the hosts unbounded by it.
        if not interrupted:
            collective.close()

