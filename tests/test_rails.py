"""Multi-rail hosts checked rail by rail (PF306-PF308): the config's rails, each rail tied to its RDMA port, the facts
checks per rail on the real H100 recording, and on namespace clusters whose hosts have 2 and 4 rails, one bridge and
one subnet per rail; on those clusters, the connectivity test per rail (PF609-PF612, rail r to rail r)."""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import ipaddress
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from recorded import DATA, h100_facts
from test_cluster import Cluster, hosts_by_name

from preflight import bundle
from preflight.checks import run_checks
from preflight.cli import main
from preflight.compose import load_spec
from preflight.emit import plan_launch
from preflight.errors import InputError
from preflight.findings import CLUSTER, Finding, Status
from preflight.records import HostRecord, Rail, host_rails, rail_interfaces
from preflight.sandbox import MAX_RAILS, HostQuirks, Sandbox, leftovers
from preflight.sandbox.layout import astray_subnet, rail_ifname, rail_subnet, validate
from preflight.spec import PreflightConfig

probe = bundle.load(bundle.FACTS)  # the facts probe as hosts get it, loaded as a module

RAIL_CODES = ("PF306", "PF307", "PF308")


def config(*overrides: str) -> PreflightConfig:
    return load_spec(["cluster=prod", *(f"cluster.hosts.{i}.gpus=1" for i in range(4)), *overrides]).config


