"""Running launches: the worker staged on every host, then torchrun on a set of hosts with the launch that will be
emitted, each run judged as it ends.

Every run is bounded three times over: the worker's own per-phase watchdog, torchrun's
rendezvous timeouts, and the transport's deadline (``timeout -k`` on the host, then the channel).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path

from preflight import bundle, rail_env
from preflight.collective.judge import RunOutcome, judge
from preflight.collective.wire import WorkerConfigJson
from preflight.errors import last_line
from preflight.gather import host_python
from preflight.interrupt import Activity, hosts_phrase
from preflight.launch import Launch, derive_launch
from preflight.ports import HIGHEST_PICKED_PORT, free_or_another, free_port, port_holder
from preflight.records import HostRecord
from preflight.spec import HIGHEST_PORT, Backend, PreflightConfig, highest_derived_port
from preflight.transport import HostRouter, RemoteCommand, Transport
from preflight.transport.reap import TAG_VARIABLE

RAIL_ENV_PATH = Path(rail_env.__file__).resolve()
# Python and torch start-up of torchrun's agent and of each worker (2 s each on a busy 2-core
# host) comes before any phase deadline starts counting.
STARTUP_ALLOWANCE_S = 60.0
# Writes the files of stdin's JSON object (name -> text: the worker and rail_env.py) in a fresh private folder and prints
# the folder. The folder is named as preflight.transport.reap
# says, so that an interrupt's cleanup finds it even when this command was cut before it could say where it is. First it
# removes this user's folders of earlier runs on this host that no process names and that nothing touched for longer
# than a whole run may last (argv[1], ssh.run_timeout_s): a host lost mid-check (powered off, its cable pulled) keeps
# its folder, as no cleanup could reach it, until the next check stages there.
_STAGE = f"""import json, os, re, shutil, sys, tempfile, time
tag = os.environ.get({TAG_VARIABLE!r}, 'run')
host = re.sub('[^A-Za-z0-9.-]', '', os.uname().nodename)
base = tempfile.gettempdir()
named = set()
for pid in os.listdir('/proc'):
    if pid.isdigit():
        try:
            with open('/proc/' + pid + '/cmdline', 'rb') as f:
                named.update(re.findall(rb'/(preflight-[^/\\x00]+)', f.read()))
        except OSError:
            pass
ours = re.compile('preflight-[A-Za-z0-9]+-' + re.escape(host) + '-[A-Za-z0-9_]+$')
for name in os.listdir(base):
    path = os.path.join(base, name)
    if not ours.match(name) or name.encode() in named:
        continue
    try:
        if os.stat(path).st_uid != os.getuid():
            continue
        touched = max([os.stat(path).st_mtime] + [os.stat(os.path.join(path, e)).st_mtime for e in os.listdir(path)])
    except OSError:
        continue
    if touched < time.time() - float(sys.argv[1]):
        shutil.rmtree(path, ignore_errors=True)
d = tempfile.mkdtemp(prefix='preflight-' + tag + '-' + host + '-')
for name, text in json.loads(sys.stdin.read()).items():
    with open(os.path.join(d, os.path.basename(name)), 'w') as f:
        f.write(text)
