"""The connectivity test on the namespace cluster: real listeners, real iptables, real MTUs, before any torchrun.

Each fault case asserts the finding, the host (and port or pair) it names, the wall time of the check, and that
nothing is left running on any host.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_cluster import Cluster

from preflight.connectivity.plan import plan_mesh, ring_offsets
from preflight.spec import ConnectivityConfig

pytestmark = pytest.mark.sandbox

PORT = 29500


def failing(report: dict[str, Any], code: str) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["code"] == code and f["status"] == "fail"]


@pytest.fixture(scope="module")
def cluster(sandbox_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    return Cluster(sandbox_factory(4), tmp_path_factory.mktemp("connectivity4"), "conn4")


@pytest.fixture
def fault(cluster: Cluster) -> Iterator[list[tuple[str, list[str]]]]:
    """Undo commands, run in the host's namespace after the test whatever happened."""
    undo: list[tuple[str, list[str]]] = []
    yield undo
    for host, argv in reversed(undo):
        cluster.sandbox.run_in(host, argv).check_returncode()
        # A lossy link can eat the client's last packets: the host's sshd then keeps the session of a connection preflight
        # closed, until TCP gives up on it (minutes). It is sshd's, not something preflight left: end it.
        for pid in cluster.sandbox.pids(host):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sshd: root@notty"):
                    os.kill(pid, signal.SIGTERM)
    cluster.assert_nothing_left()


def inject(cluster: Cluster, undo: list[tuple[str, list[str]]], host: str, argv: list[str], revert: list[str]) -> None:
    cluster.sandbox.run_in(host, argv).check_returncode()
    undo.append((host, revert))


def test_healthy_cluster_passes_every_path(cluster: Cluster) -> None:
    report, elapsed, _ = cluster.check(playbook="connectivity")
    section = report["connectivity"]
    assert report["status"] == "pass", [f for f in report["findings"] if f["status"] != "pass"]
    assert section["status"] == "pass" and section["mode"] == "full" and section["master"] == "h1"
    assert section["hosts"] == ["h1", "h2", "h3", "h4"]
    assert section["tcp_tested"] == 4 + 4 * 3  # four registrations at the rendezvous port, every ordered pair
    assert section["mtu_tested"] == 12 and section["loss_tested"] == 12 and section["loss_max_percent"] == 0.0
    assert {f["code"] for f in report["findings"] if f["status"] == "pass"} >= {"PF609", "PF610", "PF611", "PF612"}
    assert report["collective"] is None
    print(f"\nhealthy connectivity test of 4 hosts: {elapsed:.1f} s wall")  # its speed: bench/check_speed.py
    cluster.assert_nothing_left()


def test_rendezvous_port_dropped_on_the_master_is_named_before_torchrun(cluster: Cluster, fault: list[tuple[str, list[str]]]) -> None:
    rule = ["-p", "tcp", "--dport", str(PORT), "-j", "DROP"]
    inject(cluster, fault, "h1", ["iptables", "-w", "5", "-I", "INPUT", *rule], ["iptables", "-w", "5", "-D", "INPUT", *rule])
    report, elapsed, _ = cluster.check(f"network.master_port={PORT}", playbook="full", timeout=120)
    (finding,) = failing(report, "PF609")
    assert finding["host"] == "h1" and f"h1:{PORT} is filtered" in finding["message"], finding
    assert report["connectivity"]["status"] == "fail"
    assert {(p["source"], p["destination"], p["port"], p["result"]) for p in report["connectivity"]["tcp_failed"]} == \
        {(h, "h1", PORT, "filtered") for h in ("h1", "h2", "h3", "h4")}
    collective = report["collective"]
    assert collective["status"] == "skipped" and collective["message"] == "not run: the connectivity test failed (PF609 on h1)"
    assert report["exit_code"] == 1
    # Seconds, not the rendezvous deadline: the connects' 3 s, python's start and the facts stage.
    assert elapsed < 30


