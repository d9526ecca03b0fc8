"""The collective on the namespace cluster: real torchrun, real gloo, real faults."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_cluster import Cluster, hosts_by_name

from preflight.collective.host.events import event_line
from preflight.collective.isolate import isolate
from preflight.collective.judge import judge
from preflight.launch import Launch
from preflight.spec import Backend
from preflight.transport.base import CommandResult

pytestmark = pytest.mark.sandbox

# Small enough for a 2-core machine running four torch processes per host pair; the deadlines
# are what the assertions hold the run to.
FAST = ["collective.verify_bytes=262144", "collective.sweep_min_bytes=65536", "collective.sweep_max_bytes=262144",
        "collective.warmup=1", "collective.iters=3", "collective.rendezvous_timeout_s=20", "collective.init_timeout_s=20",
        "collective.identity_timeout_s=20", "collective.verify_timeout_s=30", "collective.sweep_timeout_s=60",
        "collective.finish_timeout_s=20", "ssh.command_timeout_s=30"]
# A sweep that runs for tens of seconds, so that a fault injected once it has begun lands inside it.
LONG_SWEEP = [*(o for o in FAST if not o.startswith(("collective.sweep_max_bytes", "collective.iters", "collective.sweep_timeout_s"))),
              "collective.sweep_max_bytes=4194304", "collective.iters=100", "collective.sweep_adaptive=false"]


def finding(report: dict[str, Any], code: str, host: str = "*") -> dict[str, Any]:
    return next(f for f in report["findings"] if f["code"] == code and f["host"] == host)


@pytest.fixture(scope="module")
def cluster(sandbox_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    sandbox = sandbox_factory(3)
    return Cluster(sandbox, tmp_path_factory.mktemp("collective3"), "coll3")


def torchrun_log_folders() -> set[Path]:
    """torchrun's per-launch log folders of preflight's runs in this machine's /tmp, which the hosts share."""
    return set(Path("/tmp").glob("torchelastic_*/preflight-*"))


@pytest.fixture(scope="module")
def burnin(cluster: Cluster) -> tuple[dict[str, Any], str, set[Path]]:
    """One burn-in check as users see it in a terminal (the report is the one it saved): the report, the table, and the
    torchrun log folders it added to /tmp."""
    before = torchrun_log_folders()
    report, _elapsed, result = cluster.check(*FAST, "playbook.repeats=2", playbook="burnin", terminal=True)
    return report, result.stdout, torchrun_log_folders() - before


def test_burnin_passes_twice_in_a_row_with_every_byte_verified(cluster: Cluster, burnin: tuple[dict[str, Any], str, set[Path]]) -> None:
    report, _table, added = burnin
    assert report["status"] == "pass", report["findings"][:3]
    collective = report["collective"]
    runs = collective["repeats"]
    assert [run["status"] for run in runs] == ["pass", "pass"]
    assert all(run["peak_busbw_GBps"] > 0 for run in runs)
    assert collective["message"].endswith("(2 runs in a row passed)")
    assert collective["status"] == "pass" and collective["backend"] == "gloo"
    assert collective["world_size"] == 3 and collective["master"] == "h1"
    assert collective["verify"] == {"bytes_per_rank": 262144, "wrong": 0, "ranks": 3}
    sizes = {(row["op"], row["bytes"]) for row in collective["sweep"]}
    # On gloo the sweep measures all_reduce by default (the all_gather is the verified one).
    assert sizes == {("all_reduce", size) for size in (65536, 131072, 262144)}
    assert all(row["ranks"] == 3 and row["busbw_min_GBps"] > 0 for row in collective["sweep"])
    assert finding(report, "PF601")["status"] == "pass"
    cluster.assert_nothing_left()
    assert added == set(), "torchrun left its log folders behind"


