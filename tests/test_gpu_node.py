"""The GPU node's checks (PF8xx) on real recordings (tests/data/gpu-node, sources in its README): the probe's readers
of the kernel log, nvidia-smi's fabric and NVLink text, PCI config space and the InfiniBand sysfs tree; the checks on
the real H100 facts changed only in the fields under test, across hosts too; NCCL's INFO lines; dcgmi's documents.
"""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from lspci_tree import sysfs_from_lspci
from recorded import DATA, h100_facts, variant
from test_checks import by_code, check_one, config, status_of

from preflight import bundle
from preflight.checks import run_checks
from preflight.checks.topology import gpu_nic_affinity
from preflight.collective.nccl_network import judge_transport, parse_nccl_info
from preflight.dcgm.judge import diag_tests, judge_host, parse_document
from preflight.findings import CLUSTER, Finding, Status
from preflight.records import HostRecord
from preflight.resources import load_schema
from preflight.transport import CommandResult

probe = bundle.load(bundle.FACTS)  # the facts probe as hosts get it, loaded as a module

NODE = DATA / "gpu-node"


def lines(name: str) -> list[str]:
    return (NODE / name).read_text().splitlines()


# ---------------------------------------------------------------------------------------------------------------------
# The probe's readers, on recordings


def test_xid_119_storm_is_one_event_per_gpu_and_code() -> None:
    (event,), truncated = probe.xid_events(lines("kernel/dmesg-T-xid-119.log"), None, time.time())
    assert not truncated
    assert (event["kind"], event["pci"], event["code"], event["count"]) == ("Xid", "0000:9b:00", 119, 5)
    # dmesg -T prints local time; the first and last of the five lines.
    assert event["first_unix_s"] == time.mktime(time.strptime("Sun Feb 23 16:24:18 2025", "%a %b %d %H:%M:%S %Y"))
    assert event["last_unix_s"] == time.mktime(time.strptime("Sun Feb 23 16:30:13 2025", "%a %b %d %H:%M:%S %Y"))
    assert event["message"].startswith("pid=1240590, name=gpud, Timeout after 6s of waiting for RPC response from GPU4 GSP!")


def test_xid_iso_stamps_and_the_window() -> None:
    recorded = lines("kernel/dmesg-iso-xid-13.log")
    (event, reset), _ = probe.xid_events(recorded, None, time.time())
    assert (event["code"], event["pci"], event["count"]) == (13, "0000:38:00", 16)
    assert (reset["code"], reset["count"]) == (43, 1)  # the application reset that followed the storm
    assert event["first_unix_s"] == pytest.approx(1737434504.283302)
    # Lines stamped before `since` are left out, as the probe's lookback does.
    assert probe.xid_events(recorded, None, time.time(), since_unix_s=1737434505.0) == ([], False)


def test_sxid_lines_and_kmsg_stamps() -> None:
    boot = 1_700_000_000.0
    events, _ = probe.xid_events(lines("kernel/sxid.log"), boot, boot + 200_000_000)
    assert [(e["kind"], e["pci"], e["code"]) for e in events] == [("SXid", "0000:00:00.0", 20034), ("SXid", "0000:05:00.0", 12028)]
    assert events[0]["first_unix_s"] == pytest.approx(boot + 131453.740743)
    assert events[0]["message"] == "Fatal, Link 30 LTSSM Fault Up"
    raw = lines("kernel/kmsg-raw.log")
    assert probe.xid_events(raw, boot, boot + 1e6) == ([], False)
    assert probe.kernel_line_time(raw[0], boot, boot + 1e6) == pytest.approx(boot + 206.764307)


def test_the_event_bound_is_said() -> None:
    line = lines("kernel/dmesg-T-xid-119.log")[2]
    storm = [line.replace(": 119,", f": {code},") for code in range(probe.KERNEL_LOG_MAX_EVENTS + 5)]
    events, truncated = probe.xid_events(storm, None, time.time())
    assert len(events) == probe.KERNEL_LOG_MAX_EVENTS and truncated


