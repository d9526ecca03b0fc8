"""The connectivity judge alone, on the outputs mesh.py prints (their shape as the namespace runs in
tests/test_connectivity.py produce them), changing only the paths under test: who is blamed, and how it is worded."""

from __future__ import annotations

from typing import Any

import pytest

from preflight import bundle
from preflight.connectivity.judge import MeshRun, judge_mesh
from preflight.connectivity.plan import plan_mesh
from preflight.findings import CLUSTER, Status
from preflight.spec import ConnectivityConfig

mesh = bundle.load(bundle.MESH)  # what hosts run

HOSTS = ["h1", "h2", "h3", "h4"]
ADDRESS = {h: f"198.18.0.{10 + i}" for i, h in enumerate(HOSTS)}
PORTS = {h: 40000 + i for i, h in enumerate(HOSTS)}


def healthy(host: str, mtu: int = 1500, hosts: list[str] = HOSTS) -> dict[str, Any]:
    peers = [p for p in hosts if p != host]
    return {"host": host, "address": ADDRESS[host], "serving": {"result": "ok", "detail": ""} if host == "h1" else None,
            "registry": {"result": "ok", "detail": "", "ms": 0.3, "waited_s": 0.0}, "joined": hosts,
            "listening": [{"rail": None, "address": ADDRESS[host], "tcp": PORTS[host], "udp": PORTS[host] + 100}],
            "tcp": [{"peer": p, "rail": None, "address": ADDRESS[p], "port": PORTS[p], "result": "ok", "detail": "", "ms": 0.2}
                    for p in peers],
            "loss": [{"peer": p, "rail": None, "sent": 50, "echoed": 50, "rtt_ms": 0.3} for p in peers],
            "mtu": [{"peer": p, "rail": None, "sizes": mesh.mtu_sizes(mtu), "passed": [s for s in mesh.mtu_sizes(mtu) if s <= 1500],
                     "local_refusals": {}} for p in peers],
            "error": None, "elapsed_s": 1.2}


def judged(outputs: dict[str, dict[str, Any]], problems: dict[str, str] | None = None,
           mtu: dict[str, int] | None = None) -> tuple[list[Any], Any]:
    hosts = sorted({*outputs, *(problems or {})})
    run = MeshRun(plan=plan_mesh(hosts, ConnectivityConfig(), seed=1), master="h1", port=29500, mtu=mtu or {h: 1500 for h in hosts},
                  outputs=outputs, problems=problems or {}, elapsed_s=2.0)  # type: ignore[arg-type]
    return judge_mesh(run, ConnectivityConfig())


def failing(findings: list[Any]) -> list[tuple[str, str, str]]:
    return [(f.code, f.host, f.message) for f in findings if f.status == Status.fail]


def test_healthy_mesh_passes_with_every_count() -> None:
    findings, section = judged({h: healthy(h) for h in HOSTS})
    assert failing(findings) == [] and section["status"] == "pass"
    assert (section["tcp_tested"], section["mtu_tested"], section["loss_tested"]) == (16, 12, 12)
    assert section["loss_max_percent"] == 0.0 and section["rtt_median_ms"] == 0.3


def test_one_broken_link_is_named_as_the_path_not_a_host() -> None:
    outputs = {h: healthy(h) for h in HOSTS}
    outputs["h2"]["tcp"][2].update(result="refused", detail="Connection refused")  # h2 -> h4 only
    findings, section = judged(outputs)
    ((code, host, message),) = failing(findings)
    assert (code, host) == ("PF610", CLUSTER) and message.startswith(f"h2 -> h4:{PORTS['h4']} refused") and "REJECT" in message
    assert "no one host explains it" in message
    assert section["status"] == "fail" and len(section["tcp_failed"]) == 1


def test_a_source_that_reaches_no_one_is_blamed_once() -> None:
    outputs = {h: healthy(h) for h in HOSTS}
    for row in outputs["h3"]["tcp"]:
        row.update(result="no-route", detail="No route to host")
    ((code, host, message),) = failing(judged(outputs)[0])
    assert (code, host) == ("PF610", "h3") and message.startswith("h3 reaches none of its 3 peers over TCP (no-route")


def test_udp_blocked_everywhere_is_a_warning_and_no_mtu_verdict() -> None:
    outputs = {h: healthy(h) for h in HOSTS}
    for out in outputs.values():
        for row in out["loss"]:
            row["echoed"] = 0
        for row in out["mtu"]:
            row["passed"] = []
    findings, section = judged(outputs)
    assert failing(findings) == []
    (warning,) = [f for f in findings if f.status == Status.warn]
    assert warning.code == "PF612" and "UDP is blocked" in warning.message
    assert section["mtu_tested"] == 0 and section["loss_tested"] == 0 and section["status"] == "pass"


