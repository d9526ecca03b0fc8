"""``preflight agent``: the whole check without SSH, started on every host by torchrun or srun.

Each agent probes its own host and puts the probe's raw result in the agents' store: their channel
(preflight.transport.agent_channel), which rank 0 serves in the standard library, so that an agent never imports
torch; rank 0 reads every host's result through the same code as the SSH mode (``read_facts``). Then rank 0
runs the playbook's stages exactly as ``check`` does (pipeline.run_stages), through an AgentRouter
(preflight.transport.agents): every command a stage sends a host, the agent on that host runs and answers
through the store. The mesh test runs between the agents' hosts, the storage probe on each, and the
collective's ranks start on the agents' hosts with no launcher of their own: the agents are one launch
already. The same judges then write the same report.

The store's clock exchange gives rank 0 the same kind of bounds on each host's clock offset as an SSH
round trip does: rank 0 notes its time, publishes a ping, every agent answers with its own time, and
rank 0 notes its time once all answers are in.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import signal
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from preflight.errors import Incomplete, InputError, one_line
from preflight.transport.agent_channel import ChannelClient, ChannelError, connect, serve_channel

if TYPE_CHECKING:
    from preflight.compose import Spec
    from preflight.findings import Finding
    from preflight.records import HostRecord
    from preflight.report_shape import Report, StageSections
    from preflight.spec import HostSpec
    from preflight.transport.agents import StoreClient

class AgentMessage(TypedDict, total=False):
    """What each agent puts in the store for rank 0: its host and its probe's result, or why it has no host."""

    host: str | None
    result: str  # the probe's CommandResult as JSON
    problem: str  # why this agent's host is not in the config


KEY_PREFIX = "preflight/agent"
FINISH_TIMEOUT_S = 10.0  # rank 0 waits this long for the others to read the verdict before it leaves
# Beyond the probe's deadline, what an agent may take to start after its launcher's rendezvous before rank 0 hears from
# it: python and the config's compose on a busy host (one held to half a CPU took seconds more than its peers on a
# 2-core VM). An agent that never started costs this much on top, once.
START_ALLOWANCE_S = 30.0


# How many ports after MASTER_PORT rank 0 may serve the channel on where torchrun's own store holds MASTER_PORT: the first
# one free on its host, which the others find by trying each in turn.
CHANNEL_PORTS = 8


@dataclass(frozen=True)
class Place:
    """Where this agent runs: its rank among all agents, and where rank 0 serves their channel."""

    rank: int
    world_size: int
    master_addr: str  # rank 0's host: torchrun puts its group rank 0's there, and a job script its first node
    channel_ports: tuple[int, ...]  # rank 0 serves the channel on the first of these that is free on its host
    run_id: str


def channel_ports(master_port: int, launcher_holds_it: bool) -> tuple[int, ...]:
    """MASTER_PORT itself, where the launcher left it free for its workers (srun, a job script, torchrun without a shared
    store); else the CHANNEL_PORTS after it (those past the last port below it instead)."""
    if not launcher_holds_it:
        return (master_port,)
    after = [p for p in range(master_port + 1, master_port + 1 + CHANNEL_PORTS) if p < 65536]
    return (*after, *range(master_port - 1, master_port - 1 - (CHANNEL_PORTS - len(after)), -1))


def _env(*names: str) -> str | None:
    return next((os.environ[n] for n in names if os.environ.get(n)), None)


def place_from_env() -> Place:
    """torchrun's RANK/WORLD_SIZE, else srun's SLURM_PROCID/SLURM_NTASKS; MASTER_ADDR/MASTER_PORT name the store."""
    rank, world = _env("RANK", "SLURM_PROCID"), _env("WORLD_SIZE", "SLURM_NTASKS")
    addr, port = _env("MASTER_ADDR"), _env("MASTER_PORT")
    if rank is None or world is None or addr is None or port is None:
        raise InputError("preflight agent runs under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or srun "
                         "(SLURM_PROCID, SLURM_NTASKS, and MASTER_ADDR/MASTER_PORT exported by the job script)")
    if not (rank.isdigit() and world.isdigit() and port.isdigit() and int(rank) < int(world) and 0 < int(port) < 65536):
        raise InputError(f"preflight agent: rank {rank!r}, world size {world!r} and port {port!r} are not a valid launch")
    # torchrun's agent serves its own store at MASTER_PORT for its workers when it says so (torch 2.4 on, by default).
    held = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return Place(rank=int(rank), world_size=int(world), master_addr=addr, channel_ports=channel_ports(int(port), held),
                 run_id=_env("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID") or "run")