def test_smi_fabric_blocks() -> None:
    (healthy,) = probe.parse_smi_fabric((NODE / "smi/fabric-completed-unhealthy.txt").read_text())
    assert healthy == {"pci": None, "state": "completed", "status": "Success", "clique_id": 2,
                       "cluster_uuid": "dc6e40c4-d722-4357-9ba6-5291dd461278", "health_summary": "Unhealthy"}
    (broken,) = probe.parse_smi_fabric((NODE / "smi/fabric-insufficient-resources.txt").read_text())
    assert (broken["state"], broken["status"], broken["clique_id"]) == ("completed", "Insufficient Resources", 0)


def test_nvlink_status() -> None:
    a100 = probe.parse_nvlink_status((NODE / "nvidia-smi-nvlink-s-a100.txt").read_text())
    assert sorted(a100) == list(range(8)) and all(len(links) == 12 for links in a100.values())
    assert a100[0][0] == {"link": 0, "active": True, "speed_gbps": 25.0}
    assert probe.parse_nvlink_status((NODE / "nvidia-smi-nvlink-s-a10.txt").read_text()) == {}  # A10s print nothing


def acs_config(acsctl_line: str) -> bytes:
    """A config space whose only extended capability is ACS with the control bits of an lspci -vvv ACSCtl line."""
    flags = {word[:-1]: word[-1] == "+" for word in acsctl_line.split()[1:]}
    control = sum(1 << bit for bit, name in enumerate(probe.ACS_FLAGS) if flags[name])
    space = bytearray(4096)
    space[0x100:0x104] = (probe.PCI_EXT_CAP_ACS | 1 << 16).to_bytes(4, "little")  # ACS, version 1, last in the list
    space[0x106:0x108] = control.to_bytes(2, "little")
    return bytes(space)


def test_acs_control_from_config_space() -> None:
    enabled, disabled = lines("lspci/acsctl-nccl-issue-304.txt")
    assert probe.pci_acs_control(acs_config(enabled)) == ["SrcValid", "ReqRedir", "CmpltRedir", "UpstreamFwd"]
    assert probe.pci_acs_control(acs_config(disabled)) == []
    assert probe.pci_acs_control(acs_config(enabled)[:256]) is None  # what a user without root reads


def recorded_ib_ports(tmp_path: Path) -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(dir=tmp_path)) / "sys"
    shutil.copytree(NODE / "sys-class-infiniband-h100", root / "class" / "infiniband")
    return probe.infiniband_ports(str(root))


def test_infiniband_sysfs_tree(tmp_path: Path) -> None:
    ports = recorded_ib_ports(tmp_path)
    assert [p["device"] for p in ports] == ["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9", "mlx5_bond_0"]
    one = ports[1]
    assert (one["state"], one["phys_state"], one["rate"], one["link_layer"]) == ("ACTIVE", "LinkUp", "400 Gb/sec (4X NDR)", "InfiniBand")
    assert one["counters"]["link_downed"] == 255 and one["counters"]["port_rcv_errors"] == 14
    assert one["pci"] is None  # the recording has no device link


# ---------------------------------------------------------------------------------------------------------------------
# The checks, on the H100 recording


def with_xids(events_from: str, hours_later: float) -> dict[str, Any]:
    events, _ = probe.xid_events(lines(events_from), None, time.time())

    def change(facts: dict[str, Any]) -> None:
        facts["kernel_log"].update(source="kmsg", error=None, lookback_s=86400.0, events=events)
        facts["probe"]["started_unix_s"] = events[0]["last_unix_s"] + hours_later * 3600
    return variant(change)


def test_xid_119_in_the_window_fails_with_its_action() -> None:
    (finding,) = by_code(check_one(with_xids("kernel/dmesg-T-xid-119.log", 1.0)), "PF801")
    assert finding.status == Status.fail
    assert finding.message.startswith("0000:9b:00: Xid 119 (GSP RPC timeout") and "5 times in the last 2 h" in finding.message
    assert "reset the GPU" in finding.remedy


