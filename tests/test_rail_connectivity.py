"""The connectivity test per rail (#38 item 2) on namespace clusters whose hosts have 2 and 4 rails, one bridge and one
subnet per rail: rail r of every host meets its peers' rail r, and a fault on one host's rail is named as that host and
that rail, and no other host or rail. The judge's rail view is also held on the mesh's outputs alone."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import pytest
from test_cluster import Cluster
from test_connectivity_judge import HOSTS, healthy

from preflight.connectivity.judge import MeshRun, RailEnd, judge_mesh
from preflight.connectivity.plan import plan_mesh
from preflight.connectivity.render import html, text
from preflight.findings import CLUSTER, Status
from preflight.sandbox.layout import rail_ifname
from preflight.spec import ConnectivityConfig

PORT = 29500
MESH_CODES = ("PF609", "PF610", "PF611", "PF612")


# ---------------------------------------------------------------------------------------------------------------------
# the judge alone, on the mesh's outputs


def railed(outputs: dict[str, dict[str, Any]], rails: int) -> dict[str, dict[str, Any]]:
    """The one-network outputs copied onto each of rails rails, as mesh.py prints them for hosts with rails."""
    for out in outputs.values():
        out["listening"] = [{**out["listening"][0], "rail": r} for r in range(rails)]
        for key in ("tcp", "loss", "mtu"):
            out[key] = [{**copy.deepcopy(row), "rail": r} for r in range(rails) for row in out[key]]
    return outputs


def judged(outputs: dict[str, dict[str, Any]], rails: int) -> tuple[list[Any], Any]:
    ends = {h: {r: RailEnd(f"rail {r} (eth{r + 1})", f"eth{r + 1}", 1500) for r in range(rails)} for h in HOSTS}
    run = MeshRun(plan=plan_mesh(HOSTS, ConnectivityConfig(), seed=1), master="h1", port=PORT, mtu={h: 1500 for h in HOSTS},
                  outputs=outputs, problems={}, elapsed_s=2.0, rails=ends)  # type: ignore[arg-type]
    return judge_mesh(run, ConnectivityConfig())


def test_each_rail_is_judged_alone_and_a_fault_names_its_host_and_rail() -> None:
    findings, section = judged(railed({h: healthy(h) for h in HOSTS}, 2), 2)
    assert not [f for f in findings if f.status != Status.passed] and section["status"] == "pass"
    assert (section["tcp_tested"], section["mtu_tested"], section["loss_tested"]) == (4 + 2 * 12, 2 * 12, 2 * 12)
    assert "and 24 TCP paths open on 2 rails" in section["message"]
    assert [(r["rail"], r["status"], r["tcp_tested"], r["hosts"]) for r in section["rails"]] == \
        [(0, "pass", 12, HOSTS), (1, "pass", 12, HOSTS)]
    assert {f.message for f in findings if f.code == "PF610"} == \
        {f"rail {r}: all 12 TCP paths between hosts open (every pair)" for r in (0, 1)}
    outputs = railed({h: healthy(h) for h in HOSTS}, 2)
    for source in ("h1", "h2", "h4"):  # h3's rail 1 answers no one; its rail 0 does
        next(r for r in outputs[source]["tcp"] if r["peer"] == "h3" and r["rail"] == 1).update(result="filtered", detail="no answer")
    findings, section = judged(outputs, 2)
    ((code, host, message),) = [(f.code, f.host, f.message) for f in findings if f.status == Status.fail]
    assert (code, host) == ("PF610", "h3") and message.startswith("h3 rail 1 (eth2)'s mesh port 40002 answers no host: filtered")
    assert [(p["rail"], p["source"], p["destination"]) for p in section["tcp_failed"]] == [(1, s, "h3") for s in ("h1", "h2", "h4")]
    assert [(r["status"], r["named"], r["tcp_failed"]) for r in section["rails"]] == [("pass", [], 0), ("fail", ["h3"], 3)]


def test_the_rails_are_rendered_in_the_terminal_and_on_the_page() -> None:
    from rich.console import Console

    outputs = railed({h: healthy(h) for h in HOSTS}, 2)
    for source in ("h1", "h3", "h4"):  # h2's rail 1 receives 1400 B at most
        row = next(r for r in outputs[source]["mtu"] if r["peer"] == "h2" and r["rail"] == 1)
        row.update(sizes=[*row["sizes"], 1400], passed=[1280, 64, 1400])
    findings, section = judged(outputs, 2)
    ((code, host, message),) = [(f.code, f.host, f.message) for f in findings if f.status == Status.fail]
    assert (code, host) == ("PF611", "h2") and message.startswith("h2 rail 1 (eth2) receives at most 1400 B")
    console = Console(width=200, record=True)
    for part in text(section):
        console.print(part)
    shown = console.export_text()
    assert "connectivity per rail" in shown and "eth2" in shown and "3/12" in shown and "h2" in shown
    page = html(section)
    assert 'class="rails"' in page and "<td>1</td>" in page and "<td>3/12</td>" in page and "<td>h2</td>" in page


# ---------------------------------------------------------------------------------------------------------------------
# namespace clusters


@pytest.fixture(scope="module")
def two_rails(sandbox_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    return Cluster(sandbox_factory(4, rails=2), tmp_path_factory.mktemp("railmesh2"), "railmesh2")


@pytest.fixture(scope="module")
def four_rails(sandbox_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    return Cluster(sandbox_factory(4, rails=4), tmp_path_factory.mktemp("railmesh4"), "railmesh4")


def not_passed(report: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(f["code"], f["host"], f["message"]) for f in report["findings"] if f["status"] != "pass"}


def assert_every_rail_passes(cluster: Cluster, rails: int) -> dict[str, Any]:
    report, elapsed, _ = cluster.check(f"network.master_port={PORT}", playbook="connectivity")
    section = report["connectivity"]
    assert report["exit_code"] == 0 and not_passed(report) == set(), not_passed(report)
    hosts = [h.name for h in cluster.sandbox.hosts]
    pairs = len(hosts) * (len(hosts) - 1)
    assert section["status"] == "pass" and section["hosts"] == hosts
    assert [(r["rail"], r["interfaces"], r["hosts"], r["status"]) for r in section["rails"]] == \
        [(r, [rail_ifname(r)], hosts, "pass") for r in range(rails)]
    assert all((r["tcp_tested"], r["mtu_tested"], r["loss_tested"]) == (pairs, pairs, pairs) for r in section["rails"])
    assert section["tcp_tested"] == len(hosts) + rails * pairs  # the registrations at the rendezvous port, every rail's pairs
    passed = {f["message"] for f in report["findings"] if f["code"] == "PF610"}
    assert passed == {f"rail {r}: all {pairs} TCP paths between hosts open (every pair)" for r in range(rails)}
    print(f"\nhealthy connectivity test of {len(hosts)} hosts x {rails} rails: {elapsed:.1f} s wall, the stage "
          f"{section['elapsed_s']:.1f} s")
    cluster.assert_nothing_left()
    return report


@pytest.mark.sandbox
def test_hosts_with_two_rails_pass_every_rail(two_rails: Cluster) -> None:
    assert_every_rail_passes(two_rails, 2)


@pytest.mark.sandbox
def test_hosts_with_four_rails_pass_every_rail(four_rails: Cluster) -> None:
    assert_every_rail_passes(four_rails, 4)


@contextlib.contextmanager
def on_host(cluster: Cluster, host: str, argv: list[str], undo: list[str]) -> Iterator[None]:
    cluster.sandbox.run_in(host, argv).check_returncode()
    try:
        yield
    finally:
        cluster.sandbox.run_in(host, undo).check_returncode()
        cluster.assert_nothing_left()


def assert_named_alone(report: dict[str, Any], code: str, host: str, rail: int) -> dict[str, Any]:
    """One failed finding, code on host, naming the host's rail; every other rail passes, and no other host fails."""
    failed = [f for f in report["findings"] if f["status"] != "pass"]
    assert [(f["code"], f["host"]) for f in failed] == [(code, host)], failed
    assert failed[0]["message"].startswith(f"{host} rail {rail} ({rail_ifname(rail)})"), failed[0]
    assert [(r["rail"], r["status"], r["named"]) for r in report["connectivity"]["rails"]] == \
        [(r, "fail", [host]) if r == rail else (r, "pass", []) for r in range(len(report["connectivity"]["rails"]))]
    assert report["exit_code"] == 1
    return failed[0]