def test_a_host_that_could_not_run_it_makes_the_section_unknown() -> None:
    outputs = {h: healthy(h) for h in HOSTS if h != "h4"}
    findings, section = judged(outputs, {"h4": "the mesh test printed no result"})
    assert [(f.code, f.host, f.status) for f in findings if f.status != Status.passed] == [("PF609", "h4", Status.unknown)]
    assert section["status"] == "unknown"


def test_a_rendezvous_port_in_use_leaves_the_verdict_to_the_collective() -> None:
    outputs = {h: healthy(h) for h in HOSTS}
    outputs["h1"]["serving"] = {"result": "in-use", "detail": "Address already in use"}
    findings, section = judged(outputs)
    assert findings == [] and section["status"] == "skipped" and "in use" in section["message"]


def searched(sent: int, carried: int) -> dict[str, list[int]]:
    """An MTU row as mesh.py's search leaves it: sizes tried, the interface's MTU first, and those that passed, on a path
    that carries `carried` bytes."""
    sizes = mesh.mtu_sizes(sent)
    for _ in range(mesh.SEARCH_PHASES):
        rungs = mesh.next_rungs(sizes, {s for s in sizes if s <= carried})
        if not rungs:
            break
        sizes += rungs
    return {"sizes": sizes, "passed": [s for s in sizes if s <= carried]}


def with_mtu(mtus: dict[str, int], carried: dict[tuple[str, str], int] | None = None) -> dict[str, dict[str, Any]]:
    """Every host's output on a bridge where a datagram reaches a peer if it fits the receiver's MTU (or what a path
    carries, where given)."""
    hosts = sorted(mtus)
    outputs = {h: healthy(h, hosts=hosts) for h in hosts}
    for host, out in outputs.items():
        for row in out["mtu"]:
            row.update(searched(mtus[host], min(mtus[row["peer"]], (carried or {}).get((host, row["peer"]), 65535))))
    return outputs


def test_the_search_finds_the_exact_size_a_path_carries() -> None:
    for sent, carried in [(1500, 1400), (1500, 1450), (9000, 1500), (9000, 8950), (9001, 1500), (1500, 1281)]:
        row = searched(sent, carried)
        assert max(row["passed"]) == carried, (sent, carried, row)
        assert len(row["sizes"]) <= len(mesh.mtu_sizes(sent)) + mesh.SEARCH_PHASES * mesh.SEARCH_RUNGS


def test_every_size_a_path_can_carry_is_found_exactly() -> None:
    """Down to the loss datagrams' size, below the ladder's smallest common size (1280): a path that carries 1200, 1000
    or 68 B is measured to the byte, within the phases the stage budgets for."""
    for sent in (1500, 9000):
        for carried in range(64, sent + 1):
            row = searched(sent, carried)
            assert max(row["passed"]) == carried, (sent, carried)
            assert len(row["sizes"]) <= len(mesh.mtu_sizes(sent)) + mesh.SEARCH_PHASES * mesh.SEARCH_RUNGS


def test_a_path_that_drops_all_udp_is_not_searched() -> None:
    """Not even the floor came back: there is no size to search up from, and PF612 says UDP is blocked."""
    assert mesh.next_rungs(mesh.mtu_sizes(1500), set()) == []


@pytest.mark.parametrize("low", [1200, 1000])
def test_a_host_below_every_common_size_is_blamed_like_one_at_1400(low: int) -> None:
    """h3 at MTU 1200 or 1000 on a 1500 bridge: no size of the ladder above the floor reaches it, and it is still
    the one host failed, with the size its path carries."""
    mtus = {"h1": 1500, "h2": 1500, "h3": low, "h4": 1500}
    findings, section = judged(with_mtu(mtus), mtu=mtus)
    ((code, host, message),) = failing(findings)
    assert (code, host) == ("PF611", "h3"), message
    assert message.startswith(f"h3 receives at most {low} B: do-not-fragment datagrams of 1500 B from h1, h2, h4 got no answer")
    assert {(p["source"], p["destination"], p["largest_passed"]) for p in section["mtu_failed"]} == \
        {(h, "h3", low) for h in ("h1", "h2", "h4")}


def test_a_host_with_a_smaller_mtu_is_blamed_and_its_peers_pass() -> None:
    """h3 at MTU 1400 on a 1500 bridge: every path into it fails at 1500 while the others' paths pass."""
    mtus = {"h1": 1500, "h2": 1500, "h3": 1400, "h4": 1500}
    findings, section = judged(with_mtu(mtus), mtu=mtus)
    ((code, host, message),) = failing(findings)
    assert (code, host) == ("PF611", "h3"), message
    assert message.startswith("h3 receives at most 1400 B: do-not-fragment datagrams of 1500 B from h1, h2, h4 got no answer")
    assert "its own interface's MTU is 1400, below its peers' 1500" in message
    assert {(p["source"], p["destination"], p["largest_passed"]) for p in section["mtu_failed"]} == \
        {(h, "h3", 1400) for h in ("h1", "h2", "h4")}