def test_xid_outside_the_window_passes_and_the_window_is_configurable() -> None:
    assert status_of(check_one(with_xids("kernel/dmesg-T-xid-119.log", 3.0)), "PF801") == Status.passed
    assert status_of(check_one(with_xids("kernel/dmesg-T-xid-119.log", 3.0), "thresholds.xid_window_h=4"), "PF801") == Status.fail


def test_xid_13_is_the_applications_and_names_the_gpu() -> None:
    def on_recorded_gpu(facts: dict[str, Any]) -> None:
        facts["gpu"]["devices"][0]["pci_bus_id"] = "00000000:38:00.0"
    facts = with_xids("kernel/dmesg-iso-xid-13.log", 0.5)
    on_recorded_gpu(facts)
    storm, reset = by_code(check_one(facts), "PF801")
    assert storm.status == Status.warn and storm.message.startswith("GPU 0 (0000:38:00): Xid 13 (graphics engine exception")
    assert "16 times" in storm.message and reset.message.startswith("GPU 0 (0000:38:00): Xid 43 ")


def test_unreadable_kernel_log_is_a_warning_not_a_failure() -> None:
    (finding,) = by_code(check_one(h100_facts()), "PF803")
    assert finding.status == Status.warn and "not in the recording" in finding.message


def with_fabric(block: str, switches: int = 4, running: bool | None = True) -> dict[str, Any]:
    (parsed,) = probe.parse_smi_fabric((NODE / block).read_text())

    def change(facts: dict[str, Any]) -> None:
        facts["fabric"]["gpus"] = [{**parsed, "index": 0, "pci": facts["gpu"]["devices"][0]["pci_bus_id"]}]
        facts["fabric"].update(nvswitch_count=switches, fabric_manager={"installed": running is not None, "running": running})
    return variant(change)


def test_fabric_registration() -> None:
    unhealthy = check_one(with_fabric("smi/fabric-completed-unhealthy.txt"))
    assert status_of(unhealthy, "PF811") == Status.warn and status_of(unhealthy, "PF812") == Status.passed
    (failed,) = by_code(check_one(with_fabric("smi/fabric-insufficient-resources.txt")), "PF811")
    assert failed.status == Status.fail and "completed with Insufficient Resources" in failed.message
    (stopped,) = by_code(check_one(with_fabric("smi/fabric-completed-unhealthy.txt", running=False)), "PF812")
    assert stopped.status == Status.fail and "4 NVSwitches but nvidia-fabricmanager is installed but not running" in stopped.message
    assert not by_code(check_one(h100_facts()), "PF811")  # the PCIe H100: every fabric field N/A


def a100_links(down: tuple[int, int] | None = None) -> Any:
    links = probe.parse_nvlink_status((NODE / "nvidia-smi-nvlink-s-a100.txt").read_text())

    def change(facts: dict[str, Any]) -> None:
        facts["fabric"]["nvlinks"] = [{**link, "gpu": gpu, "errors": None} for gpu, mine in links.items() for link in mine]
        if down is not None:
            next(n for n in facts["fabric"]["nvlinks"] if (n["gpu"], n["link"]) == down)["active"] = False
    return change


def test_nvlink_down_fails_and_all_up_passes() -> None:
    assert by_code(check_one(variant(a100_links())), "PF813")[0].message == "96 NVLinks up on 8 GPUs, no errors counted"
    (down,) = by_code(check_one(variant(a100_links((3, 7)))), "PF813")
    assert down.status == Status.fail and down.message.startswith("NVLink down: GPU 3 link 7")


def check_cluster(changes: dict[int, Any], *overrides: str, previous: dict[str, Any] | None = None) -> list[Finding]:
    cfg = config("cluster=prod", *(f"cluster.hosts.{i}.gpus=1" for i in range(4)), *overrides)
    records = [HostRecord(host=host, facts=variant(changes[i]) if i in changes else h100_facts(), clock_offset_s=(0.0, 0.05))
               for i, host in enumerate(cfg.cluster.hosts)]
    return run_checks(records, cfg, previous)  # type: ignore[arg-type]