print(d)
"""
_UNSTAGE = "import shutil, sys\nshutil.rmtree(sys.argv[1], ignore_errors=True)\n"


def worker_source() -> str:
    """The worker script's text, copied to each host: preflight/collective/host's modules joined (preflight.bundle)."""
    return bundle.text(bundle.WORKER)


@cache
def staged_files() -> str:
    """What the stage writes on each host, as _STAGE reads it: the worker, and the wrapper that binds a rank to its rail
    (the one emit-launch writes), which a rails launch runs the worker through."""
    return json.dumps({"worker.py": worker_source(), "rail_env.py": RAIL_ENV_PATH.read_text(encoding="utf-8")})


def sweep_sizes(config: PreflightConfig, backend: Backend) -> list[int]:
    """Message sizes of the sweep: powers of two between the configured (or per-backend) bounds."""
    low = config.collective.sweep_min_bytes or (1 << 20 if backend == Backend.nccl else 64 << 10)
    high = config.collective.sweep_max_bytes or (1 << 30 if backend == Backend.nccl else 64 << 20)
    sizes, size = [], low
    while size <= high:
        sizes.append(size)
        size *= 2
    return sizes


def sweep_ops(config: PreflightConfig, backend: Backend) -> list[str]:
    """The collectives the sweep measures: the configured ones, or (per backend) all_gather and all_reduce on nccl and
    all_reduce on gloo."""
    if config.collective.sweep_ops is not None:
        return list(config.collective.sweep_ops)
    return ["all_gather", "all_reduce"] if backend == Backend.nccl else ["all_reduce"]


@dataclass(frozen=True)
class SweepPlan:
    """What a launch's sweep measures: the configured sweep (configured_sweep), or a plan of its own (the pairwise
    stage's one size and op), measured as planned."""

    sizes: list[int]
    ops: list[str]
    warmup: int
    iters: int
    time_per_size_s: float | None = None  # adaptive: the timed iterations fill about this long per size; None: iters each
    judges_speed: bool = False  # the launch also runs the compute probe and the neighbour test (the configured sweep's)
    # The pairwise stage's rounds of host pairs, measured each way in the neighbour test's phase (worker.pair_round_phases)
    # for collective.neighbour_time_s a phase; empty: none.
    pair_rounds: list[list[tuple[str, str]]] = field(default_factory=list)


def configured_sweep(config: PreflightConfig, backend: Backend) -> SweepPlan:
    """The sweep the config asks for (collective.sweep_*, warmup, iters)."""
    c = config.collective
    return SweepPlan(sweep_sizes(config, backend), sweep_ops(config, backend), c.warmup, c.iters,
                     c.sweep_time_per_size_s if c.sweep_adaptive else None, judges_speed=True)


def no_sweep(config: PreflightConfig, backend: Backend) -> SweepPlan:
    """The configured sweep without its sizes or the speed checks: a launch that measures nothing of its own (or only the
    pair rounds it is given), in the worker config's one shape."""
    return replace(configured_sweep(config, backend), sizes=[], judges_speed=False)


def neighbour_bytes(config: PreflightConfig, backend: Backend) -> int:
    """Per message of the neighbour test and of the pairwise stage's rounds in a launch."""
    return config.collective.neighbour_bytes or (64 << 20 if backend == Backend.nccl else 1 << 20)


