"""The collective's seams with the hosts, on stand-ins of the launches (the splitting, each host alone), on this
machine's real sockets (the ports derived from the rendezvous port), and on the ranks' events (the root cause)."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from preflight.collective.host.events import event_line
from preflight.collective.isolate import INTRA_NODE_SUSPECTS, intra_node_findings, isolate
from preflight.collective.judge import LostHost, judge
from preflight.compose import load_spec
from preflight.errors import InputError
from preflight.launch import Launch
from preflight.ports import free_or_another
from preflight.spec import Backend, HostSpec, TransportKind, split_port
from preflight.transport.base import CommandResult, RemoteCommand
from preflight.transport.local import LocalTransport


@dataclass
class Outcome:
    status: str
    message: str = ""
    lost: list[LostHost] = field(default_factory=list)


@dataclass
class Launches:
    """Stands in for Collective.run: a group fails when it holds a bad host, when it runs on a port someone holds on its
    first host, or (alone) on a host whose transport `broken` names unless that transport is off; a group with a host
    that `lost` names has no verdict (the host was lost under it); derived ports are checked as Collective.run does, each
    taken one replaced by a free one. Every call's groups are kept."""

    bad: set[str] = field(default_factory=set)
    taken: set[tuple[str, int]] = field(default_factory=set)
    broken: dict[str, str] = field(default_factory=dict)  # host -> the variable whose transport is broken there
    lost: set[str] = field(default_factory=set)
    calls: list[list[tuple[list[str], int]]] = field(default_factory=list)

    def run(self, groups: Sequence[tuple[Sequence[str], int]], *, extra_env: dict[str, str] | None = None,
            derived: bool = False) -> list[Outcome]:
        chosen = [(list(hosts), 40000 + k if derived and (hosts[0], port) in self.taken else port)
                  for k, (hosts, port) in enumerate(groups)]
        self.calls.append(chosen)
        off = set(extra_env or {})
        return [Outcome("unknown", "lost", [LostHost(h, "init", f"{h} stopped answering") for h in hosts if h in self.lost])
                if set(hosts) & self.lost else
                Outcome("fail" if set(hosts) & self.bad or (hosts[0], port) in self.taken
                        or any(self.broken.get(h) and self.broken[h] not in off for h in hosts) else "pass", "hung in init")
                for hosts, port in chosen]


def test_each_host_alone_runs_at_once_and_the_retries_too() -> None:
    p2p, shm = (variable for variable, _, _ in INTRA_NODE_SUSPECTS)
    launches = Launches(broken={"h2": p2p, "h3": shm, "h4": "NCCL_NET_GDR_LEVEL"})
    findings = intra_node_findings(launches, ["h1", "h2", "h3", "h4"], 29500)  # type: ignore[arg-type]
    # Three rounds of launches: all four hosts alone, the three failing ones with P2P off, the two left with SHM off.
    assert [[hosts for hosts, _ in call] for call in launches.calls] == [
        [["h1"], ["h2"], ["h3"], ["h4"]], [["h2"], ["h3"], ["h4"]], [["h3"], ["h4"]]]
    assert launches.calls[0] == [(["h1"], 29600), (["h2"], 29603), (["h3"], 29606), (["h4"], 29609)]
    assert launches.calls[2] == [(["h3"], 29608), (["h4"], 29611)]
    assert [(f.host, f.workaround) for f in findings] == [("h2", {p2p: "1"}), ("h3", {shm: "1"}), ("h4", {})]
    assert findings[2].message == "the intra-node collective fails on this host alone: hung in init"


def test_a_taken_derived_port_is_replaced_so_no_healthy_host_is_blamed() -> None:
    # h1 holds the first splitting port (port + 1): run there, the healthy half h1+h2 would fail and be split too.
    launches = Launches(bad={"h4"}, taken={("h1", split_port(29500, 0))})
    found = isolate(launches, ["h1", "h2", "h3", "h4"], 29500)  # type: ignore[arg-type]
    assert found.culprits == ["h4"] and found.healthy == ["h1", "h2", "h3"]
    assert launches.calls[0][0] == (["h1", "h2"], 40000)


def test_a_derived_port_that_is_taken_on_this_machine_is_replaced_by_a_free_one() -> None:
    host = HostSpec(name="here", address="127.0.0.1", transport=TransportKind.local, python=sys.executable)
    with socket.socket() as held, socket.socket() as probe:
        held.bind(("", 0))
        held.listen()
        probe.bind(("", 0))
        taken, free = held.getsockname()[1], probe.getsockname()[1]
        probe.close()
        other, same = free_or_another(LocalTransport(), [(host, taken), (host, free)], timeout_s=30)
    assert same == free and other != taken and 0 < other < 65536


@pytest.mark.parametrize(("port", "playbook", "refused"), [(65500, "full", True), (65433, "full", False), (65500, "facts", False)])
def test_a_master_port_without_room_for_its_derived_ports_is_bad_input(port: int, playbook: str, refused: bool) -> None:
    overrides = ["cluster=local", f"playbook={playbook}", f"network.master_port={port}"]
    if not refused:
        assert load_spec(overrides).config.network.master_port == port
        return
    with pytest.raises(InputError, match=r"^network\.master_port: 65500 leaves .*\(up to 65602 with 1 host, .* at most 65433, or 0$"):
        load_spec(overrides)