def test_the_host_that_lost_a_link_is_the_odd_one_out() -> None:
    findings = check_cluster({0: a100_links(), 1: a100_links(), 2: a100_links((5, 0)), 3: a100_links()})
    (odd,) = by_code(findings, "PF814")
    assert odd.status == Status.fail and "node03 has 95 active NVLinks" in odd.message and "other 3 have 96" in odd.message


def with_ib(tmp_path: Path, change: Any = None) -> Any:
    ports = recorded_ib_ports(tmp_path)

    def apply(facts: dict[str, Any]) -> None:
        facts["net"]["infiniband"] = copy.deepcopy(ports)
        if change is not None:
            change(facts)
    return apply


def test_infiniband_speed_and_counters(tmp_path: Path) -> None:
    findings = check_one(variant(with_ib(tmp_path)))
    (speed,) = by_code(findings, "PF831")
    assert speed.status == Status.passed and "Ethernet 200 Gb/sec, InfiniBand 400 Gb/sec" in speed.message
    (errors,) = by_code(findings, "PF832")
    assert errors.status == Status.warn and "mlx5_1:1 link_downed=255 (saturated) port_rcv_errors=14" in errors.message

    def half_rate(facts: dict[str, Any]) -> None:
        facts["net"]["infiniband"][3]["rate"] = "200 Gb/sec (2X NDR)"
    (slow,) = by_code(check_one(variant(with_ib(tmp_path, half_rate))), "PF831")
    assert slow.status == Status.warn and "mlx5_5:1 200 Gb/sec (2X NDR) (fastest 400 Gb/sec)" in slow.message


def test_a_link_that_went_down_since_the_last_report_is_a_flap(tmp_path: Path) -> None:
    before = variant(with_ib(tmp_path, lambda f: f["net"]["infiniband"][1]["counters"].update(link_downed=254)))
    now = with_ib(tmp_path)
    findings = check_cluster({i: now for i in range(4)}, previous={"node02": before})
    (flap,) = by_code(findings, "PF833")
    assert (flap.status, flap.host) == (Status.fail, "node02") and "mlx5_1:1 link_downed 254 -> 255" in flap.message
    # The recorded mlx5_1 sits at 255, the 8-bit counter's ceiling: "no change" there proves nothing (issue #28, 11).
    steady = check_cluster({i: now for i in range(4)}, previous={"node02": variant(with_ib(tmp_path))})
    (blind,) = by_code(steady, "PF833")
    assert blind.status == Status.unknown and "link_downed is saturated at 255 on mlx5_1:1" in blind.message


def test_a_net_plugin_on_some_hosts_only_fails() -> None:
    plugin = "/usr/lib/x86_64-linux-gnu/libnccl-net.so"
    findings = check_cluster({1: lambda f: f["nccl"].update(net_plugins=[plugin])})
    (mixed,) = by_code(findings, "PF834")
    assert mixed.status == Status.fail and "on 1 hosts (node02) but not on node01, node03, node04" in mixed.message
    everywhere = check_cluster({i: (lambda f: f["nccl"].update(net_plugins=[plugin])) for i in range(4)})
    assert status_of(everywhere, "PF834") == Status.passed


def with_nic(tmp_path: Path, **topology: Any) -> Any:
    """The H100 host given the recorded InfiniBand ports and one NIC beside its GPU on the PCI tree."""
    def change(facts: dict[str, Any]) -> None:
        with_ib(tmp_path)(facts)
        gpu = facts["topology"]["devices"][0]
        gpu.update(root="pci0000:00", path=["0000:00:01.0", "0000:01:00.0", "0000:02:00.0"])
        facts["topology"]["devices"].append({"pci": "0000:04:00.0", "kind": "nic", "name": "mlx5_0", "numa_node": 0,
                                             "root": "pci0000:00", "path": ["0000:00:01.0", "0000:01:00.0", "0000:02:08.0"]})
        facts["topology"].update(topology)
    return change