def _deadlines(config: PreflightConfig, backend: Backend, sweep: SweepPlan | None) -> dict[str, float]:
    c = config.collective
    # The compute probe and the neighbour test are bounded by their own budgets; a phase left out takes no time at all.
    # Their deadlines only catch a hang: a rank stuck on a dead link, a GPU that does not answer. A pair round sends a
    # message each way per pair, as two of the ring's phases do, and the ring is about two: each round adds half the
    # ring's allowance, and so does each repeat of the suspects (a slow host's links, what the repeats are there to
    # measure, are not cut short as a hang), the starved ones' included.
    rounds = len(sweep.pair_rounds) if sweep else 0
    repeats = c.speed.of(backend).repeats + c.speed.of(backend).starved_repeats
    return {"init": c.init_timeout_s, "identity": c.identity_timeout_s, "verify": c.verify_timeout_s,
            "compute": c.finish_timeout_s, "neighbours": c.verify_timeout_s * (1 + (rounds + repeats) / 2),
            "sweep": c.sweep_timeout_s if sweep else c.finish_timeout_s, "finish": c.finish_timeout_s}


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
        # Hosts that are ranks of one launch already (preflight agent): each starts its ranks itself, without torchrun.
        self.in_launch = isinstance(transport, HostRouter) and transport.in_launch

    def stage(self) -> None:
        """Copy the worker into a fresh temporary folder on every host."""
        self.activity.now("collective", f"copying the worker to {hosts_phrase(len(self.records))}")
        stale_s = str(self.config.ssh.run_timeout_s)
        commands = [RemoteCommand(host=r.host, argv=[host_python(r.host), "-c", _STAGE, stale_s], stdin=staged_files(),
                                  timeout_s=self.config.ssh.command_timeout_s) for r in self.records.values()]
        for command, result in zip(commands, self.transport.run(commands), strict=True):
            folder = result.stdout.strip()
            if result.ok and folder.startswith("/"):
                self.staged[command.host.name] = folder
            else:
                self.unstaged[command.host.name] = result.reason or last_line(result.stderr) or "could not copy the worker"

    def free_port(self, host: str) -> int | None:
        """A port that is free on host now, or None when none could be found."""
        self.activity.now("collective", f"finding a free port on {host}")
        # Low enough that every port derived from it (spec.highest_derived_port) stays a port.
        highest = min(HIGHEST_PICKED_PORT, HIGHEST_PORT - highest_derived_port(0, len(self.records)))
        return free_port(self.transport, self.records[host].host, self.config.ssh.command_timeout_s, highest)

    def port_holder(self, host: str, port: int) -> str | None:
        """Who already listens on port on host, in words; None when the port is free (or it cannot be told)."""
        self.activity.now("collective", f"checking port {port} on {host}")
        return port_holder(self.transport, self.records[host].host, port, self.config.ssh.command_timeout_s)

    def close(self) -> None:
        """Remove the worker's folder from every host."""
        self.activity.now("collective", f"removing the worker from {hosts_phrase(len(self.staged))}")
        commands = [RemoteCommand(host=self.records[name].host, argv=[host_python(self.records[name].host), "-c", _UNSTAGE, folder],
                                  timeout_s=self.config.ssh.command_timeout_s) for name, folder in self.staged.items()]
        self.transport.run(commands)
        self.staged.clear()

    def _commands(self, launch: Launch, sweep: SweepPlan | None, extra_env: dict[str, str]) -> list[RemoteCommand]:
        deadlines = _deadlines(self.config, launch.backend, sweep)
        plan = sweep or no_sweep(self.config, launch.backend)
        c = self.config.collective
        total = c.rendezvous_timeout_s + sum(deadlines.values()) + STARTUP_ALLOWANCE_S
        commands = []
        for index, host in enumerate(launch.hosts):
            record = self.records[host.name]
            worker_config: WorkerConfigJson = {
                "run_id": launch.rdzv_id, "backend": launch.backend.value, "seed": self.config.collective.seed, "host": host.name,
                "deadlines_s": deadlines, "verify_bytes": self.config.collective.verify_bytes,
                "sweep": {"sizes": plan.sizes, "ops": plan.ops, "warmup": plan.warmup, "iters": plan.iters,
                          "time_per_size_s": plan.time_per_size_s},
                # The configured sweep's launches only (not the pairwise stage's plan of its own): the compute probe and
                # the neighbour test (preflight.collective.speed). The pair rounds take the neighbour test's budget.
                "compute_s": c.compute_time_s if plan.judges_speed else 0.0,
                "neighbour_s": c.neighbour_time_s if plan.judges_speed or plan.pair_rounds else 0.0,
                "neighbour_bytes": neighbour_bytes(self.config, launch.backend),
                "suspect_fraction": c.speed.of(launch.backend).suspect_fraction,
                "repeats": c.speed.of(launch.backend).repeats if plan.judges_speed or plan.pair_rounds else 0,
                "starved_repeats": c.speed.of(launch.backend).starved_repeats if plan.judges_speed or plan.pair_rounds else 0,
                "starved_fraction": c.speed.of(launch.backend).starved_fraction,
                "neighbour_ring": plan.judges_speed,
                "pair_rounds": plan.pair_rounds,
                "rails": launch.rails,
            }
            env = [f"{k}={v}" for k, v in sorted({**host.env, **extra_env}.items())]
            python, folder = host_python(record.host), self.staged[host.name]
            worker = f"{folder}/worker.py"
            # On rails, each rank through the wrapper that binds it to its rail, as the emitted launch runs the script.
            script = [f"{folder}/rail_env.py", worker] if launch.rails else [worker]
            config_json = json.dumps(worker_config, separators=(",", ":"))
            # The worker's supervisor mode runs the host's ranks in a session of its own and cuts a rank stuck past its
            # phase's deadline on this host, so one stuck host does not hold the run until the transport's outer deadline.
            argv = ["env", *env, python, worker, "supervise", str(launch.nproc_per_node), config_json, "--",
                    *self._starter(launch, index, python, folder, script), config_json]
            # One group: a host lost under the launch ends the others', which would wait for it to their deadlines.
            commands.append(RemoteCommand(host=record.host, argv=argv, timeout_s=total, group=launch.rdzv_id))
        return commands

    def _starter(self, launch: Launch, index: int, python: str, folder: str, script: list[str]) -> list[str]:
        """What starts the host's ranks of the launch: torchrun on script (the worker, on rails through rail_env.py), or
        where the hosts are ranks of one launch already, the worker's own starter with what torchrun would have given each
        rank (the store: rank 0's, at the launch's port), given the same script to run each rank with."""
        host = launch.hosts[index]
        if self.in_launch:
            return ["env", f"MASTER_ADDR={launch.master_addr}", f"MASTER_PORT={launch.master_port}", f"GROUP_RANK={index}",
                    f"LOCAL_WORLD_SIZE={launch.nproc_per_node}", f"WORLD_SIZE={launch.nnodes * launch.nproc_per_node}",
                    python, script[-1], "ranks", *script]
        # torchrun's own log folder defaults to a fresh /tmp/torchelastic_* per launch that it never removes; inside the
        # worker's folder it goes when the folder does.
        return [python, "-m", "torch.distributed.run", *host.torchrun_args, "--log-dir", f"{folder}/torchrun", *script]

    def launch_for(self, hosts: Sequence[str], port: int) -> Launch:
        """The launch over these hosts, the first being the master."""
        timeout = self.config.collective.rendezvous_timeout_s
        return derive_launch(self.config, self.backend, [self.records[h] for h in hosts], port, f"preflight-{uuid.uuid4().hex[:12]}",
                             join_timeout_s=timeout, read_timeout_s=timeout)

    def run(self, groups: Sequence[tuple[Sequence[str], int]], *, sweep: SweepPlan | None = None,
            extra_env: dict[str, str] | None = None, derived: bool = False) -> list[RunOutcome]:
        """Run one launch per (hosts, port) group, all at once; one outcome per group. sweep: what the launches measure
        after the verified all_gather (configured_sweep, a plan of its own), or None. derived: the ports are derived from
        the rendezvous port (spec.split_port, ...) and nobody checked them: one taken on a group's first host is replaced
        by one free there."""
        if derived:
            self.activity.now("collective", f"checking {len(groups)} port(s) derived from the rendezvous port")
            ports = free_or_another(self.transport, [(self.records[hosts[0]].host, port) for hosts, port in groups],
                                    self.config.ssh.command_timeout_s)
            groups = [(hosts, port) for (hosts, _), port in zip(groups, ports, strict=True)]
        launches = [self.launch_for(hosts, port) for hosts, port in groups]
        count = sum(launch.nnodes for launch in launches)
        self.activity.now("collective", f"torchrun on {hosts_phrase(count)}" + (f" in {len(groups)} groups" if len(groups) > 1 else ""),
                          sweep=sweep is not None)
        batches = [self._commands(launch, sweep, extra_env or {}) for launch in launches]
        flat = [c for batch in batches for c in batch]
        results = iter(self.transport.run(flat, all_at_once=True))
        outcomes = []
        for launch, batch in zip(launches, batches, strict=True):
            mine = [next(results) for _ in batch]
            outcomes.append(replace(judge(launch, mine), outputs={r.host: r.stdout + r.stderr for r in mine}))
        return outcomes