def test_the_root_cause_is_the_first_failure_by_the_hosts_clocks_not_by_each_rank_s_own_start() -> None:
    """h2's rank started 10 s before h1's (a slower torchrun start on h1) and failed first by the clock, 12 s into its
    run; h1's failed 3 s later by the clock but only 5 s into its own run. The first to fail is h2."""
    launch = Launch(master="h1", master_addr="198.18.0.11", master_port=29500, nnodes=2, nproc_per_node=1,
                    backend=Backend.gloo, rdzv_id="r", hosts=[])

    def failed(host: str, rank: int, t: float, unix_s: float, error: str) -> CommandResult:
        entered = {"event": "phase", "phase": "init", "rank": rank, "local_rank": 0, "host": host, "t": 1.0}
        said = {"event": "error", "phase": "init", "rank": rank, "local_rank": 0, "host": host, "t": t, "unix_s": unix_s, "error": error}
        return CommandResult(host=host, reached=True, exit_code=1, stdout="".join(event_line(e).decode() for e in (entered, said)))

    h1 = failed("h1", 0, 5.0, 1_795_000_005.0, "RuntimeError: Connection reset by peer")
    h2 = failed("h2", 1, 12.0, 1_795_000_002.0, "RuntimeError: Unable to find address for: eth9")
    outcome = judge(launch, [h1, h2])
    assert (outcome.status, outcome.named_hosts) == ("fail", ["h2"])
    assert outcome.message.endswith("rank 1 on h2 failed in init: RuntimeError: Unable to find address for: eth9")


def test_a_rank_that_died_of_its_store_going_away_is_not_blamed_beside_a_rank_with_its_own_error() -> None:
    """h3 has no eth9: its rank fails in init with an error of its own. The master's torchrun stops, and h2's rank dies
    silently with "got 0 bytes ... Connection was likely closed" in its torchrun's stderr: an echo, not a cause. Seen in
    CI naming h2 when h2's silent death was judged before h3's error."""
    launch = Launch(master="h1", master_addr="198.18.0.11", master_port=29500, nnodes=3, nproc_per_node=1,
                    backend=Backend.gloo, rdzv_id="r", hosts=[])

    def entered(host: str, rank: int) -> dict[str, object]:
        return {"event": "phase", "phase": "init", "rank": rank, "local_rank": 0, "host": host, "t": 1.0}

    def said(*events: dict[str, object]) -> str:
        return "".join(event_line(e).decode() for e in events)

    store_gone = ("torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed. "
                  "Did the remote server shutdown or crash?")
    h1 = CommandResult(host="h1", reached=True, exit_code=1, stdout=said(entered("h1", 0)), stderr=store_gone)
    h2 = CommandResult(host="h2", reached=True, exit_code=1, stdout=said(entered("h2", 1)), stderr=store_gone)
    own = {"event": "error", "phase": "init", "rank": 2, "local_rank": 0, "host": "h3", "t": 2.0, "unix_s": 1_795_000_002.0,
           "error": "RuntimeError: Unable to find address for: eth9"}
    h3 = CommandResult(host="h3", reached=True, exit_code=1, stdout=said(entered("h3", 2), own))
    outcome = judge(launch, [h1, h2, h3])
    assert (outcome.status, outcome.phase, outcome.named_hosts) == ("fail", "init", ["h3"])
    assert outcome.message.endswith("rank 2 on h3 failed in init: RuntimeError: Unable to find address for: eth9")



def test_a_lost_group_stops_only_its_own_local_commands() -> None:
    """A launch's commands are one group: when its SSH host is lost, the router stops the group's local commands (a local
    master would wait for the lost rank to its deadlines), and leaves another group's run to its end."""
    here = HostSpec(name="here", address="127.0.0.1", transport=TransportKind.local)
    run = LocalTransport().begin([RemoteCommand(here, ["sleep", "30"], timeout_s=60, group="launch"),
                                  RemoteCommand(here, ["sleep", "1"], timeout_s=60, group="other")], all_at_once=True)
    began = time.monotonic()
    run.stop(["launch"])
    stopped, other = run.results()
    assert not stopped.ok and other.ok, (stopped, other)
    assert time.monotonic() - began < 10


def _said(*events: dict[str, object]) -> str:
    return "".join(event_line(e).decode() for e in events)


def _entered(host: str, rank: int, *phases: str) -> list[dict[str, object]]:
    return [{"event": "phase", "phase": phase, "rank": rank, "local_rank": 0, "host": host, "t": 1.0} for phase in phases]


