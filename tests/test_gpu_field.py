"""The field corpus of tests/data/gpu-node (issue #28): every file added for it parsed by the probe's readers or the
collective's and DCGM's parsers, and judged by the checks, each asserted on its own; the defects the corpus showed
(2-11) each have a test here that failed before its fix.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from recorded import DATA, h100_facts, variant
from test_checks import by_code, check_one, config, status_of

from preflight import bundle
from preflight.checks import run_checks
from preflight.checks.topology import gpu_nic_affinity
from preflight.checks.xid import XID_CATALOGUE
from preflight.collective.nccl_network import judge_transport, parse_nccl_info
from preflight.dcgm.judge import diag_tests, judge_host, parse_document
from preflight.diagnose import diagnose_file
from preflight.findings import CLUSTER, Finding, Status
from preflight.records import HostRecord
from preflight.transport import CommandResult

probe = bundle.load(bundle.FACTS)  # the facts probe as hosts get it, loaded as a module

NODE = DATA / "gpu-node"


def events(name: str) -> list[dict[str, Any]]:
    found, _ = probe.xid_events((NODE / "kernel" / name).read_text().splitlines(), None, time.time())
    return found


def with_events(found: list[dict[str, Any]], switches: int = 0) -> dict[str, Any]:
    def change(facts: dict[str, Any]) -> None:
        facts["kernel_log"].update(source="journal", error=None, events=copy.deepcopy(found))
        facts["fabric"]["nvswitch_count"] = switches
    return variant(change)


# ---------------------------------------------------------------------------------------------------------------------
# Kernel logs (defects 2 and 8)


def test_fatal_sxid_over_three_lines_fails() -> None:
    found = events("sxid-20034-multiline-xid-79-gpud-readme.log")
    sxids = {e["pci"]: e for e in found if e["kind"] == "SXid"}
    # The "Severity 1 Engine instance" and "Data {...}" lines are part of the fatal headline's event, not its message.
    assert {pci: (e["count"], e["fatal"], e["message"]) for pci, e in sxids.items()} == {
        "0000:06:00.0": (1, True, "Fatal, Link 48 LTSSM Fault Up"),
        "0000:05:00.0": (2, True, "Fatal, Link 62 LTSSM Fault Up"),
        "0000:07:00.0": (1, True, "Fatal, Link 37 LTSSM Fault Up")}
    findings = check_one(with_events(found, switches=4))
    assert [f.status for f in by_code(findings, "PF802")] == [Status.fail] * 3
    (xid,) = by_code(findings, "PF801")
    assert xid.status == Status.fail and "Xid 79 (GPU has fallen off the bus" in xid.message


def test_a_detail_line_last_no_longer_hides_the_fatal_sxid() -> None:
    lines = (NODE / "kernel" / "sxid-20034-multiline-xid-79-gpud-readme.log").read_text().splitlines()
    # nvswitch0's event ends on its "Severity 1 Engine instance 62" line: the old reader kept that as the message.
    (event,) = [e for e in probe.xid_events(lines, None, time.time())[0] if e["pci"] == "0000:05:00.0"]
    (finding,) = [f for f in by_code(check_one(with_events([event], switches=4)), "PF802")]
    assert finding.status == Status.fail and "LTSSM Fault Up" in finding.message


def test_nvlink5_xids_144_to_150_follow_their_own_severity() -> None:
    found = {(e["pci"], e["code"]): e for e in events("xid-144-150-nvlink5-gpud-pr-1160.log")}
    assert {k: e["fatal"] for k, e in found.items()} == {
        ("0000:01:00", 144): False, ("0000:04:00", 145): True, ("0000:00:00", 149): True, ("0018:01:00", 149): False,
        ("0000:04:00", 150): True}
    findings = by_code(check_one(with_events(list(found.values()))), "PF801")
    assert [(f.message.split(" (")[0], f.status) for f in findings] == [
        ("0000:00:00: Xid 149", Status.fail), ("0000:01:00: Xid 144", Status.warn), ("0000:04:00: Xid 145", Status.fail),
        ("0000:04:00: Xid 150", Status.fail), ("0018:01:00: Xid 149", Status.warn)]
    assert all("NVLink5" in f.message for f in findings)


def test_xid_45_after_nvlink5_errors_names_the_follower() -> None:
    found = events("xid-45-after-145-149-open-gpu-kernel-modules-1150.log")
    assert sorted((e["pci"], e["count"]) for e in found) == [("0000:97:00", 1), ("0000:ba:00", 2), ("0000:dc:00", 2),
                                                              ("0000:ed:00", 2)]
    findings = by_code(check_one(with_events(found)), "PF801")
    assert {f.status for f in findings} == {Status.warn} and all("a follower, not a cause" in f.message for f in findings)


def test_the_old_xid_form_without_pci_is_read() -> None:
    (event,) = events("xid-old-form-no-pci-gpud-kmsg.log")
    assert (event["kind"], event["pci"], event["code"], event["message"]) == ("Xid", "0000:03:00", 14, "Channel 00000001")


def test_r570_fallen_off_the_bus_without_an_xid_line_is_xid_79() -> None:
    (event,) = events("fallen-off-bus-r570-nvsentinel-155.log")
    assert (event["pci"], event["code"], event["count"]) == ("0000:b3:00", 79, 1)
    (finding,) = by_code(check_one(with_events([event])), "PF801")
    assert finding.status == Status.fail and finding.message.startswith("0000:b3:00: Xid 79 (GPU has fallen off the bus")


def test_a_gpu_named_lines_before_is_not_the_one_that_fell_off() -> None:
    header, *rest = (NODE / "kernel" / "fallen-off-bus-r570-nvsentinel-155.log").read_text().splitlines()
    unrelated = ["[ 1843.40] NVRM: loading NVIDIA UNIX Open Kernel Module"] * 3  # ours: three NVRM lines between
    found, _ = probe.xid_events([header, *unrelated, *rest], None, time.time())
    assert found == []


def test_xid_46_is_in_the_catalogue() -> None:
    # NVIDIA's catalogue (and leptonai/gpud's catalog_generated.go): 46 "GPU stopped processing", RESET_GPU.
    assert XID_CATALOGUE[46].fatal


# ---------------------------------------------------------------------------------------------------------------------
# diagnose on kernel logs (item 5)


@pytest.mark.parametrize("name, code, severity", [
    ("sxid-20034-multiline-xid-79-gpud-readme.log", "PF802", "SXid 20034 on 0000:05:00.0 (2x): fatal"),
    ("sxid-20034-multiline-xid-79-gpud-readme.log", "PF801", "Xid 79 on 0000:91:00 (1x): fatal"),
    ("xid-144-150-nvlink5-gpud-pr-1160.log", "PF801", "Xid 144 on 0000:01:00 (1x): not fatal"),
    ("xid-144-150-nvlink5-gpud-pr-1160.log", "PF801", "Xid 150 on 0000:04:00 (1x): fatal"),
    ("fallen-off-bus-r570-nvsentinel-155.log", "PF801", "Xid 79 on 0000:b3:00 (1x): fatal"),
    ("sxid.log", "PF802", "SXid 12028 on 0000:05:00.0 (1x): not fatal"),
])
def test_diagnose_names_kernel_events_with_severity_and_action(name: str, code: str, severity: str) -> None:
    result = diagnose_file(str(NODE / "kernel" / name))
    (diagnosis,) = [d for d in result.diagnoses if d.code == code]
    (said,) = [e for e in diagnosis.details["event"] if e.startswith(severity)]
    assert "drain" in said or "watch" in said
    assert result.exit_code == 1 and code in result.render()


def test_diagnose_reads_the_kernel_log_among_a_folder_of_logs(tmp_path: Path) -> None:
    from preflight.diagnose import diagnose_folder

    shutil.copy(NODE / "kernel" / "sxid.log", tmp_path / "node07-dmesg.log")
    shutil.copy(NODE / "nccl" / "net-socket-nccl-issue-1053.log", tmp_path / "rank0.log")
    result = diagnose_folder(tmp_path)
    (sxids,) = [d for d in result.diagnoses if d.code == "PF802"]
    assert [(e.source, e.line) for e in sxids.excerpts] == [("node07-dmesg.log", 1), ("node07-dmesg.log", 2)]
    assert sxids.tier == "hardware" and sxids.details["event"][0].startswith("SXid 20034 on 0000:00:00.0 (1x): fatal")


# ---------------------------------------------------------------------------------------------------------------------
# nvidia-smi (defect 7 and the NVLink error counters on the nvidia-smi path)


def smi(name: str) -> str:
    return (NODE / "smi" / name).read_text()


def with_links(text: str, names: str | None = None, switches: int = 0, errors: str | None = None) -> dict[str, Any]:
    links = probe.parse_nvlink_status(text)
    counted = probe.parse_nvlink_errors(errors) if errors else {}

    def change(facts: dict[str, Any]) -> None:
        facts["fabric"]["nvlinks"] = [{**link, "gpu": gpu, "errors": counted.get(gpu, {}).get(link["link"])}
                                      for gpu, mine in links.items() for link in mine]
        facts["fabric"]["nvlink_all_down"] = probe.nvlink_all_inactive(text)
        facts["fabric"]["nvswitch_count"] = switches
        if names is not None:
            base = facts["gpu"]["devices"][0]
            facts["gpu"]["devices"] = [{**base, "index": gpu, "name": names} for gpu in sorted(links)]
    return variant(change)


def test_a_gpu_stuck_registering_with_the_fabric_fails() -> None:
    (block,) = probe.parse_smi_fabric(smi("fabric-in-progress-gpu-operator-issue-2511.txt"))
    assert block == {"pci": None, "state": "in_progress", "status": None, "clique_id": None, "cluster_uuid": None,
                     "health_summary": None}

    def nvswitch_host(facts: dict[str, Any]) -> None:
        facts["fabric"].update(nvswitch_count=4, fabric_manager={"installed": True, "running": True}, gpus=[{**block, "index": 0}])
    (finding,) = by_code(check_one(variant(nvswitch_host)), "PF811")
    assert finding.status == Status.fail and finding.message.startswith("GPU 0 fabric state in_progress")


def test_a_gpu_with_every_link_inactive_is_not_a_pcie_card() -> None:
    text = smi("nvlink-s-all-links-inactive-built-open-gpu-kernel-modules-1150.txt")
    assert probe.parse_nvlink_status(text) == {0: []} and probe.nvlink_all_inactive(text) == [0]
    (finding,) = by_code(check_one(with_links(text, switches=4)), "PF813")
    assert finding.status == Status.fail and finding.message.startswith("NVLink down on every link of GPU 0 while 4 NVSwitches")
    (alone,) = by_code(check_one(with_links(text)), "PF813")  # the recorded host has one GPU: nothing to link to
    assert alone.status == Status.passed and alone.message == "one GPU and no NVSwitch: no NVLink to bring up"
    two = text + text.replace("GPU 0:", "GPU 1:")
    (unbridged,) = by_code(check_one(with_links(two, names="NVIDIA H100 80GB HBM3")), "PF813")
    assert unbridged.status == Status.warn and unbridged.message.startswith("GPUs 0, 1 have NVLink but no link is up")


def test_nvml_answering_every_link_disabled_is_all_links_down() -> None:
    from test_probe import _nvml_from_the_h100_recording

    nvml = _nvml_from_the_h100_recording(missing="nvmlSystemGetProcessName")
    nvml.nvmlDeviceGetNvLinkState = lambda handle, link: nvml.NVML_FEATURE_DISABLED  # every link answers, none is up
    nvml.nvmlDeviceGetNvLinkErrorCounter = lambda handle, link, counter: 0
    fabric: dict[str, Any] = {"gpus": [], "nvlinks": [], "nvlink_all_down": []}
    probe.nvml_info(nvml, fabric)
    assert len(fabric["nvlinks"]) == probe.NVLINK_MAX_LINKS and fabric["nvlink_all_down"] == [0]


def test_h100_nvl_links_unwired_by_design_pass_and_a_lost_one_fails() -> None:
    text = smi("nvlink-s-h100-nvl-12-of-18-built-azurehpc-health-checks-162.txt")
    (finding,) = by_code(check_one(with_links(text, names="NVIDIA H100 NVL")), "PF813")
    assert finding.status == Status.passed
    assert finding.message == "24 NVLinks up on 2 GPUs (12 unwired by design on PCIe-form cards), no errors counted"
    second = "GPU 1: NVIDIA H100 NVL (UUID: GPU-built-1)\n\t Link 0: "
    lost = text.replace(second + "26.562 GB/s", second + "<inactive>")
    (broken,) = by_code(check_one(with_links(lost, names="NVIDIA H100 NVL")), "PF813")
    assert broken.status == Status.fail and broken.message.startswith("NVLink down: GPU 1 links 0,4,5,10,11,16,17")


def test_v100_sxm_with_two_links_inactive_fails() -> None:
    text = smi("nvlink-s-v100-two-links-inactive-azhpc-diagnostics-73.txt")
    assert [link["active"] for link in probe.parse_nvlink_status(text)[3]] == [True, True, True, False, True, False]
    (finding,) = by_code(check_one(with_links(text, names="Tesla V100-SXM2-32GB")), "PF813")
    assert finding.status == Status.fail and finding.message == "NVLink down: GPU 3 links 3,5"


def test_nvlink_error_counters_from_nvidia_smi() -> None:
    errors = smi("nvlink-e-h100-ml-engineering.txt")
    counted = probe.parse_nvlink_errors(errors)
    assert counted[0][0] == {"replay": 0, "recovery": 0, "crc_flit": 0} and sorted(counted[0]) == [0, 1, 17]
    status = (NODE / "nvidia-smi-nvlink-s-a100.txt").read_text()
    (clean,) = by_code(check_one(with_links(status, errors=errors)), "PF813")
    assert clean.status == Status.passed
    grown = errors.replace("Link 1: CRC Errors: 0", "Link 1: CRC Errors: 65535")
    findings = by_code(check_one(with_links(status, errors=grown)), "PF813")
    assert [(f.status, f.message) for f in findings] == [(Status.warn, "NVLink error counters: GPU 0 link 1 crc_flit=65535")]


@pytest.mark.parametrize("name, manager, driver", [
    ("fm-driver-mismatch-gpu-operator-issue-544.txt", "530.30.02", "530.41.03"),
    ("fm-driver-mismatch-gpu-driver-container-issue-735.txt", "590.48.01", "580.126.09"),
])
def test_fabric_manager_of_another_version_than_the_driver_fails(name: str, manager: str, driver: str) -> None:
    text = (NODE / "fabric-manager" / name).read_text()
    assert probe.parse_fabric_manager_version(text) == manager

    def nvswitch_host(facts: dict[str, Any], version: str = manager) -> None:
        facts["fabric"].update(nvswitch_count=4, fabric_manager={"installed": True, "running": False, "version": version})
        facts["gpu"]["driver_version"] = driver
    (finding,) = by_code(check_one(variant(nvswitch_host)), "PF815")
    assert finding.status == Status.fail and finding.message.startswith(f"Fabric Manager {manager} but driver {driver}")
    (same,) = by_code(check_one(variant(lambda f: nvswitch_host(f, driver))), "PF815")
    assert same.status == Status.passed


# ---------------------------------------------------------------------------------------------------------------------
# NCCL INFO logs (defects 3-6)


def nccl(name: str) -> str:
    return (NODE / "nccl" / name).read_text()


def ib_records(tmp_path: Path, hosts: int = 1) -> list[HostRecord]:
    root = Path(tempfile.mkdtemp(dir=tmp_path)) / "sys"
    shutil.copytree(NODE / "sys-class-infiniband-h100", root / "class" / "infiniband")
    ports = probe.infiniband_ports(str(root))
    cfg = config("cluster=prod")
    return [HostRecord(host=host, facts=variant(lambda f: f["net"].update(infiniband=copy.deepcopy(ports))))  # type: ignore[arg-type]
            for host in cfg.cluster.hosts[:hosts]]


def test_gpu_too_far_from_its_nic_overrides_the_hca_and_warns(tmp_path: Path) -> None:
    (rank,) = parse_nccl_info(nccl("built-gdr-hca-enabled-gpu-too-far-nccl-formats.log"), "node01")
    assert (rank["network"], rank["gdr"]) == ("IB", False)
    findings, _ = judge_transport(ib_records(tmp_path), {"node01": nccl("built-gdr-hca-enabled-gpu-too-far-nccl-formats.log")})
    (warned,) = by_code(findings, "PF842")
    assert warned.status == Status.warn and "(GPU Direct RDMA Disabled for GPU 1b000 / HCA 0 (distance 5 > 4))" in warned.message


def test_gdr_disabled_by_distance_in_a_real_log() -> None:
    (rank,) = parse_nccl_info(nccl("gdr-disabled-by-distance-nccl-issue-1657.log"), "leader")
    assert rank["gdr"] is False and rank["reasons"] == ["GPU Direct RDMA Disabled for GPU 42000 / HCA 0 (distance 6 > 4)"]


def test_pxn_channels_and_torchrun_tee_prefixes() -> None:
    ranks = parse_nccl_info(nccl("built-pxn-torchrun-tee-nccl-formats.log"), "node01")
    assert [(r["device"], r["network"], r["gdr"], r["nccl_version"]) for r in ranks] == [
        (0, "IB", True, "2.21.5+cuda12.4"), (1, "IB", True, None)]
    assert ranks[0]["devices"] == ["mlx5_0:1/IB", "mlx5_1:1/IB"] and ranks[0]["channels"] == 16


def test_srun_task_labels_before_torchrun_prefixes() -> None:
    ranks = parse_nccl_info(nccl("built-srun-label-torchrun-tee-nccl-formats.log"), "node02")
    assert [(r["device"], r["network"], r["gdr"]) for r in ranks] == [(3, "IB", True), (2, "IB", True)]


def test_ibext_v8_plugin_channels_get_the_gdr_check(tmp_path: Path) -> None:
    ranks = parse_nccl_info(nccl("net-ibext-v8-channels-nccl-issue-1814.log"), "hostname-test")
    assert len(ranks) == 7 and {(r["network"], r["gdr"]) for r in ranks} == {("IBext_v8", False)}
    findings, _ = judge_transport(ib_records(tmp_path), {"node01": nccl("net-ibext-v8-channels-nccl-issue-1814.log")})
    assert status_of(findings, "PF841") == Status.passed and status_of(findings, "PF842") == Status.warn


def test_open_mpi_tag_output_and_a_plugin_network_with_a_space() -> None:
    ranks = parse_nccl_info(nccl("net-aws-libfabric-mpirun-tag-output-aws-efa-eks.log"), "nccl-tests-efa-worker-0")
    assert [(r["device"], r["network"], r["gdr"]) for r in ranks] == [
        (4, "AWS Libfabric", None), (2, None, None), (6, "AWS Libfabric", True), (4, None, None),
        (1, "AWS Libfabric", True), (6, "AWS Libfabric", True)]


def test_ibext_over_roce_is_infiniband_not_a_fallback(tmp_path: Path) -> None:
    ranks = parse_nccl_info(nccl("net-ibext-roce-nccl-issue-1016.log"), "worker-0")
    assert [(r["device"], r["network"], r["devices"]) for r in ranks] == [
        (0, None, []), (3, "IBext", ["rocep26s0f1v5:1/RoCE"]), (6, "IBext", ["rocep26s0f1v5:1/RoCE"]),
        (4, "IBext", ["rocep26s0f1v5:1/RoCE"])]
    findings, _ = judge_transport(ib_records(tmp_path), {"node01": nccl("net-ibext-roce-nccl-issue-1016.log")})
    (chose,) = by_code(findings, "PF841")
    assert chose.status == Status.passed and chose.message.startswith("NCCL uses NET/IBext")


def test_socket_fallback_with_a_plugin_present_says_why(tmp_path: Path) -> None:
    ranks = parse_nccl_info(nccl("net-ibext-v8-plugin-socket-ib-disabled-vlmevalkit-975.log"), "c")
    assert {r["network"] for r in ranks} == {"Socket"}
    assert ranks[1]["reasons"] == ["NET/IB : No device found.", "NCCL_IB_DISABLE set by environment to 1."]


def test_no_ib_device_although_ib_is_enabled_is_a_reason(tmp_path: Path) -> None:
    (rank,) = parse_nccl_info(nccl("net-socket-no-ib-device-pytorch-issue-111424.log"), "node013")
    assert rank["network"] is None
    assert rank["reasons"] == ["NET/IB : No device found.", "NCCL_IB_DISABLE set by environment to 0."]
    findings, _ = judge_transport(ib_records(tmp_path), {"node01": nccl("net-socket-no-ib-device-pytorch-issue-111424.log")})
    (silent,) = by_code(findings, "PF841")
    assert silent.status == Status.warn and silent.message.startswith("NCCL printed no network choice")


def test_roce_over_mlx4_without_channels_keeps_gdr_unknown() -> None:
    (rank,) = parse_nccl_info(nccl("net-ib-mlx4-roce-deit-issue-28.log"), "gpu-dev006")
    assert (rank["network"], rank["devices"], rank["gdr"]) == ("IB", ["mlx4_0:1/RoCE"], None)


def test_gdrdma_channels_of_an_a100_host(tmp_path: Path) -> None:
    ranks = parse_nccl_info(nccl("net-ib-gdrdma-a100-nccl-issue-707.log"), "10-90-43-152")
    assert {(r["network"], r["gdr"]) for r in ranks} == {("IB", True)} and [r["device"] for r in ranks] == [0, 1, 3, 2]
    findings, _ = judge_transport(ib_records(tmp_path), {"node01": nccl("net-ib-gdrdma-a100-nccl-issue-707.log")})
    assert status_of(findings, "PF841") == Status.passed and not by_code(findings, "PF842")


# ---------------------------------------------------------------------------------------------------------------------
# DCGM 4.x (defect 9)


def test_dcgm_4_version_under_metadata() -> None:
    text = (NODE / "dcgm" / "diag-r1-dcgm-4-built-to-schema.json").read_text()
    document = parse_document(text)
    assert document is not None
    tests, version = diag_tests(document)
    assert version == "4.4.1" and [(t["test"], t["gpus"], t["status"]) for t in tests][-1] == ("pcie", "1", "FAIL")
    findings, entry = judge_host("node01", 1, CommandResult(host="node01", reached=True, exit_code=226, stdout=text))
    assert entry["message"] == "dcgmi diag -r 1 (DCGM 4.4.1): 3 pass, 1 fail" and findings[0].status == Status.fail


# ---------------------------------------------------------------------------------------------------------------------
# Topology (defect 10)


def test_acs_is_unknown_when_no_bridge_was_readable() -> None:
    def unprivileged(facts: dict[str, Any]) -> None:
        facts["topology"]["bridges"] = [{"pci": "0000:17:01.0", "config_bytes": 64, "acs_ctl": None},
                                        {"pci": "0000:16:00.0", "config_bytes": 64, "acs_ctl": None}]
    (finding,) = by_code(check_one(variant(unprivileged)), "PF822")
    assert finding.status == Status.unknown and "none of the 2 bridges" in finding.message


def test_numa_node_minus_one_is_not_sys(tmp_path: Path) -> None:
    from lspci_tree import sysfs_from_lspci

    root = sysfs_from_lspci((NODE / "lspci" / "h100-hgx-lspci-vvv-excerpt.txt").read_text(), Path(tempfile.mkdtemp(dir=tmp_path)))
    for numa in root.glob("bus/pci/devices/*/numa_node"):
        numa.write_text("-1\n")  # what a VM's sysfs says
    topology = probe.topology(str(root), str(root / "proc"))
    nic = next(d for d in topology["devices"] if d["kind"] == "nic" and d["root"] == "pci0000:15")
    far = next(d for d in topology["devices"] if d["kind"] == "gpu" and d["root"] != "pci0000:15")
    from preflight.checks.topology import affinity
    assert far["numa_node"] is None and affinity(far, nic) == "unknown"
    assert {how for _, _, how in gpu_nic_affinity(topology)} == {"PIX"}  # the nearest NIC is still known
    lonely = {**topology, "devices": [d for d in topology["devices"] if d["kind"] != "nic" or d["root"] == "pci0000:15"]}
    (finding,) = by_code(check_one(variant(lambda f: f.update(topology=lonely))), "PF821")
    assert finding.status == Status.unknown and "numa_node -1" in finding.message


# ---------------------------------------------------------------------------------------------------------------------
# InfiniBand sysfs: saturated counters (defect 11), firmware and board, hw_counters


def recorded_ports(tmp_path: Path) -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(dir=tmp_path)) / "sys"
    shutil.copytree(NODE / "sys-class-infiniband-h100", root / "class" / "infiniband")
    return probe.infiniband_ports(str(root))


def cluster(ports_per_host: dict[int, list[dict[str, Any]]], previous: dict[str, Any] | None = None) -> list[Finding]:
    cfg = config("cluster=prod", *(f"cluster.hosts.{i}.gpus=1" for i in range(4)))
    records = [HostRecord(host=host, facts=variant(lambda f, i=i: f["net"].update(infiniband=copy.deepcopy(ports_per_host[i]))),
                          clock_offset_s=(0.0, 0.05)) for i, host in enumerate(cfg.cluster.hosts)]
    return run_checks(records, cfg, previous)  # type: ignore[arg-type]


def test_recorded_hca_firmware_board_and_hw_counters(tmp_path: Path) -> None:
    ports = recorded_ports(tmp_path)
    assert {(p["board_id"], p["fw_ver"]) for p in ports} == {("MT_0000000838", "28.41.1000"), ("MT_0000000884", "32.38.3056")}
    assert ports[0]["hw_counters"]["roce_adp_retrans"] == 3 and ports[0]["hw_counters"]["out_of_buffer"] == 0
    (same,) = by_code(cluster({i: ports for i in range(4)}), "PF835")
    assert same.status == Status.passed and same.message == "one firmware per HCA board: MT_0000000838 28.41.1000, MT_0000000884 32.38.3056"
    (counted,) = [f for f in by_code(check_one(variant(lambda f: f["net"].update(infiniband=ports))), "PF836")]
    assert counted.status == Status.warn and counted.message.startswith("RDMA transport error counters: mlx5_0:1 roce_adp_retrans=3")


def test_hca_firmware_drift_on_one_host_is_named(tmp_path: Path) -> None:
    ports = recorded_ports(tmp_path)
    older = copy.deepcopy(ports)
    older[2]["fw_ver"] = "28.39.1002"
    (drift,) = by_code(cluster({0: ports, 1: ports, 2: older, 3: ports}), "PF835")
    assert (drift.status, drift.host) == (Status.warn, CLUSTER)
    assert drift.message.startswith("HCA firmware differs across MT_0000000838 boards: 28.39.1002 on node03:mlx5_4")


def test_the_ports_network_device_counts_its_carrier_downs(tmp_path: Path) -> None:
    root = Path(tempfile.mkdtemp(dir=tmp_path)) / "sys"
    shutil.copytree(NODE / "sys-class-infiniband-h100", root / "class" / "infiniband")
    netdev = root / "class" / "infiniband" / "mlx5_1" / "device" / "net" / "ibp26s0"  # ours: the IPoIB device of port 1
    netdev.mkdir(parents=True)
    (netdev / "dev_port").write_text("0\n")
    (netdev / "carrier_down_count").write_text("302\n")
    ports = {p["device"]: p for p in probe.infiniband_ports(str(root))}
    assert (ports["mlx5_1"]["carrier_down_count"], ports["mlx5_1"]["counters"]["link_downed"]) == (302, 255)
    assert ports["mlx5_0"]["carrier_down_count"] is None


def test_carrier_downs_see_a_flap_that_saturated_link_downed_cannot(tmp_path: Path) -> None:
    ports = recorded_ports(tmp_path)
    assert ports[1]["counters"]["link_downed"] == 255
    before, now = copy.deepcopy(ports), copy.deepcopy(ports)
    assert ports[1]["carrier_down_count"] is None  # the recording has no network device under the HCA
    before[1]["carrier_down_count"] = 301
    now[1]["carrier_down_count"] = 302
    previous = {"node02": variant(lambda f: f["net"].update(infiniband=before))}
    (flap,) = by_code(cluster({i: now for i in range(4)}, previous), "PF833")
    assert flap.status == Status.fail and "mlx5_1:1 carrier_down_count 301 -> 302" in flap.message


def test_facts_of_schema_3_validate() -> None:
    import jsonschema

    from preflight.resources import load_schema

    facts = variant(lambda f: f["probe"].update(schema=probe.SCHEMA_VERSION))
    facts["kernel_log"]["events"] = events("sxid.log")
    facts["fabric"]["nvlink_all_down"] = [0]
    facts["fabric"]["fabric_manager"]["version"] = "550.90.07"
    assert probe.SCHEMA_VERSION == 4
    jsonschema.Draft202012Validator(load_schema("facts")).validate(facts)
    jsonschema.Draft202012Validator(load_schema("facts")).validate(h100_facts())  # schema 2 facts stay valid


# ---------------------------------------------------------------------------------------------------------------------
# The corpus itself


def corpus_files() -> list[str]:
    files = {str(p.relative_to(NODE)) for p in NODE.rglob("*") if p.is_file() and p.name != "README.md"}
    tree = "sys-class-infiniband-h100"
    return sorted({tree if f.startswith(tree + "/") else f for f in files})


def test_every_corpus_file_has_a_source_and_a_test() -> None:
    readme = (NODE / "README.md").read_text().splitlines()
    tests = "".join(p.read_text() for p in Path(__file__).parent.glob("test_*.py"))
    rows = {f: next((line for line in readme if line.startswith(f"| `{f}")), None) for f in corpus_files()}
    assert [f for f, row in rows.items() if row is None] == []  # every file has its row: what it is, its source
    assert [f for f in rows if Path(f).name not in tests] == []  # and a test that reads it by name
    built = [f for f, row in rows.items() if row is not None and "**built" in row]
    assert len(built) == 10 and len(rows) - len(built) >= 40


# ---------------------------------------------------------------------------------------------------------------------
# The lent H100's own NCCL 2.28.9 text (tests/data/h100-lent-2026-11-27, captured, not built)

LENT = DATA / "h100-lent-2026-11-27"


def test_named_hcas_that_fall_back_to_sockets_are_a_fallback_and_the_plugin_search_is_no_reason(tmp_path: Path) -> None:
    """NCCL_IB_HCA named four HCAs on a host with none: "NET/IB : No device found.", "NET/IB : Using [RO]; OOB eth0"
    (an empty device list), "Using network Socket". The plugin search's "NET/Plugin: Could not find: libnccl-net.so" is
    what every host without an external plugin prints, not why NCCL fell back."""
    log = (LENT / "nccl-init-ib-hca-named.log").read_text()
    (rank,) = parse_nccl_info(log, "vm")
    assert (rank["network"], rank["devices"], rank["nccl_version"]) == ("Socket", [], "2.28.9+cuda13.0")
    assert rank["reasons"] == ["NET/IB : No device found.", "Failed to initialize NET plugin IB"]
    findings, _ = judge_transport(ib_records(tmp_path), {"node01": log})
    (fallback,) = by_code(findings, "PF841")
    assert fallback.status == Status.fail and fallback.message.endswith(
        "are ACTIVE: Failed to initialize NET plugin IB; NET/IB : No device found."), fallback.message
    result = diagnose_file(str(LENT / "nccl-init-ib-hca-named.log"))
    assert [d.code for d in result.diagnoses] == ["PF724"] and result.diagnoses[0].details["infiniband"] == ["mlx5_0"]
    # The whole list, as NCCL printed it: the settings reader cut it at the first comma.
    assert "NCCL_IB_HCA=mlx5_0,mlx5_1,mlx5_2,mlx5_3" in result.named["settings"]


def test_older_plugin_search_wordings_are_no_reason() -> None:
    # Each printed from NCCL's own format (tests/data/messages/nccl.yaml) with no plugin installed: 2.19-2.20's dlerror
    # line, 2.22-2.25's "Could not find", 2.24-2.27's symbol search. None says why IB was not used.
    lines = ["NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such file or directory No plugin found "
             "(libnccl-net.so), using internal implementation",
             "NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.",
             "NET/Plugin: Failed to find ncclNetPlugin_v9 symbol.",
             "NET/IB : No device found.", "Using network Socket"]
    (rank,) = parse_nccl_info("\n".join(f"node1:7:7 [0] NCCL INFO {line}" for line in lines), "node1")
    assert rank["reasons"] == ["NET/IB : No device found."]
    # A plugin that loaded and failed is a reason (2.28's wording).
    (rank,) = parse_nccl_info("node1:7:7 [0] NCCL INFO Failed to initialize NET plugin IBext\n"
                              "node1:7:7 [0] NCCL INFO Using network Socket", "node1")
    assert rank["reasons"] == ["Failed to initialize NET plugin IBext"]


@pytest.mark.parametrize("name, codes", [
    ("nccl-init-default.log", []),  # healthy: one rank, sockets on a host with no HCA named or found
    ("nccl-duplicate-gpu.log", ["PF704"]),
    ("nccl-init-ib-hca-named.log", ["PF724"]),
])
def test_diagnose_reads_the_lent_h100s_logs(name: str, codes: list[str]) -> None:
    assert [d.code for d in diagnose_file(str(LENT / name)).diagnoses] == codes