def test_topology_settings_for_gpudirect(tmp_path: Path) -> None:
    enabled, _ = lines("lspci/acsctl-nccl-issue-304.txt")
    acs = probe.pci_acs_control(acs_config(enabled))
    findings = check_one(variant(with_nic(tmp_path, peermem_loaded=False, numa_balancing=1, nvidia_open_module=False,
                                          iommu={"groups": 40, "cmdline": [], "gpu_domain": "DMA-FQ"},
                                          bridges=[{"pci": "0000:02:08.0", "config_bytes": 4096, "acs_ctl": acs}])))
    assert by_code(findings, "PF821")[0].message == "every GPU has a NIC on its NUMA node: 0000:00:06.0->mlx5_0 PIX"
    assert status_of(findings, "PF822") == Status.warn and "0000:02:08.0" in by_code(findings, "PF822")[0].message
    assert status_of(findings, "PF823") == Status.warn and status_of(findings, "PF824") == Status.warn
    assert status_of(findings, "PF825") == Status.warn
    good = check_one(variant(with_nic(tmp_path, peermem_loaded=True, numa_balancing=0,
                                      iommu={"groups": 40, "cmdline": ["iommu=pt"], "gpu_domain": "identity"},
                                      bridges=[{"pci": "0000:02:08.0", "config_bytes": 4096, "acs_ctl": []}])))
    assert {status_of(good, c) for c in ("PF821", "PF822", "PF823", "PF824", "PF825")} == {Status.passed}


def test_the_host_whose_nic_sits_on_the_other_socket_is_the_odd_one_out(tmp_path: Path) -> None:
    def far(facts: dict[str, Any]) -> None:
        with_nic(tmp_path)(facts)
        facts["topology"]["devices"][1].update(root="pci0000:80", numa_node=1, path=["0000:80:01.0"])
    near = with_nic(tmp_path)
    findings = check_cluster({0: near, 1: near, 2: near, 3: far})
    (odd,) = by_code(findings, "PF826")
    assert odd.status == Status.fail and "node04 has 1 GPUs, 1 RDMA NICs, 0 NVSwitches on NUMA nodes [0, 1], GPU to NIC SYS" in odd.message
    assert [f.host for f in by_code(findings, "PF821") if f.status == Status.warn] == ["node04"]


def test_recorded_h100_passes_every_check_but_the_kernel_log_it_lacks() -> None:
    findings = check_one(h100_facts())
    assert {(f.code, f.status) for f in findings if f.status != Status.passed} == {("PF803", Status.warn)}


# ---------------------------------------------------------------------------------------------------------------------
# NCCL's real transport


def nccl_log(name: str) -> str:
    return (NODE / "nccl" / name).read_text()


def test_nccl_info_lines_say_the_network() -> None:
    (socket,) = parse_nccl_info(nccl_log("net-socket-nccl-issue-1053.log"), "axa")
    assert (socket["network"], socket["gdr"], socket["devices"]) == ("Socket", False, [])
    assert socket["reasons"] == ["NCCL_IB_DISABLE set by environment to 1."]
    ranks = parse_nccl_info(nccl_log("net-ib-gdrdma-aks-rdma-infiniband-pr-36.log"), "leader")
    assert {(r["device"], r["network"], r["gdr"]) for r in ranks} == {(0, "IB", True), (4, "IB", True), (6, "IB", True), (5, "IB", True)}
    (roce,) = parse_nccl_info(nccl_log("net-ib-roce-gdr-disabled-nccl-issue-1537.log"), "hostname1")
    assert (roce["network"], roce["gdr"], roce["devices"]) == ("IB", False, ["mlx5_0:1/RoCE", "mlx5_1:1/RoCE"])
    torchrun_tee = parse_nccl_info(nccl_log("net-socket-nccl-issue-1232.log"), "node0")
    assert {r["network"] for r in torchrun_tee} == {"Socket", None} and any(r["channels"] == 2 for r in torchrun_tee)
    (old,) = [r for r in parse_nccl_info(nccl_log("net-ib-no-plugin-nv-peer-memory-issue-56.log"), "m") if r["device"] == 0]
    assert (old["devices"], old["plugin"], old["nccl_version"]) == (["mlx5_0:1/IB"], None, "2.5.6+cuda10.0")