def test_mesh_port_dropped_on_a_worker_names_the_worker(cluster: Cluster, fault: list[tuple[str, list[str]]]) -> None:
    """h2 admits SSH and the rendezvous port but no new TCP on the ephemeral range, where gloo and NCCL listen."""
    rule = ["-p", "tcp", "--syn", "--dport", "32768:60999", "-j", "DROP"]
    inject(cluster, fault, "h2", ["iptables", "-w", "5", "-I", "INPUT", *rule], ["iptables", "-w", "5", "-D", "INPUT", *rule])
    report, elapsed, _ = cluster.check(f"network.master_port={PORT}", playbook="connectivity")
    (finding,) = failing(report, "PF610")
    assert finding["host"] == "h2" and "answers no host: filtered from h1, h3, h4" in finding["message"], finding
    assert not failing(report, "PF609")
    failed = report["connectivity"]["tcp_failed"]
    assert {(p["source"], p["destination"]) for p in failed} == {("h1", "h2"), ("h3", "h2"), ("h4", "h2")}
    assert all(p["result"] == "filtered" and 32768 <= p["port"] <= 60999 for p in failed)
    assert elapsed < 30


def test_lossy_host_is_named_with_its_loss(cluster: Cluster, fault: list[tuple[str, list[str]]]) -> None:
    # SSH itself stays whole: at 30% loss a handshake under a loaded machine's delays can miss the connect deadline, and
    # h3 is then unreachable (seen in CI: a 3-host test, no loss measured) where the test is about the paths' loss.
    ssh = ["-p", "tcp", "--dport", "22", "-j", "ACCEPT"]
    inject(cluster, fault, "h3", ["iptables", "-w", "5", "-I", "INPUT", "1", *ssh], ["iptables", "-w", "5", "-D", "INPUT", *ssh])
    rule = ["-m", "statistic", "--mode", "random", "--probability", "0.3", "-j", "DROP"]
    inject(cluster, fault, "h3", ["iptables", "-w", "5", "-I", "INPUT", "2", *rule], ["iptables", "-w", "5", "-D", "INPUT", *rule])
    report, elapsed, _ = cluster.check(f"network.master_port={PORT}", playbook="connectivity", timeout=120)
    found = failing(report, "PF612")
    assert len(found) == 1, (found, json.dumps(report["connectivity"])[:3000])
    (finding,) = found
    assert finding["host"] == "h3" and "median of its 6 paths" in finding["message"], finding
    loss = float(finding["message"].split(" loses ")[1].split("%")[0])
    assert 15 <= loss <= 45, finding  # 30% in, with 50 datagrams a path
    assert {p["source"] for p in report["connectivity"]["loss_failed"]} | \
        {p["destination"] for p in report["connectivity"]["loss_failed"]} >= {"h3"}
    assert all("h3" in (p["source"], p["destination"]) for p in report["connectivity"]["loss_failed"])
    # TCP got through: three SYNs in parallel per connect outlast the loss.
    assert not failing(report, "PF609") and not failing(report, "PF610") and not failing(report, "PF611")
    assert elapsed < 45


def test_jumbo_frame_host_behind_a_1500_path_is_an_mtu_blackhole(cluster: Cluster, fault: list[tuple[str, list[str]]]) -> None:
    ifname = cluster.sandbox.host("h4").ifname
    inject(cluster, fault, "h4", ["ip", "link", "set", ifname, "mtu", "9000"], ["ip", "link", "set", ifname, "mtu", "1500"])
    report, elapsed, _ = cluster.check(f"network.master_port={PORT}", playbook="connectivity")
    (finding,) = failing(report, "PF611")
    assert finding["host"] == "h4", finding
    assert "claims MTU 9000, but its path to any of its 3 peers carries at most 1500 B" in finding["message"]
    assert {(p["source"], p["mtu"], p["largest_passed"]) for p in report["connectivity"]["mtu_failed"]} == {("h4", 9000, 1500)}
    assert not failing(report, "PF610") and not failing(report, "PF612")
    assert elapsed < 30


def test_sample_beyond_the_full_mesh_covers_every_host_both_ways() -> None:
    names = [f"h{k}" for k in range(1, 241)]
    plan = plan_mesh(names, ConnectivityConfig(full_mesh_max_hosts=64, sample_peers=16, loss_peers=4), seed=1234)
    assert plan.mode == "sampled"
    assert all(len(set(peers)) == 16 and name not in peers for name, peers in plan.tcp_peers.items())
    assert all(plan.testers_of(name) for name in names)  # every host is a destination
    assert ring_offsets(240) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert plan.loss_peers["h240"] == ["h1", "h2", "h3", "h4"]
    assert plan == plan_mesh(names, ConnectivityConfig(full_mesh_max_hosts=64, sample_peers=16, loss_peers=4), seed=1234)
    small = plan_mesh(names[:3], ConnectivityConfig(), seed=1)
    assert small.mode == "full" and small.tcp_peers["h2"] == ["h1", "h3"] and small.loss_peers["h3"] == ["h1", "h2"]