def test_terminal_report_shows_the_busbw_table(burnin: tuple[dict[str, Any], str, set[Path]]) -> None:
    _report, table, _added = burnin
    words = " ".join(table.split())  # the terminal's width wraps lines
    assert "collective PASS" in words and "every byte of the all_gather verified (2 runs in a row passed)" in words
    assert "(262,144 B per rank, 0 wrong)" in words
    assert "busbw" in table and "all_reduce" in table and "262,144" in table


@pytest.mark.xdist_group("test_collective-own-clusters")  # a cluster of its own: free to run beside the module's
def test_hostname_on_loopback_is_harmless_with_the_derived_interface(sandbox_factory: Any, tmp_path: Path) -> None:
    """Gloo binds to what the hostname resolves to (127.0.0.1 here) unless GLOO_SOCKET_IFNAME is
    set: the launch preflight derives sets it, so the collective passes and PF301 only warns."""
    from preflight.sandbox import HostQuirks

    sandbox = sandbox_factory(2, quirks={2: HostQuirks(own_name="loopback")})
    cluster = Cluster(sandbox, tmp_path, "loop")
    report, _elapsed, _ = cluster.check(*FAST, playbook="full")
    assert finding(report, "PF301", "h2")["status"] == "warn"
    assert report["collective"]["status"] == "pass"
    cluster.assert_nothing_left()


def test_blocked_rendezvous_port_is_a_hang_inside_the_deadline(cluster: Cluster) -> None:
    """The collective's own deadline, without the connectivity test that names the port first (tests/test_connectivity.py):
    a job launched by hand meets the same hang."""
    block = ["iptables", "-w", "5", "-I", "INPUT", "-p", "tcp", "--dport", "29500", "-j", "DROP"]
    cluster.sandbox.run_in("h1", block).check_returncode()
    try:
        report, elapsed, _ = cluster.check(*FAST, "collective.rendezvous_timeout_s=8", "collective.sweep_max_bytes=65536",
                                           "playbook.stages=[facts,collective,sweep]", playbook="full", timeout=240)
    finally:
        cluster.sandbox.run_in("h1", ["iptables", "-w", "5", "-D", *block[4:]]).check_returncode()
    collective = report["collective"]
    assert collective["status"] == "hang" and collective["phase"] == "rendezvous", collective["message"]
    assert "h1:29500" in collective["message"]
    assert set(hosts_by_name(report)) == {"h1", "h2", "h3"}
    # Halves on other ports pass: the fault is the set's (the master port), not a host's.
    assert collective["isolation"]["culprits"] == [] and "whole set" in collective["isolation"]["note"]
    assert collective["isolation"]["confirmed"] is None
    assert elapsed < 200
    cluster.assert_nothing_left()


def worker_rank_in_phase(cluster: Cluster, host: str, phase: str) -> int | None:
    """The pid of host's rank of the collective (not torchrun's agent, the host's supervisor or agent mode's rank
    starter) once its status file beside the worker says phase; None before then."""
    for pid in cluster.sandbox.pids(host):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except (FileNotFoundError, ProcessLookupError):  # ended meanwhile: /proc/PID answers ESRCH
            continue
        script = next((a for a in argv if a.endswith("/worker.py")), None)
        if script is None or {"torch.distributed.run", "supervise", "ranks"} & set(argv):
            continue
        try:
            if (Path(script).parent / "status").read_text(encoding="utf-8").strip() == phase:
                return pid
        except FileNotFoundError:
            continue
    return None