def test_a_host_lost_mid_launch_is_unknown_in_the_phase_it_went_silent_and_nobody_is_blamed() -> None:
    """h3's link pulled in the sweep: its connection is lost (its events so far came back), and the transport ended h1's
    and h2's commands, whose ranks timed out waiting for h3 on the way. No verdict, and h3 named with its phase."""
    launch = Launch(master="h1", master_addr="198.18.0.11", master_port=29500, nnodes=3, nproc_per_node=1,
                    backend=Backend.gloo, rdzv_id="r", hosts=[])
    waited = {"event": "timeout", "phase": "sweep", "rank": 0, "local_rank": 0, "host": "h1", "deadline_s": 5.0}
    h1 = CommandResult(host="h1", reached=False, stdout=_said(*_entered("h1", 0, "init", "verify", "sweep"), waited),
                       reason="ended early: h3, a host of the same group, was lost")
    h2 = CommandResult(host="h2", reached=False, stdout=_said(*_entered("h2", 1, "init", "verify", "sweep")),
                       reason="ended early: h3, a host of the same group, was lost")
    h3 = CommandResult(host="h3", reached=False, lost=True, stdout=_said(*_entered("h3", 2, "init", "verify", "sweep")),
                       reason="198.18.0.13 stopped answering: nothing received for 3.1 s")
    outcome = judge(launch, [h1, h2, h3])
    assert (outcome.status, outcome.phase, outcome.named_hosts) == ("unknown", "sweep", ["h3"])
    assert outcome.lost == [LostHost("h3", "sweep", "198.18.0.13 stopped answering: nothing received for 3.1 s")]
    assert "lost h3 in sweep (198.18.0.13 stopped answering" in outcome.message


def test_every_host_lost_is_every_host_unknown_the_earliest_phase_first() -> None:
    """Every host lost, one before its ranks said anything: it went silent in the rendezvous, the launch's phase."""
    launch = Launch(master="h1", master_addr="198.18.0.11", master_port=29500, nnodes=2, nproc_per_node=1,
                    backend=Backend.gloo, rdzv_id="r", hosts=[])
    h1 = CommandResult(host="h1", reached=False, lost=True, stdout=_said(*_entered("h1", 0, "init", "verify")), reason="h1 gone")
    h2 = CommandResult(host="h2", reached=False, lost=True, reason="h2 gone")
    outcome = judge(launch, [h1, h2])
    assert (outcome.status, outcome.phase, outcome.named_hosts) == ("unknown", "rendezvous", ["h1", "h2"])
    assert [(h.host, h.phase) for h in outcome.lost] == [("h1", "verify"), ("h2", "rendezvous")]


def test_a_host_lost_while_the_hosts_are_split_is_neither_blamed_nor_cleared() -> None:
    """h4 fails with any other; h2 is lost under the splitting's first round: h1 and h2's half has no verdict, so
    neither is healthy, and h2 is no culprit."""
    launches = Launches(bad={"h4"}, lost={"h2"})
    found = isolate(launches, ["h1", "h2", "h3", "h4"], 29500)  # type: ignore[arg-type]
    assert (found.culprits, found.healthy) == (["h4"], ["h3"])
    assert [h.host for h in found.lost] == ["h2"] and found.note == "not judged: h1, h2 (lost: h2)"


def test_staging_removes_this_host_s_stale_run_folders_and_nothing_in_use(tmp_path: Path) -> None:
    """A host lost mid-check keeps its run's folder (no cleanup could reach it): the next check's staging on that host
    removes this user's folders of earlier runs that no process names and that nothing touched for longer than a whole
    run (here 600 s), and keeps every other."""
    import json
    import os
    import re
    import subprocess

    from preflight.collective.run import _STAGE

    host = re.sub("[^A-Za-z0-9.-]", "", os.uname().nodename)
    old = time.time() - 3600

    def folder(name: str, touched: float | None = None) -> Path:
        path = tmp_path / name
        (path / "torchrun").mkdir(parents=True)
        (path / "worker.py").write_text("")
        if touched is not None:
            for p in (path / "torchrun", path / "worker.py", path):
                os.utime(p, (touched, touched))
        return path

    stale = folder(f"preflight-0123abcd-{host}-ab_12", old)
    recent = folder(f"preflight-4567abcd-{host}-cd_34")  # a run of now: between its launches no process names it
    named = folder(f"preflight-89abcdef-{host}-ef_56", old)  # a run whose supervisor still runs from it
    other_host = folder(f"preflight-0123abcd-{host}x-gh_78", old)
    not_ours = folder("preflight-notes", old)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", str(named / "worker.py")])
    try:
        staged = json.dumps({"worker.py": "# the worker", "rail_env.py": "# the wrapper"})
        done = subprocess.run([sys.executable, "-c", _STAGE, "600"], input=staged, capture_output=True, text=True,
                              env={**os.environ, "TMPDIR": str(tmp_path), "PREFLIGHT_TAG": "fedc9876"}, timeout=30, check=True)
    finally:
        holder.kill()
        holder.wait()
    made = Path(done.stdout.strip())
    assert made.parent == tmp_path and made.name.startswith(f"preflight-fedc9876-{host}-")
    assert (made / "worker.py").read_text() == "# the worker" and (made / "rail_env.py").read_text() == "# the wrapper"
    assert not stale.exists()
    assert recent.exists() and named.exists() and other_host.exists() and not_ours.exists()