@pytest.mark.sandbox
def test_a_rail_dropping_new_tcp_is_named_as_its_host_and_rail(two_rails: Cluster) -> None:
    """h3's rail 1 admits nothing new over TCP on the ephemeral range, where gloo and NCCL listen; its rail 0 does."""
    rule = ["-i", rail_ifname(1), "-p", "tcp", "--syn", "--dport", "32768:60999", "-j", "DROP"]
    with on_host(two_rails, "h3", ["iptables", "-w", "5", "-I", "INPUT", *rule], ["iptables", "-w", "5", "-D", "INPUT", *rule]):
        report, elapsed, _ = two_rails.check(f"network.master_port={PORT}", playbook="connectivity")
    finding = assert_named_alone(report, "PF610", "h3", 1)
    assert "answers no host: filtered from h1, h2, h4" in finding["message"]
    assert {(p["rail"], p["source"], p["destination"], p["result"]) for p in report["connectivity"]["tcp_failed"]} == \
        {(1, s, "h3", "filtered") for s in ("h1", "h2", "h4")}
    # The connects' deadline bounds it: seconds, as on one rail.
    assert elapsed < 30


@pytest.mark.sandbox
def test_a_rail_with_a_smaller_mtu_is_named_as_its_host_and_rail(four_rails: Cluster) -> None:
    """h2's rail 1 at MTU 1400 while its rail peers (and the bridge) carry 1500: datagrams of 1500 B to it get no answer."""
    ifname = rail_ifname(1)
    with on_host(four_rails, "h2", ["ip", "link", "set", ifname, "mtu", "1400"], ["ip", "link", "set", ifname, "mtu", "1500"]):
        report, elapsed, _ = four_rails.check(f"network.master_port={PORT}", playbook="connectivity")
    finding = assert_named_alone(report, "PF611", "h2", 1)
    # A veth takes 4 B past its MTU (room for a VLAN tag, the kernel's is_skb_forwardable): the search finds 1404.
    assert finding["message"].startswith("h2 rail 1 (eth2) receives at most 1404 B: do-not-fragment datagrams of 1500 B from h1, h3, h4")
    assert "its own interface's MTU is 1400" in finding["message"]
    assert {(p["rail"], p["source"], p["destination"], p["mtu"], p["largest_passed"]) for p in report["connectivity"]["mtu_failed"]} == \
        {(1, s, "h2", 1500, 1404) for s in ("h1", "h3", "h4")}
    assert elapsed < 30


def test_a_cluster_without_rails_has_no_rails_in_its_section() -> None:
    findings, section = judge_mesh(MeshRun(plan=plan_mesh(HOSTS, ConnectivityConfig(), seed=1), master="h1", port=PORT,
                                           mtu={h: 1500 for h in HOSTS}, outputs={h: healthy(h) for h in HOSTS},  # type: ignore[misc]
                                           problems={}, elapsed_s=1.0), ConnectivityConfig())
    assert "rails" not in section and all("rail" not in f.message for f in findings)
    assert all(f.host == CLUSTER for f in findings)