def check_with_fault(cluster: Cluster, host: str, inject: Callable[[int], object], *overrides: str) -> tuple[dict[str, Any], float]:
    """The full check with a long sweep; inject(pid) runs on host's worker (not torchrun's agent) once its ranks are in
    the sweep, as the host's supervisor says in the status file beside the worker. Fails unless it ran."""
    injected: list[int] = []

    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not injected:
            pid = worker_rank_in_phase(cluster, host, "sweep")
            if pid is not None:
                time.sleep(0.5)  # inside the sweep's timed loop, not at its first barrier
                try:
                    inject(pid)
                    injected.append(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        report, elapsed, _ = cluster.check(*LONG_SWEEP, *overrides, playbook="full", timeout=240)
    finally:
        watcher.join(timeout=5)
    assert injected, f"the worker on {host} never started"
    return report, elapsed


def test_host_killed_mid_sweep_is_named(cluster: Cluster) -> None:
    """Kill h3's rank while the sweep runs: its peers fail after it, and h3 is named as the root cause."""
    report, _elapsed = check_with_fault(cluster, "h3", lambda pid: os.kill(pid, signal.SIGKILL),
                                        "collective.sweep_timeout_s=25", "collective.isolate=false")
    collective = report["collective"]
    assert (collective["status"], collective["phase"]) == ("fail", "sweep"), collective["message"]
    assert "rank 2 on h3 died in sweep" in collective["message"]
    assert finding(report, "PF601")["status"] == "fail"
    cluster.assert_nothing_left()


def test_host_cut_off_mid_sweep_is_a_hang_named_by_phase_and_host(cluster: Cluster) -> None:
    """h3 drops every packet but SSH once the sweep runs: every rank waits in the sweep, the
    deadline cuts them all, and splitting the set names h3."""
    # Two rules, SSH's accept first: iptables-nft 1.8.9 drops port 22 too for "! --dport 22 ! --sport 22" in one rule.
    partition = [["INPUT", "1", "-p", "tcp", "--dport", "22", "-j", "ACCEPT"],
                 ["INPUT", "2", "-p", "tcp", "-s", "198.18.0.0/15", "-j", "DROP"]]
    applied: list[list[str]] = []

    def cut_off(_pid: int) -> None:
        for rule in partition:
            cluster.sandbox.run_in("h3", ["iptables", "-w", "5", "-I", *rule]).check_returncode()
            applied.append(rule)

    try:
        report, elapsed = check_with_fault(cluster, "h3", cut_off, "collective.sweep_timeout_s=12", "collective.rendezvous_timeout_s=8")
    finally:
        for rule in reversed(applied):
            cluster.sandbox.run_in("h3", ["iptables", "-w", "5", "-D", rule[0], *rule[2:]]).check_returncode()
    collective = report["collective"]
    assert (collective["status"], collective["phase"]) == ("hang", "sweep"), collective["message"]
    assert "HANG in sweep" in collective["message"]
    assert collective["isolation"]["culprits"] == ["h3"], collective["isolation"]
    assert finding(report, "PF605", "h3")["status"] == "fail"
    assert set(hosts_by_name(report)) == {"h1", "h2", "h3"}
    assert elapsed < 150
    cluster.assert_nothing_left()


def test_stuck_rank_is_cut_by_its_host_and_named(cluster: Cluster) -> None:
    """A rank frozen mid-sweep (SIGSTOP: as a rank stuck in the driver) cannot run its own watchdog: its host's
    supervisor cuts it past the deadline, so the run ends in seconds, and the report names the host and the phase."""
    report, elapsed = check_with_fault(cluster, "h2", lambda pid: os.kill(pid, signal.SIGSTOP),
                                       "collective.sweep_timeout_s=10", "collective.isolate=false")
    collective = report["collective"]
    assert (collective["status"], collective["phase"]) == ("hang", "sweep"), collective["message"]
    assert "stopped reporting first: h2" in collective["message"]
    # 7 s to the stop, the 10 s deadline and the supervisor's grace: far below the transport's outer deadline.
    assert elapsed < 60
    cluster.assert_nothing_left()


@pytest.mark.xdist_group("test_collective-own-clusters")
def test_six_hosts_one_bad_found_in_at_most_three_rounds(sandbox_factory: Any, tmp_path: Path) -> None:
    """Splitting on a real cluster (test_splitting_rounds_are_logarithmic has the rounds at 8 hosts and more): six hosts,
    not eight, since every round is torch started on each host and the suite's time is scarce."""
    sandbox = sandbox_factory(6)
    cluster = Cluster(sandbox, tmp_path, "six")
    # h6's gloo cannot start on eth9; its peers hear of it through torchrun's store and stop at once, so no failing
    # launch waits out the 20 s init deadline.
    report, _elapsed, _ = cluster.check(*FAST, "cluster.hosts.5.interface=eth9", playbook="full", timeout=600)
    collective = report["collective"]
    assert (collective["status"], collective["phase"]) == ("fail", "init"), collective["message"]
    assert "on h6 failed in init" in collective["message"] and "eth9" in collective["message"]
    isolation = collective["isolation"]
    assert isolation["culprits"] == ["h6"]
    assert isolation["rounds"] <= 3
    assert sorted(isolation["healthy"]) == sorted(f"h{k}" for k in range(1, 7) if k != 6)
    assert isolation["confirmed"]["status"] == "pass" and isolation["confirmed"]["hosts"] == isolation["healthy"]
    cluster.assert_nothing_left()


@pytest.mark.parametrize(("hosts", "bad", "rounds"), [(8, {"h6"}, 3), (2, {"h2"}, 1), (5, {"h1"}, 3), (8, {"h2", "h7"}, 3)])
def test_splitting_rounds_are_logarithmic(hosts: int, bad: set[str], rounds: int) -> None:
    """The splitting logic alone, over a stand-in runner that fails any group holding a bad host."""

    class Outcome:
        def __init__(self, status: str) -> None:
            self.status = status

    class Runner:
        def run(self, groups: Any, *, derived: bool = False) -> list[Outcome]:
            return [Outcome("fail" if set(members) & bad else "pass") for members, _port in groups]

    names = [f"h{k}" for k in range(1, hosts + 1)]
    found = isolate(Runner(), names, 29500)  # type: ignore[arg-type]
    assert set(found.culprits) == bad and found.rounds == rounds



def _host_output(*events: dict[str, Any]) -> str:
    return "".join(event_line(e).decode() for e in events)


def _phase(host: str, rank: int) -> dict[str, Any]:
    return {"event": "phase", "phase": "init", "rank": rank, "local_rank": rank % 2, "host": host, "t": 2.5}


def test_a_rank_stopped_by_a_peer_points_at_the_peer() -> None:
    """The judge alone, on the events of 3 hosts x 2 ranks where rank 4 on h3 failed init (real runs: test_worker's
    two-node launch and the eight-host splitting above). Its peers were stopped through the store, and h1's torchrun
    stopped rank 1 before it could say so: that silence is no cause."""
    launch = Launch(master="h1", master_addr="198.18.0.11", master_port=29500, nnodes=3, nproc_per_node=2,
                    backend=Backend.gloo, rdzv_id="r", hosts=[])
    cause = {"rank": 4, "host": "h3", "phase": "init", "error": "RuntimeError: Unable to find address for: eth9"}

    def stopped(host: str, rank: int) -> dict[str, Any]:
        return {"event": "error", "phase": "init", "rank": rank, "local_rank": rank % 2, "host": host, "t": 2.6, "after": cause,
                "error": "stopped: rank 4 on h3 failed in init"}

    h1 = CommandResult(host="h1", reached=True, exit_code=1, stdout=_host_output(_phase("h1", 0), _phase("h1", 1), stopped("h1", 0)))
    h2 = CommandResult(host="h2", reached=True, exit_code=1, stdout=_host_output(_phase("h2", 2), stopped("h2", 2), stopped("h2", 3)))
    h3 = CommandResult(host="h3", reached=True, exit_code=1, stdout=_host_output(
        _phase("h3", 4), {"event": "error", "local_rank": 0, "t": 2.55, **cause}, _phase("h3", 5), stopped("h3", 5)))
    outcome = judge(launch, [h1, h2, h3])
    assert (outcome.status, outcome.phase, outcome.named_hosts) == ("fail", "init", ["h3"])
    assert outcome.message.endswith("rank 4 on h3 failed in init: RuntimeError: Unable to find address for: eth9")

    # h3 cut off after it told the store: its own line never came back, its peers' word of it names it all the same.
    lost = CommandResult(host="h3", reached=False, reason="the run's deadline passed")
    outcome = judge(launch, [h1, h2, lost])
    assert (outcome.status, outcome.phase, outcome.named_hosts) == ("fail", "init", ["h3"])
    assert "rank 4 on h3 failed in init: RuntimeError" in outcome.message


def test_a_peer_hearing_a_timed_out_rank_leave_is_no_failure() -> None:
    """The events of a CI run of test_host_cut_off_mid_sweep...: h3 cut off in the sweep; h1 entered the sweep first,
    waited out its deadline and ended, and h2, still inside the same all_gather, heard "Connection closed by peer"
    before its own watchdog fired. That is the hang's echo: the launch hung in the sweep. A real failure beside a
    timeout still fails."""
    launch = Launch(master="h1", master_addr="198.19.16.11", master_port=29500, nnodes=3, nproc_per_node=1,
                    backend=Backend.gloo, rdzv_id="r", hosts=[])

    def entered(host: str, rank: int) -> dict[str, Any]:
        return {"event": "phase", "phase": "sweep", "rank": rank, "local_rank": 0, "host": host, "t": 3.0}

    closed = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
              "[198.19.16.11]:31644. This is typically caused by a remote worker crashing.")
    h1 = CommandResult(host="h1", reached=True, exit_code=3, stdout=_host_output(entered("h1", 0), {
        "event": "timeout", "phase": "sweep", "rank": 0, "local_rank": 0, "host": "h1", "deadline_s": 12, "t": 15.0}))
    h3 = CommandResult(host="h3", reached=True, exit_code=3, stdout=_host_output(entered("h3", 2), {
        "event": "timeout", "phase": "sweep", "rank": 2, "local_rank": 0, "host": "h3", "deadline_s": 12, "t": 15.2}))

    def h2_says(error: str) -> CommandResult:
        return CommandResult(host="h2", reached=True, exit_code=1, stdout=_host_output(entered("h2", 1), {
            "event": "error", "phase": "sweep", "rank": 1, "local_rank": 0, "host": "h2", "t": 15.1, "error": error}))

    outcome = judge(launch, [h1, h2_says(closed), h3])
    assert (outcome.status, outcome.phase) == ("hang", "sweep"), outcome.message
    assert "HANG in sweep" in outcome.message
    outcome = judge(launch, [h1, h2_says("RuntimeError: CUDA error: an illegal memory access was encountered"), h3])
    assert (outcome.status, outcome.phase, outcome.named_hosts) == ("fail", "sweep", ["h2"])

    # The same echo relayed: h2 heard it first and told the store, so h1, whose watchdog had not fired yet, stopped on
    # h2's word (a CI run of 9bf459c judged that a fail and blamed a healthy host for the echo). Still the hang.
    relayed = CommandResult(host="h1", reached=True, exit_code=1, stdout=_host_output(entered("h1", 0), {
        "event": "error", "phase": "sweep", "rank": 0, "local_rank": 0, "host": "h1", "t": 15.2,
        "error": "stopped: rank 1 on h2 failed in sweep", "after": {"rank": 1, "host": "h2", "phase": "sweep", "error": closed}}))
    outcome = judge(launch, [relayed, h2_says(closed), h3])
    assert (outcome.status, outcome.phase) == ("hang", "sweep"), outcome.message
    real = {"rank": 1, "host": "h2", "phase": "sweep", "error": "RuntimeError: CUDA error: an illegal memory access"}
    stopped = CommandResult(host="h1", reached=True, exit_code=1, stdout=_host_output(entered("h1", 0), {
        "event": "error", "phase": "sweep", "rank": 0, "local_rank": 0, "host": "h1", "t": 15.2,
        "error": "stopped: rank 1 on h2 failed in sweep", "after": real}))
    outcome = judge(launch, [stopped, h2_says(str(real["error"])), h3])
    assert (outcome.status, outcome.named_hosts) == ("fail", ["h2"]), outcome.message