def ib_records(tmp_path: Path, hosts: int = 2) -> list[HostRecord]:
    cfg = config("cluster=prod")
    return [HostRecord(host=host, facts=variant(with_ib(tmp_path)))  # type: ignore[arg-type]
            for host in cfg.cluster.hosts[:hosts]]


def test_sockets_where_infiniband_is_active_fail_with_nccls_reason(tmp_path: Path) -> None:
    records = ib_records(tmp_path)
    outputs = {"node01": nccl_log("net-ib-gdrdma-aks-rdma-infiniband-pr-36.log"), "node02": nccl_log("net-socket-nccl-issue-1053.log")}
    findings, section = judge_transport(records, outputs)
    (fallback,) = [f for f in by_code(findings, "PF841") if f.status == Status.fail]
    assert fallback.host == "node02" and "NCCL fell back to sockets although mlx5_0:1" in fallback.message
    assert "NCCL_IB_DISABLE set by environment to 1." in fallback.message
    assert [f.message for f in by_code(findings, "PF841") if f.host == "node01"] == ["NCCL uses NET/IB (GPUDirect RDMA on)"]
    (mixed,) = by_code(findings, "PF843")
    assert (mixed.status, mixed.host) == (Status.fail, CLUSTER) and "node01: IB, node02: Socket" in mixed.message
    assert section["expected"] == "IB" and len(section["ranks"]) == 5


def test_infiniband_without_gpudirect_warns(tmp_path: Path) -> None:
    log = nccl_log("net-ib-roce-gdr-disabled-nccl-issue-1537.log")
    findings, _ = judge_transport(ib_records(tmp_path), {"node01": log, "node02": log})
    assert {(f.code, f.status) for f in findings} == {("PF841", Status.passed), ("PF842", Status.warn), ("PF843", Status.passed)}


def test_transport_section_in_a_schema_5_report(tmp_path: Path) -> None:
    _, section = judge_transport(ib_records(tmp_path), {"node01": nccl_log("net-ib-gdrdma-aks-rdma-infiniband-pr-36.log")})
    schema = load_schema("report")
    transport = {"$ref": "#/$defs/TransportSection"}  # the collective section's transport, as the report schema names it
    jsonschema.validate(section, {**transport, "$defs": schema["$defs"]})


# ---------------------------------------------------------------------------------------------------------------------
# DCGM


def reached(stdout: str, code: int) -> CommandResult:
    return CommandResult(host="node01", reached=True, exit_code=code, stdout=stdout)


def test_dcgm_documents() -> None:
    passed = parse_document((NODE / "dcgm/diag-r1-pass-dcgm-3.1.json").read_text())
    assert passed is not None
    tests, version = diag_tests(passed)
    assert version == "3.1.0" and len(tests) == 17 and {t["status"] for t in tests} == {"PASS"}
    (finding,), entry = judge_host("node01", 1, reached((NODE / "dcgm/diag-r1-pass-dcgm-3.1.json").read_text(), 0))
    assert (finding.code, finding.status, finding.message) == ("PF851", Status.passed, "dcgmi diag -r 1 (DCGM 3.1.0): 17 pass")
    findings, entry = judge_host("node01", 1, reached((NODE / "dcgm/diag-r1-persistence-fail.json").read_text(), 226))
    (failed,) = findings
    assert failed.status == Status.fail and failed.message.startswith(
        "DCGM Persistence Mode FAIL on GPU 0,1,2,3: Persistence mode for GPU 1 is currently disabled")
    assert entry["status"] == "fail" and entry["message"] == "dcgmi diag -r 1 (DCGM 1.7): 4 pass, 1 fail, 4 skip"


def test_dcgm_absent_is_not_run_and_a_deadline_is_a_warning() -> None:
    (absent,), entry = judge_host("node01", 1, reached("", 127))
    assert (absent.code, absent.status, entry["status"]) == ("PF852", Status.passed, "not run")
    late = CommandResult(host="node01", reached=False, reason="no answer within 300 s (timed out)")
    (finding,), entry = judge_host("node01", 1, late)
    assert (finding.status, entry["status"]) == (Status.warn, "timed out")