def test_a_jumbo_frame_host_is_blamed_for_what_it_sends() -> None:
    mtus = {"h1": 1500, "h2": 9000, "h3": 1500, "h4": 1500}
    ((code, host, message),) = failing(judged(with_mtu(mtus), mtu=mtus)[0])
    assert (code, host) == ("PF611", "h2")
    assert "h2's interface claims MTU 9000, but its path to any of its 3 peers carries at most 1500 B" in message


def test_an_mtu_blackhole_on_every_path_is_the_fabric() -> None:
    mtus = dict.fromkeys(HOSTS, 9000)
    outputs = with_mtu(mtus, carried={(a, b): 1500 for a in HOSTS for b in HOSTS})
    ((code, host, message),) = failing(judged(outputs, mtu=mtus)[0])
    assert (code, host) == ("PF611", CLUSTER)
    assert message.startswith("every path carries at most 1500 B while the interfaces claim MTU 9000")


def test_two_hosts_with_different_mtus_name_the_path() -> None:
    mtus = {"h1": 1500, "h2": 1400}
    ((code, host, message),) = failing(judged(with_mtu(mtus), mtu=mtus)[0])
    assert (code, host) == ("PF611", CLUSTER) and message.startswith("h1 -> h2 carries at most 1400 B of h1's MTU 1500")


def lossy(outputs: dict[str, dict[str, Any]], losing: set[str], echoed: int = 35) -> dict[str, dict[str, Any]]:
    """Datagrams lost on every path that touches a host of losing (30% in the rule a test injects)."""
    for host, out in outputs.items():
        for row in out["loss"]:
            if {host, row["peer"]} & losing:
                row["echoed"] = echoed
    return outputs


def test_a_lossy_host_is_blamed_alone() -> None:
    ((code, host, message),) = failing(judged(lossy({h: healthy(h) for h in HOSTS}, {"h3"}))[0])
    assert (code, host) == ("PF612", "h3") and message.startswith("h3 loses 30% of packets (median of its 6 paths; others lose 0.0%")


def test_two_lossy_hosts_of_four_are_each_blamed() -> None:
    found = failing(judged(lossy({h: healthy(h) for h in HOSTS}, {"h2", "h4"}))[0])
    assert [(code, host) for code, host, _ in found] == [("PF612", "h2"), ("PF612", "h4")]


def test_loss_between_two_hosts_names_the_path_not_both() -> None:
    pair = ["h1", "h2"]
    ((code, host, message),) = failing(judged(lossy({h: healthy(h, hosts=pair) for h in pair}, {"h2"}))[0])
    assert (code, host) == ("PF612", CLUSTER)
    assert message.startswith("h1 <-> h2 loses 30% (15 of 50), 30% (15 of 50) of packets") and "cannot tell which end" in message


def test_loss_on_every_path_is_one_cluster_finding() -> None:
    ((code, host, message),) = failing(judged(lossy({h: healthy(h) for h in HOSTS}, set(HOSTS)))[0])
    assert (code, host) == ("PF612", CLUSTER) and message.startswith("every path loses packets: 30% (median of 12 paths")


def test_tcp_filtered_everywhere_is_one_cluster_finding() -> None:
    outputs = {h: healthy(h) for h in HOSTS}
    for out in outputs.values():
        for row in out["tcp"]:
            row.update(result="filtered", detail="no answer to a TCP SYN within 3 s")
    ((code, host, message),) = failing(judged(outputs)[0])
    assert (code, host) == ("PF610", CLUSTER) and message.startswith("no TCP path between hosts is open: all 12 failed (filtered")


def test_a_destination_most_testers_miss_is_blamed_not_its_testers() -> None:
    outputs = {h: healthy(h) for h in HOSTS}
    for source in ("h1", "h2"):
        next(r for r in outputs[source]["tcp"] if r["peer"] == "h4").update(result="filtered", detail="no answer")
    ((code, host, message),) = failing(judged(outputs)[0])
    assert (code, host) == ("PF610", "h4")
    assert message.startswith(f"h4's mesh port {PORTS['h4']} does not answer 2 of its 3 testers: filtered from h1, h2")


def test_a_rendezvous_port_most_hosts_miss_is_the_masters() -> None:
    """The master registers at its own port (its rule drops only what comes in on the interface); the others are filtered."""
    outputs = {h: healthy(h) for h in HOSTS}
    for host in ("h2", "h3", "h4"):
        outputs[host]["registry"] = {"result": "filtered", "detail": "no answer to a TCP SYN within 3 s", "ms": None, "waited_s": 3.0}
    ((code, host, message),) = failing(judged(outputs)[0])
    assert (code, host) == ("PF609", "h1")
    assert message.startswith("the rendezvous port h1:29500 is filtered: 3 of the 4 hosts did not get through (h2, h3, h4: no answer")