def with_rails(rails: int, *, host: int = 0, changes: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The H100 recording's facts with rail interfaces eth1..ethN added, rail r on 198.18.(10+r).0/24 at host's place;
    changes: per rail, the fields of that interface to set (an operstate, its ipv4), or None for no interface at all."""
    facts = h100_facts()
    for r in range(rails):
        change = (changes or {}).get(r, {})
        if change is None:
            continue
        iface = {"name": f"eth{r + 1}", "operstate": "up", "mtu": 1500, "speed_mbps": 400000, "mac": None,
                 "ipv4": [f"198.18.{10 + r}.{11 + host}/24"], "loopback": False}
        facts["net"]["interfaces"].append({**iface, **change})
    return facts


def judge(facts_per_host: list[dict[str, Any]], *overrides: str) -> list[Finding]:
    cfg = config(*overrides)
    records = [HostRecord(host=h, facts=facts_per_host[i], clock_offset_s=(0.0, 0.05))  # type: ignore[arg-type]
               for i, h in enumerate(cfg.cluster.hosts)]
    return [f for f in run_checks(records, cfg) if f.code in RAIL_CODES]


def failing(findings: list[Finding]) -> set[tuple[str, str, str]]:
    return {(f.code, f.host, f.message) for f in findings if f.status != Status.passed}


# ---------------------------------------------------------------------------------------------------------------------
# the config


def test_rails_from_the_cluster_wide_default_a_host_of_its_own_and_the_one_rail_form() -> None:
    cfg = config("network.interfaces=[eth1,eth2]", "cluster.hosts.3.interfaces=[ens1,ens2]", "cluster.hosts.2.interface=eth0")
    assert [rail_interfaces(h, cfg) for h in cfg.cluster.hosts] == [["eth1", "eth2"]] * 3 + [["ens1", "ens2"]]
    one = config("cluster.hosts.0.interface=ens5")
    assert rail_interfaces(one.cluster.hosts[0], one) == ["ens5"] and rail_interfaces(one.cluster.hosts[1], one) == []


@pytest.mark.parametrize(("overrides", "expected"), [
    (["network.interfaces=[eth1,eth2]", "cluster.hosts.2.interfaces=[eth1]"],
     "cluster.hosts[2].interfaces: node03 has 1 rail where node01 has 2: every host has one interface per rail, in rail order"),
    (["cluster.hosts.0.interfaces=[eth1,eth2]"], "cluster.hosts[1].interfaces: node02 has 0 rails where node01 has 2"),
    (["network.interfaces=[eth1,eth1]"], "network.interfaces: ['eth1', 'eth1'] has non-unique elements"),
    (["network.interfaces=[eth1,auto]"], "network.interfaces[1]: 'auto' is not an interface name (at most 15 characters), not auto"),
    (["cluster.hosts.1.interfaces=[eth1,'e;reboot']"], "cluster.hosts[1].interfaces[1]: 'e;reboot' is not an interface name"),
])
def test_bad_rails_are_refused_before_any_host(overrides: list[str], expected: str) -> None:
    with pytest.raises(InputError) as refused:
        config(*overrides)
    assert expected in str(refused.value) and "\n" not in str(refused.value)


def test_bad_rails_exit_2_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["check", "cluster=prod", "network.interfaces=[eth1,eth2]", "cluster.hosts.3.interfaces=[eth1,eth2,eth3]"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("preflight: error: cluster.hosts[3].interfaces: node04 has 3 rails where node01 has 2")


# ---------------------------------------------------------------------------------------------------------------------
# each rail tied to its RDMA port


def recorded_ports(tmp_path: Path, netdevs: dict[str, str]) -> list[dict[str, Any]]:
    """The recorded H100 /sys/class/infiniband, with gid_attrs/ndevs/0 written for the ports netdevs names (ours: the
    recording has no gid_attrs), read by the probe."""
    root = Path(tempfile.mkdtemp(dir=tmp_path)) / "sys"
    shutil.copytree(DATA / "gpu-node" / "sys-class-infiniband-h100", root / "class" / "infiniband")
    for device, netdev in netdevs.items():
        folder = root / "class" / "infiniband" / device / "ports" / "1" / "gid_attrs" / "ndevs"
        folder.mkdir(parents=True)
        (folder / "0").write_text(netdev + "\n")
    return probe.infiniband_ports(str(root))


def test_the_probe_reads_each_ports_netdev(tmp_path: Path) -> None:
    ports = {p["device"]: p for p in recorded_ports(tmp_path, {"mlx5_0": "eth1", "mlx5_bond_0": "bond0"})}
    assert (ports["mlx5_0"]["netdev"], ports["mlx5_bond_0"]["netdev"], ports["mlx5_1"]["netdev"]) == ("eth1", "bond0", None)
    ipoib = tmp_path / "ipoib"
    shutil.copytree(DATA / "gpu-node" / "sys-class-infiniband-h100", ipoib / "class" / "infiniband")
    (ipoib / "class" / "infiniband" / "mlx5_1" / "device" / "net" / "ibp26s0").mkdir(parents=True)  # ours: IPoIB's device
    assert {p["device"]: p["netdev"] for p in probe.infiniband_ports(str(ipoib))}["mlx5_1"] == "ibp26s0"


def test_rails_are_tied_by_netdev_else_by_the_hca_order(tmp_path: Path) -> None:
    facts = with_rails(4)
    facts["net"]["infiniband"] = recorded_ports(tmp_path, {"mlx5_4": "eth1", "mlx5_0": "eth2"})
    cfg = config("network.interfaces=[eth1,eth2,eth3,eth4]")
    host = cfg.cluster.hosts[0]
    assert host_rails(host, facts, cfg) == [  # type: ignore[arg-type]
        Rail(0, "eth1", "mlx5_4:1", "netdev"), Rail(1, "eth2", "mlx5_0:1", "netdev"),
        Rail(2, "eth3", None, None), Rail(3, "eth4", None, None)]
    # The host's NCCL_IB_HCA in rail order: a port that carries another interface is never taken by its place.
    facts["nccl"]["env"]["NCCL_IB_HCA"] = "=mlx5_0,mlx5_1,mlx5_5:1,mlx5_6"
    assert [(r.hca, r.tied_by) for r in host_rails(host, facts, cfg)] == [  # type: ignore[arg-type]
        ("mlx5_4:1", "netdev"), ("mlx5_0:1", "netdev"), ("mlx5_5:1", "order"), ("mlx5_6:1", "order")]
    cfg = config("network.interfaces=[eth1,eth2,eth3,eth4]", "network.ib_hca=[mlx5_7,mlx5_8,mlx5_9,mlx5_1]")
    assert [r.hca for r in host_rails(cfg.cluster.hosts[0], facts, cfg)] == ["mlx5_4:1", "mlx5_0:1", "mlx5_9:1", "mlx5_1:1"]  # type: ignore[arg-type]
    facts["nccl"]["env"]["NCCL_IB_HCA"] = "^mlx5_bond_0"  # an exclusion says no order
    cfg = config("network.interfaces=[eth1,eth2,eth3,eth4]")
    assert [r.hca for r in host_rails(cfg.cluster.hosts[0], facts, cfg)] == ["mlx5_4:1", "mlx5_0:1", None, None]  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------------------
# the facts checks per rail, on the recording


def test_healthy_rails_pass_and_a_one_rail_cluster_is_not_judged_per_rail() -> None:
    hosts = [with_rails(2, host=i) for i in range(4)]
    findings = judge(hosts, "network.interfaces=[eth1,eth2]")
    assert not failing(findings)
    assert {f.message for f in findings if f.host == CLUSTER} == {"rail 0: 198.18.10.0/24 on all 4 hosts",
                                                                 "rail 1: 198.18.11.0/24 on all 4 hosts"}
    assert "rail 1 (eth2) is up with 198.18.11.13/24, MTU 1500" in {f.message for f in findings if f.host == "node03"}
    assert judge(hosts) == [] and judge(hosts, "cluster.hosts.0.interface=eth1") == []


def test_a_missing_down_or_unaddressed_rail_names_its_host_rail_and_interface() -> None:
    hosts = [with_rails(4, host=i) for i in range(4)]
    hosts[1] = with_rails(4, host=1, changes={1: None})
    hosts[2] = with_rails(4, host=2, changes={3: {"operstate": "down"}})
    hosts[3] = with_rails(4, host=3, changes={2: {"ipv4": []}})
    assert failing(judge(hosts, "network.interfaces=[eth1,eth2,eth3,eth4]")) == {
        ("PF306", "node02", "rail 1 (eth2) does not exist (this host has: eth0, ifb0, ifb1, eth1, eth3, eth4)"),
        ("PF306", "node03", "rail 3 (eth4) is down"),
        ("PF306", "node04", "rail 2 (eth3) has no IPv4 address"),
    }


def test_a_rail_on_another_subnet_fails_that_host_alone() -> None:
    hosts = [with_rails(2, host=i) for i in range(4)]
    hosts[2] = with_rails(2, host=2, changes={1: {"ipv4": ["198.18.10.13/24"]}})  # rail 1 addressed on rail 0's subnet
    assert failing(judge(hosts, "network.interfaces=[eth1,eth2]")) == {
        ("PF307", "node03", "rail 1 (eth2) is on 198.18.10.0/24; the other 3 hosts' rail 1 is on 198.18.11.0/24")}


def test_rail_subnets_without_a_majority_fail_the_cluster() -> None:
    hosts = [with_rails(2, host=i) for i in range(4)]
    for i in (2, 3):
        hosts[i] = with_rails(2, host=i, changes={0: {"ipv4": [f"198.18.20.{11 + i}/24"]}})
    (found,) = [f for f in judge(hosts, "network.interfaces=[eth1,eth2]") if f.status != Status.passed]
    assert (found.code, found.host) == ("PF307", CLUSTER)
    assert found.message == "rail 0 subnets differ: node03 eth1 on 198.18.20.0/24, node04 eth1 on 198.18.20.0/24; 2 hosts on 198.18.10.0/24"


def test_per_host_rail_names_are_compared_by_subnet_not_by_name() -> None:
    hosts = [with_rails(2, host=i) for i in range(4)]
    for iface in hosts[3]["net"]["interfaces"]:
        iface["name"] = {"eth1": "ens1", "eth2": "ens2"}.get(iface["name"], iface["name"])
    findings = judge(hosts, "network.interfaces=[eth1,eth2]", "cluster.hosts.3.interfaces=[ens1,ens2]")
    assert not failing(findings)


def test_a_rails_rdma_port_down_fails_and_a_rail_without_one_warns(tmp_path: Path) -> None:
    ports = recorded_ports(tmp_path, {"mlx5_0": "eth1", "mlx5_1": "eth2"})
    hosts = []
    for i in range(4):
        facts = with_rails(2, host=i)
        facts["net"]["infiniband"] = copy.deepcopy(ports)
        hosts.append(facts)
    findings = judge(hosts, "network.interfaces=[eth1,eth2]")
    assert not failing(findings)
    assert "rail 1 (eth2 / mlx5_1:1) port ACTIVE (400 Gb/sec (4X NDR)), tied by its netdev" in {f.message for f in findings}
    down = next(p for p in hosts[1]["net"]["infiniband"] if p["device"] == "mlx5_1")
    down.update(state="DOWN", phys_state="Polling")
    hosts[2]["net"]["infiniband"] = [p for p in hosts[2]["net"]["infiniband"] if p["device"] != "mlx5_0"]
    assert failing(judge(hosts, "network.interfaces=[eth1,eth2]")) == {
        ("PF308", "node02", "rail 1 (eth2 / mlx5_1:1) port is DOWN (Polling)"),
        ("PF308", "node03", "rail 0 (eth1) has no RDMA port: no port carries eth1"),
    }



def test_emit_launch_leaves_out_the_host_whose_rail_failed() -> None:
    """The recorded 3-host sandbox report, its hosts given two rails and h3's rail 1 addressed on rail 0's subnet, its
    findings judged again by the real checks: launch.exclude_failed leaves h3 out, for PF307."""
    spec = load_spec(["cluster=emit3", "network.interfaces=[eth1,eth2]", "launch.exclude_failed=true"], str(DATA / "emit-conf"))
    report: dict[str, Any] = json.loads((DATA / "sandbox-emit3" / "pass.json").read_text())
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    report["config_digests"], report["created_at"] = spec.group_digests(), (now - dt.timedelta(hours=1)).isoformat(timespec="seconds")
    hosts = {h["name"]: h for h in report["hosts"]}
    for k, name in enumerate(("h1", "h2", "h3"), start=11):
        for r in range(2):
            subnet = 10 if name == "h3" else 10 + r
            rail = {"name": f"eth{r + 1}", "operstate": "up", "mtu": 1500, "speed_mbps": None, "mac": None,
                    "ipv4": [f"198.19.{subnet}.{k + r * 10}/24"], "loopback": False}
            hosts[name]["facts"]["net"]["interfaces"].append(rail)
    records = [HostRecord(host=h, facts=hosts[h.name]["facts"]) for h in spec.config.cluster.hosts]
    report["findings"] = [f.to_json() for f in run_checks(records, spec.config)] + \
        [f for f in report["findings"] if f["code"].startswith("PF6")]
    report["status"] = "fail"
    plan = plan_launch(spec, report, now=now, force=False)
    assert plan.hosts == ["h1", "h2"] and not plan.forced
    assert plan.excluded == {"h3": "PF307 rail 1 (eth2) is on 198.19.10.0/24; the other 2 hosts' rail 1 is on 198.19.11.0/24"}


# ---------------------------------------------------------------------------------------------------------------------
# namespace clusters: one bridge and one subnet per rail, the facts playbook (seconds a check)


@pytest.fixture(scope="module")
def two_rails(sandbox_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    return Cluster(sandbox_factory(3, rails=2), tmp_path_factory.mktemp("rails2"), "rails2")


@pytest.fixture(scope="module")
def four_rails(sandbox_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    return Cluster(sandbox_factory(4, rails=4), tmp_path_factory.mktemp("rails4"), "rails4")


def rail_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["code"] in RAIL_CODES]


def failed_rails(report: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(f["code"], f["host"], f["message"]) for f in rail_findings(report) if f["status"] != "pass"}


def assert_healthy(cluster: Cluster, rails: int) -> None:
    report, _, _ = cluster.check()
    sandbox = cluster.sandbox
    assert report["exit_code"] == 0 and failed_rails(report) == set(), report["findings"]
    passed = {(f["code"], f["host"]) for f in rail_findings(report)}
    assert len([f for f in rail_findings(report) if f["code"] == "PF306"]) == len(sandbox.hosts) * rails
    assert {h.name for h in sandbox.hosts} == {host for code, host in passed if code == "PF306"}
    subnets = {f["message"] for f in rail_findings(report) if f["code"] == "PF307"}
    assert subnets == {f"rail {r}: {rail_subnet(sandbox.index, r)} on all {len(sandbox.hosts)} hosts" for r in range(rails)}


@pytest.mark.sandbox
def test_hosts_with_two_rails_pass_the_facts_playbook(two_rails: Cluster) -> None:
    assert_healthy(two_rails, 2)


@pytest.mark.sandbox
def test_hosts_with_four_rails_pass_the_facts_playbook(four_rails: Cluster) -> None:
    assert_healthy(four_rails, 4)


def assert_only(report: dict[str, Any], culprit: str, expected: set[tuple[str, str, str]]) -> None:
    assert failed_rails(report) == expected
    assert report["exit_code"] == 1
    statuses = {name: host["status"] for name, host in hosts_by_name(report).items()}
    assert statuses.pop(culprit) == "fail" and set(statuses.values()) <= {"pass", "warn"}, report["findings"]


@pytest.mark.sandbox
def test_a_host_missing_a_rail_is_named_and_no_other(four_rails: Cluster) -> None:
    sandbox = four_rails.sandbox
    try:
        sandbox.remove_rail("h3", 1)
        report, _, _ = four_rails.check()
        assert_only(report, "h3", {("PF306", "h3", "rail 1 (eth2) does not exist (this host has: eth0, eth1, eth3, eth4)")})
    finally:
        sandbox.heal("h3")
    assert_healthy(four_rails, 4)


@pytest.mark.sandbox
def test_a_rail_taken_down_is_named_and_no_other(four_rails: Cluster) -> None:
    sandbox = four_rails.sandbox
    try:
        sandbox.rail_down("h4", 3)
        report, _, _ = four_rails.check()
        assert_only(report, "h4", {("PF306", "h4", "rail 3 (eth4) is down")})
    finally:
        sandbox.heal("h4")


@pytest.mark.sandbox
def test_a_rail_on_the_wrong_subnet_is_named_and_no_other(two_rails: Cluster) -> None:
    sandbox = two_rails.sandbox
    try:
        sandbox.misaddress_rail("h2", 1)
        report, _, _ = two_rails.check()
        astray, rail1 = astray_subnet(sandbox.index, 2), rail_subnet(sandbox.index, 1)
        assert_only(report, "h2", {("PF307", "h2", f"rail 1 (eth2) is on {astray}; the other 2 hosts' rail 1 is on {rail1}")})
    finally:
        sandbox.heal("h2")
    assert_healthy(two_rails, 2)


# ---------------------------------------------------------------------------------------------------------------------
# the connectivity test per rail on the same clusters: rail r of every host to its peers' rail r (seconds a check)

MESH_PORT = 29500


def not_passed(report: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(f["code"], f["host"], f["message"]) for f in report["findings"] if f["status"] != "pass"}


def assert_every_rail_passes(cluster: Cluster, rails: int) -> dict[str, Any]:
    report, elapsed, _ = cluster.check(f"network.master_port={MESH_PORT}", playbook="connectivity")
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
def test_hosts_with_two_rails_pass_the_connectivity_test_on_every_rail(two_rails: Cluster) -> None:
    assert_every_rail_passes(two_rails, 2)


@pytest.mark.sandbox
def test_hosts_with_four_rails_pass_the_connectivity_test_on_every_rail(four_rails: Cluster) -> None:
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
        report, elapsed, _ = two_rails.check(f"network.master_port={MESH_PORT}", playbook="connectivity")
    finding = assert_named_alone(report, "PF610", "h3", 1)
    assert "answers no host: filtered from h1, h2" in finding["message"]
    assert {(p["rail"], p["source"], p["destination"], p["result"]) for p in report["connectivity"]["tcp_failed"]} == \
        {(1, s, "h3", "filtered") for s in ("h1", "h2")}
    # The connects' deadline bounds it: seconds, as on one rail.
    assert elapsed < 30


@pytest.mark.sandbox
def test_a_rail_with_a_smaller_mtu_is_named_as_its_host_and_rail(four_rails: Cluster) -> None:
    """h2's rail 1 at MTU 1400 while its rail peers (and the bridge) carry 1500: datagrams of 1500 B to it get no answer."""
    ifname = rail_ifname(1)
    with on_host(four_rails, "h2", ["ip", "link", "set", ifname, "mtu", "1400"], ["ip", "link", "set", ifname, "mtu", "1500"]):
        report, elapsed, _ = four_rails.check(f"network.master_port={MESH_PORT}", playbook="connectivity")
    finding = assert_named_alone(report, "PF611", "h2", 1)
    # A veth takes 4 B past its MTU (room for a VLAN tag, the kernel's is_skb_forwardable): the search finds 1404.
    assert finding["message"].startswith("h2 rail 1 (eth2) receives at most 1404 B: do-not-fragment datagrams of 1500 B from h1, h3, h4")
    assert "its own interface's MTU is 1400" in finding["message"]
    assert {(p["rail"], p["source"], p["destination"], p["mtu"], p["largest_passed"]) for p in report["connectivity"]["mtu_failed"]} == \
        {(1, s, "h2", 1500, 1404) for s in ("h1", "h3", "h4")}
    assert elapsed < 30


@pytest.mark.parametrize(("index", "rails", "quirks", "expected"), [
    (0, 9, {}, "rails must be 0 to 8, not 9"),
    (508, 3, {}, "index must be 0 to 507 with 3 rails (a /24 each, and one spare, after it), not 508"),
    (0, 2, {2: HostQuirks(ifname="eth2")}, "interface name 'eth2' of host 2 is the name of one of its rails"),
])
def test_a_sandbox_s_rails_are_bounded(index: int, rails: int, quirks: dict[int, HostQuirks], expected: str) -> None:
    with pytest.raises(InputError, match=re.escape(expected)):
        validate(2, "pt", index, quirks, "h", rails)
    validate(2, "pt", index - 1 if index else 0, {}, "h", min(rails, MAX_RAILS))


@pytest.mark.sandbox
def test_a_sandbox_with_rails_is_torn_down_whole(sandbox_factory: Any) -> None:
    sandbox: Sandbox = sandbox_factory(2, rails=2)
    prefix = sandbox.prefix
    made = {f"{prefix}-br", f"{prefix}-br0", f"{prefix}-br1", f"{prefix}-h1-v", f"{prefix}-h2-v",
            f"{prefix}-h1r0", f"{prefix}-h1r1", f"{prefix}-h2r0", f"{prefix}-h2r1"}
    assert made <= set(os.listdir("/sys/class/net"))
    lines = sandbox.run_in("h2", ["ip", "-4", "-o", "addr", "show"], timeout=10).stdout.splitlines()
    h2 = sandbox.hosts[1]
    assert {(f[1], f[3]) for f in map(str.split, lines)} == {
        ("lo", "127.0.0.1/8"), ("eth0", f"{h2.address}/24"), *((f"eth{r + 1}", f"{h2.rail_addresses[r]}/24") for r in range(2))}
    assert all(ipaddress.ip_address(h2.rail_addresses[r]) in rail_subnet(sandbox.index, r) for r in range(2))
    sandbox.remove_rail("h1", 0)  # a fault in force at teardown goes too
    sandbox.misaddress_rail("h2", 1)
    removed = sandbox.down()
    assert {f"interface {name}" for name in made - {f"{prefix}-h1r0"}} <= set(removed)
    assert leftovers(prefix) == [] and not made & set(os.listdir("/sys/class/net"))