# ---------------------------------------------------------------------------------------------------------------------
# The denylist's NCCL entries


@pytest.mark.parametrize("nccl, variable, source", [
    ("2.19.3", "NCCL_NVLS_ENABLE", "https://github.com/NVIDIA/nccl-tests/issues/216"),
    ("2.19.4", "NCCL_CUMEM_ENABLE", "https://github.com/NVIDIA/nccl/issues/1116"),
    ("2.29.2", None, "https://github.com/pytorch/pytorch/pull/174338"),
])
def test_denylisted_nccl_names_its_source_and_workaround(nccl: str, variable: str | None, source: str) -> None:
    findings = [f for f in by_code(check_one(variant(lambda f: f["torch"].update(nccl_version=nccl)), "pins.nccl="), "PF102")
                if f.status == Status.fail]
    assert findings and any(source in f.message for f in findings)
    if variable is not None:
        assert any(variable in f.workaround for f in findings)


def test_golden_topology_per_hardware(tmp_path: Path) -> None:
    golden = "1 GPUs, 1 RDMA NICs, 0 NVSwitches on NUMA nodes [0], GPU to NIC PIX"
    near = variant(with_nic(tmp_path))
    (same,) = by_code(check_one(near, f"+network.golden_topology={{H100 80GB HBM3: '{golden}'}}"), "PF827")
    assert same.status == Status.passed
    near["topology"]["devices"].pop()  # the NIC is gone
    (lost,) = by_code(check_one(near, f"+network.golden_topology={{H100 80GB HBM3: '{golden}'}}"), "PF827")
    assert lost.status == Status.fail and "'1 GPUs, 0 RDMA NICs, 0 NVSwitches on NUMA nodes [0]' is not the golden one" in lost.message
    assert not by_code(check_one(near, f"+network.golden_topology={{A100: '{golden}'}}"), "PF827")  # another model's line


def test_nccl_2_30_lines_of_nvidias_logging_page() -> None:
    ranks = parse_nccl_info(nccl_log("nvidia-docs-logging-2.30.log"), "node-01")
    assert [(r["device"], r["network"]) for r in ranks] == [(3, None), (0, "IB")]
    assert ranks[0]["reasons"] == ["Failed to initialize any NET plugin"]


def test_sxid_fatal_fails_and_non_fatal_warns() -> None:
    # Without the boot time, seconds since boot place no line in time: such events count, whatever the window.
    events, _ = probe.xid_events(lines("kernel/sxid.log"), None, time.time())
    assert {e["last_unix_s"] for e in events} == {None}

    def nvswitch_host(facts: dict[str, Any]) -> None:
        facts["kernel_log"].update(source="journal", error=None, events=events)
        facts["fabric"]["nvswitch_count"] = 4
    findings = by_code(check_one(variant(nvswitch_host)), "PF802")
    assert [(f.status, f.message.split(": SXid")[0]) for f in findings] == [(Status.fail, "NVSwitch 0000:00:00.0"),
                                                                            (Status.warn, "NVSwitch 0000:05:00.0")]


def test_last_facts_come_from_the_newest_kept_report_of_each_host(tmp_path: Path) -> None:
    from preflight.history import history_dir, last_facts

    folder = history_dir(tmp_path)
    folder.mkdir(parents=True)
    older, newer = h100_facts(), variant(lambda f: f["host"].update(kernel="6.8.0-x"))
    for stamp, hosts in (("20261120T100000", [("node01", older), ("node02", older)]), ("20261121T100000", [("node01", newer)])):
        report = {"cluster": "prod", "collective": None, "hosts": [{"name": n, "facts": f} for n, f in hosts]}
        (folder / f"{stamp}-prod.json").write_text(json.dumps(report))
    found = last_facts(tmp_path, "prod")
    assert found["node01"]["host"]["kernel"] == "6.8.0-x" and found["node02"] == older
    assert last_facts(tmp_path, "other") == {}