# What torchrun's agent adds to every worker's environment (torch.distributed.elastic's LocalElasticAgent): it
# describes this launch, not the host, and a probe over SSH never sees it. TORCH_NCCL_ASYNC_ERROR_HANDLING is among
# them because torchrun sets it to 1 when the host has not set it (a host's own value is indistinguishable here).
TORCHRUN_WORKER_ENV = ("RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
                       "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
                       "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
                       "TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING")


# What srun or a job script adds for the agents' own launch; with torchrun's, what no command of the check may see.
LAUNCH_ENV = (*TORCHRUN_WORKER_ENV, "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "NODE_RANK")


def host_environment() -> dict[str, str]:
    """The environment the host gives a job, as far as this agent can tell: ours without what torchrun added."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return dict(os.environ)
    return {k: v for k, v in os.environ.items() if k not in TORCHRUN_WORKER_ENV}


def _accept(spec: Spec, place: Place) -> None:
    """What an agent refuses before it joins the others: on rank 0, which saves the report at the very end, a state
    folder that cannot take it."""
    from preflight.paths import writable_folder

    if place.rank == 0:
        writable_folder(spec.config.state_dir, "state_dir")


# torchrun's error file for a worker, in the log folder it made itself when given no --log-dir:
# <tmp>/torchelastic_<random>/<run id>_<random>/attempt_<restart>/<local rank>/error.json (torch elastic's
# DefaultLogsSpecs, LocalElasticAgent's own mkdtemp before 2.3: the same layout in 1.9.0, 1.13.1 and 2.13.0).
_TORCHRUN_ERROR_FILE = re.compile(r"(?P<root>torchelastic_[^/]+)/(?P<run>[^/]+)/attempt_\d+/\d+/error\.json")


def torchrun_log_folder(environ: Mapping[str, str], temp_dir: str) -> Path | None:
    """The log folder torchrun made for this launch in the temporary folder, where it chose the folder itself: never
    one its user named with --log-dir, which is theirs to keep."""
    error_file, run_id = environ.get("TORCHELASTIC_ERROR_FILE", ""), environ.get("TORCHELASTIC_RUN_ID", "")
    prefix = f"{temp_dir.rstrip('/')}/"
    found = _TORCHRUN_ERROR_FILE.fullmatch(error_file[len(prefix):]) if error_file.startswith(prefix) else None
    return Path(prefix, found["root"]) if found and run_id and found["run"].startswith(f"{run_id}_") else None


def remove_empty_folders(root: Path) -> None:
    """root and every folder under it that holds nothing else: a file anywhere (a log torchrun was told to keep with
    --tee or --redirects, an error file) keeps it and the folders above it."""
    for folder, _, _ in os.walk(root, topdown=False):  # the deepest first
        with contextlib.suppress(OSError):
            os.rmdir(folder)


def run_agent(overrides: Sequence[str], config_dir: str | None, deliver: Callable[[Spec, Report], None],
              host_name: str | None = None) -> int:
    """Probe this host and hand the result to rank 0, run the commands rank 0's stages send this host, and stay until
    rank 0 has delivered the whole report (saved and printed it); the exit code: the report's on rank 0, 0 on the
    others, whose part is done.

    Under torchrun without --log-dir, the empty log folder torchrun made for this agent in the temporary folder goes
    when the agent does: a gate run before every job would otherwise leave one on every host each time."""
    try:
        return _run_agent(overrides, config_dir, deliver, host_name)
    finally:
        folder = torchrun_log_folder(os.environ, tempfile.gettempdir())
        if folder is not None:
            remove_empty_folders(folder)


def _run_agent(overrides: Sequence[str], config_dir: str | None, deliver: Callable[[Spec, Report], None],
               host_name: str | None) -> int:
    from preflight.gather import probe_timeout_s, run_ssh_config
    from preflight.this_machine import compose_while_probing, probe_as_host
    from preflight.transport.agents import result_json

    place = place_from_env()
    started_at = dt.datetime.now(dt.timezone.utc)
    began = time.monotonic()
    environment = host_environment()
    spec, result = compose_while_probing(list(overrides), config_dir, environment, lambda composed: _accept(composed, place))
    deadline_s = probe_timeout_s(spec.config)
    host: HostSpec | None = None
    try:
        host, result = probe_as_host(spec, result, host_name, environment)
        mine: AgentMessage = {"host": host.name, "result": result_json(result)}
    except InputError as e:
        # This agent's host is not in the config: rank 0 still hears why, and the run says so.
        mine = {"host": None, "problem": str(e)}

    # Rank 0 serves the channel; each agent (rank 0 too) is a client of it. Every call of the main client is bounded,
    # and each wait below has its own bound.
    addr, ports, server = place.master_addr, place.channel_ports, None
    if place.rank == 0:
        try:
            server = serve_channel(place.channel_ports, place.run_id)
        except OSError as e:
            raise Incomplete(f"agent rank 0: cannot serve the agents' channel on port {', '.join(map(str, ports))}: "
                             f"{one_line(e.strerror or e, 300)}") from None
        # Its own server through loopback, which it listens on whatever the others know its host by.
        addr, ports = "127.0.0.1", (server.port,)
    try:
        # The others may be up before rank 0 serves: they try until rank 0 could have started (START_ALLOWANCE_S).
        store = connect(addr, ports, place.run_id, deadline_s + START_ALLOWANCE_S + FINISH_TIMEOUT_S, deadline_s + FINISH_TIMEOUT_S)
    except ChannelError as e:
        if server is not None:
            server.close()
        raise Incomplete(f"agent rank {place.rank}: cannot reach the agents' channel: {one_line(e, 300)}") from None

    def client(timeout_s: float) -> ChannelClient:
        # One client per waiting thread: a client's calls take turns, and a wait would hold the others.
        return connect(addr, ports, place.run_id, timeout_s, timeout_s)

    prefix = f"{KEY_PREFIX}/{place.run_id}"
    idle_s = run_ssh_config(spec.config).run_timeout_s
    try:
        if place.rank != 0:
            # A channel that goes away under a follower means rank 0 ended: the report, or its absence, is rank 0's.
            with contextlib.suppress(ChannelError):
                store.set(f"{prefix}/facts/{place.rank}", json.dumps(mine))
                _follow(store, client, prefix, place, host, deadline_s, idle_s)
            return 0
        store.set(f"{prefix}/facts/0", json.dumps(mine))
        report = _lead(spec, store, client, prefix, place, deadline_s, started_at, began)
        # Delivered before the others are let go: once one leaves, its launcher may tear the whole launch down.
        deliver(spec, report)
        store.set(f"{prefix}/verdict", str(report["exit_code"]))
        store.wait_or_gone([f"{prefix}/left/{r}" for r in range(1, place.world_size)], FINISH_TIMEOUT_S)
        return int(report["exit_code"])
    except ChannelError as e:
        # Rank 0's own channel, on its own host, failed under a call.
        raise Incomplete(f"agent rank 0: lost the agents' channel: {one_line(e, 300)}") from None
    finally:
        store.close()
        if server is not None:
            server.close()


def _follow(store: ChannelClient, client: StoreClient, prefix: str, place: Place, host: HostSpec | None, deadline_s: float,
            idle_s: float) -> None:
    """Answer rank 0's clock ping, run the commands its stages send this host, then stay until its verdict, so that
    every launcher winds down together (a launcher whose store host left first logs a rendezvous error). Rank 0 waits
    for the others' probes (at most deadline_s and START_ALLOWANCE_S) and then for the clock answers (deadline_s);
    between two commands it is quiet at most the run's whole deadline (idle_s); a rank 0 that never goes on costs this
    agent no more than those bounds."""
    from preflight.transport.agents import serve

    if not store.wait_or_gone([f"{prefix}/ping"], deadline_s + START_ALLOWANCE_S + FINISH_TIMEOUT_S):
        return
    store.set(f"{prefix}/pong/{place.rank}", repr(time.time()))
    if serve(client, prefix, place.rank, host, idle_s) and store.wait_or_gone([f"{prefix}/verdict"], deadline_s + FINISH_TIMEOUT_S):
        store.set(f"{prefix}/left/{place.rank}", "1")


def _arrived(store: ChannelClient, keys: list[str]) -> dict[int, str]:
    """The value of each key that is there, by the rank that ends the key."""
    found = {}
    for key in keys:
        value = store.get(key)
        if value is not None:
            found[int(key.rsplit("/", 1)[1])] = value
    return found


def _lead(spec: Spec, store: ChannelClient, client: StoreClient, prefix: str, place: Place, deadline_s: float,
          started_at: dt.datetime, began: float) -> Report:
    """Rank 0: every agent's probe result, the clock exchange, the playbook's stages through the agents, the report."""
    from preflight.findings import CLUSTER, Finding, Status
    from preflight.gather import read_facts
    from preflight.records import HostOutcome
    from preflight.report import build_report
    from preflight.transport.agents import result_from_json

    keys = [f"{prefix}/facts/{r}" for r in range(place.world_size)]
    store.wait_or_gone(keys, deadline_s + START_ALLOWANCE_S)
    arrived = {r: json.loads(text) for r, text in _arrived(store, keys).items()}
    # The clock exchange: every host's answer lies between our two readings.
    sent = time.time()
    store.set(f"{prefix}/ping", "1")
    pong_keys = [f"{prefix}/pong/{r}" for r in arrived if r != 0]
    store.wait_or_gone(pong_keys, deadline_s)
    received = time.time()
    pongs = {r: float(text) for r, text in _arrived(store, pong_keys).items()}
    pongs[0] = (sent + received) / 2  # rank 0's clock is the reference: its own offset is within the exchange's width

    hosts = {h.name: h for h in spec.config.cluster.hosts}
    reported: dict[str, HostOutcome] = {}
    ranks: dict[str, int] = {}
    extra: list[Finding] = []
    for rank, message in sorted(arrived.items()):
        name = message.get("host")
        if name is None:
            extra.append(Finding("PF001", Status.unknown, CLUSTER, f"rank {rank}: {message['problem']}",
                                 "start the agents only on the cluster's hosts, or give each its --host"))
            continue
        if name in reported:
            extra.append(Finding("PF001", Status.unknown, name, f"rank {rank} reported {name} again; kept the first report",
                                 "start one agent per host (torchrun --nproc-per-node=1, srun --ntasks-per-node=1)"))
            continue
        outcome = read_facts(hosts[name], result_from_json(name, message["result"]))
        if outcome.record is not None and rank in pongs:
            # The host's clock minus ours lies between its answer minus our two readings around the ping.
            offset = (pongs[rank] - received, pongs[rank] - sent)
            outcome = replace(outcome, record=replace(outcome.record, clock_offset_s=offset))
        reported[name] = outcome
        ranks[name] = rank
    missing = [r for r in range(place.world_size) if r not in arrived]
    outcomes = []
    for host in spec.config.cluster.hosts:
        if host.name in reported:
            outcomes.append(reported[host.name])
        else:
            waited = deadline_s + START_ALLOWANCE_S
            why = f"no agent reported from this host within {waited:g} s ({len(arrived)} of {place.world_size} agents did"
            why += f"; silent ranks: {', '.join(map(str, missing))})" if missing else ")"
            outcomes.append(HostOutcome(host=host, record=None, problem=Finding(
                "PF001", Status.unknown, host.name, f"not checked: {why}",
                "start the agent on every host of the cluster (torchrun --nnodes, srun --nodes)")))
    records = [o.record for o in outcomes if o.record is not None]
    findings, sections = _stages(spec, client, prefix, place, records, ranks)
    return build_report(spec, outcomes, [*extra, *findings], started_at, time.monotonic() - began, sections)


def _stages(spec: Spec, client: StoreClient, prefix: str, place: Place, records: list[HostRecord],
            ranks: dict[str, int]) -> tuple[list[Finding], StageSections]:
    """The playbook's stages, as `check` runs them, each host's commands run by its agent; every agent is let go at the
    end, and on an interrupt what the commands started is ended first, as `check` ends it."""
    from preflight.errors import Interrupted
    from preflight.gather import run_ssh_config
    from preflight.interrupt import Activity, interrupted_line
    from preflight.pipeline import CLEANUP_ALLOWANCE_S, run_stages
    from preflight.stage_list import playbook_stages
    from preflight.transport.agents import AgentRouter

    config = spec.config
    router = AgentRouter(run_ssh_config(config), client, prefix, ranks, own_rank=place.rank, launch_env=LAUNCH_ENV)
    activity = Activity("facts", "the checks")
    try:
        return run_stages(config, playbook_stages(config), router, records, activity)
    except KeyboardInterrupt as e:
        signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
        cleanup = router.stop(within_s=CLEANUP_ALLOWANCE_S)
        raise Interrupted(signum, interrupted_line(signum, activity, cleanup)) from None
    finally:
        router.release([r for r in range(place.world_size) if r != place.rank])