def test_no_ib_device_is_the_reason_quoted(tmp_path: Path) -> None:
    (rank,) = parse_nccl_info(nccl_log("net-ib-no-device-nccl-issue-1637.log"), "localhost")
    assert (rank["network"], rank["nccl_version"], rank["devices"]) == ("Socket", "2.25.1+cuda12.2", [])
    findings, _ = judge_transport(ib_records(tmp_path, hosts=1), {"node01": nccl_log("net-ib-no-device-nccl-issue-1637.log")})
    (fallback,) = by_code(findings, "PF841")
    assert fallback.status == Status.fail and fallback.message.endswith(": NET/IB : No device found.")


# ---------------------------------------------------------------------------------------------------------------------
# The topology reader on a real 8x H100 HGX host's PCI tree (lspci -vvv excerpt, built into a sysfs tree)

HGX_LSPCI = NODE / "lspci" / "h100-hgx-lspci-vvv-excerpt.txt"


def hgx_topology(tmp_path: Path, text: str | None = None) -> dict[str, Any]:
    root = sysfs_from_lspci(text if text is not None else HGX_LSPCI.read_text(), Path(tempfile.mkdtemp(dir=tmp_path)))
    return probe.topology(str(root), str(root / "proc"))  # no proc files there: those facts are None


def test_topology_reader_on_a_recorded_hgx_h100(tmp_path: Path) -> None:
    topology = hgx_topology(tmp_path)
    kinds = [d["kind"] for d in topology["devices"]]
    assert (kinds.count("gpu"), kinds.count("nvswitch"), kinds.count("nic")) == (8, 4, 12)  # 8 ConnectX-7, 2x2 ConnectX-6 Dx
    gpu = next(d for d in topology["devices"] if d["pci"] == "0000:19:00.0")
    assert (gpu["root"], gpu["path"], gpu["numa_node"]) == ("pci0000:15", ["0000:15:01.0", "0000:16:00.0", "0000:17:01.0"], 0)
    # Every GPU shares a PCIe switch with its own ConnectX-7, as `nvidia-smi topo -m` says PIX on an HGX H100.
    assert {how for _, _, how in gpu_nic_affinity(topology)} == {"PIX"}
    assert all(b["config_bytes"] == 4096 for b in topology["bridges"])
    assert not [b["pci"] for b in topology["bridges"] if b["acs_ctl"] and "ReqRedir" in b["acs_ctl"]]


def test_acs_redirect_on_a_switch_port_above_a_gpu_warns(tmp_path: Path) -> None:
    enabled, _ = lines("lspci/acsctl-nccl-issue-304.txt")
    text = HGX_LSPCI.read_text().splitlines()
    port = text.index(next(line for line in text if line.startswith("17:01.0 ")))
    acs = next(i for i in range(port + 1, len(text)) if "ACSCtl:" in text[i])
    text[acs] = "\t\t" + enabled  # only this bridge's ACS control changed, to the one recorded with redirect on
    topology = hgx_topology(tmp_path, "\n".join(text))
    (finding,) = by_code(check_one(variant(lambda f: f.update(topology=topology))), "PF822")
    assert finding.status == Status.warn and finding.message.endswith("above the GPUs/NICs: 0000:17:01.0")


def test_the_hgx_host_that_lost_a_gpu_is_the_odd_one_out(tmp_path: Path) -> None:
    good = hgx_topology(tmp_path)
    text = HGX_LSPCI.read_text().splitlines()
    gone = text.index(next(line for line in text if line.startswith("bb:00.0 ")))
    lost = hgx_topology(tmp_path, "\n".join(text[:gone] + text[gone + 2:]))  # its header and NUMA line: fallen off the bus
    findings = check_cluster({i: (lambda f, t=lost if i == 1 else good: f.update(topology=copy.deepcopy(t))) for i in range(4)})
    (odd,) = by_code(findings, "PF826")
    assert odd.status == Status.fail and odd.message.startswith("GPU/NIC topology differs: node02 has 7 GPUs, 12 RDMA NICs")
    assert "the other 3 have 8 GPUs, 12 RDMA NICs, 4 NVSwitches on NUMA nodes [0, 1]" in odd.message
