"""The probe through the real nvidia-ml-py, against a libnvidia-ml.so.1 compiled here from NVML's own header.

The fake library (tests/fake_nvml/fake_nvml.c) answers from the real H100 recording, changed only in the fields under
test: fabric not started, in progress or failed, ECC off, clocks held down, a row remapping pending, and the rest of
facts schema 3 (PCIe generation, firmware, retired pages, MIG, recovery action). The probe runs as on a host
(`python3 -`, the script on stdin) and its facts are judged by the real checks. A call the probe makes with arguments
nvidia-ml-py does not take, or one the fake does not export, is loud here (gpu.nvml_call_errors). The RDMA NICs' PCIe
link (sysfs, not NVML) is read from the recorded HGX host's PCI tree at the end.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from lspci_tree import sysfs_from_lspci
from nvml_fake import (
    PROBE_SOURCE,
    compile_fake,
    exported,
    fake_nvidia_smi,
    h100_nvml_answers,
    probe_on_a_gpu_host,
    probe_on_the_fake,
    write_answers,
)
from recorded import DATA, H100, h100_facts, variant
from test_checks import by_code, check_cluster, check_one

from preflight import bundle
from preflight.findings import Finding, Status
from preflight.resources import load_schema

probe = bundle.load(bundle.FACTS)  # the facts probe as hosts get it, loaded as a module


@pytest.fixture(scope="session")
def fake_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake libnvidia-ml.so.1, compiled once per session."""
    return compile_fake(tmp_path_factory.mktemp("fake-nvml"))


def probed(library: Path, folder: Path, **changes: str) -> dict[str, Any]:
    """The probe's facts on the fake answering as the recorded H100, with changes (GPU 0's keys, "" removes one)."""
    answers = h100_nvml_answers()
    for key, value in changes.items():
        if value:
            answers[f"0.{key}"] = value
        else:
            answers.pop(f"0.{key}", None)
    facts = probe_on_the_fake(library, write_answers(folder / "nvml-facts.txt", answers))
    jsonschema.Draft202012Validator(load_schema("facts")).validate(facts)
    assert facts["gpu"]["source"] == "nvml" and facts["gpu"]["nvml_call_errors"] == [], facts["gpu"]
    return facts


def with_gpu(facts: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    """A change to the recorded H100's facts: its GPU and fabric sections become the probe's."""
    return lambda recorded: recorded.update(gpu=facts["gpu"], fabric=facts["fabric"])


def judged(facts: dict[str, Any], *overrides: str) -> list[Finding]:
    """The real checks over the recorded H100 whose GPU and fabric sections are the probe's."""
    return check_one(variant(with_gpu(facts)), *overrides)


# ---------------------------------------------------------------------------------------------------------------------
# The fake covers the probe, and the probe calls nvidia-ml-py as it is declared


def probe_nvml_calls() -> set[str]:
    """The pynvml functions the probe calls: nvml.X attributes and ask(nvml, "X", ...) names."""
    tree = ast.parse(PROBE_SOURCE)
    called = {node.attr for node in ast.walk(tree)
              if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "nvml"
              and node.attr.startswith("nvml")}
    called |= {node.args[1].value for node in ast.walk(tree)
               if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "ask"
               and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)}
    return called


def library_functions(pynvml: Any, name: str, seen: set[str]) -> set[str]:
    """The C functions a pynvml function resolves, following the pynvml functions it calls (nvmlInit ->
    nvmlInitWithFlags, nvmlDeviceGetPciInfo -> nvmlDeviceGetPciInfo_v3)."""
    if name in seen or not callable(getattr(pynvml, name, None)):
        return set()
    seen.add(name)
    try:
        source = inspect.getsource(getattr(pynvml, name))
    except (OSError, TypeError):
        return set()
    found = set(re.findall(r'_nvmlGetFunctionPointer\("(\w+)"\)', source))
    for callee in set(re.findall(r"\b(nvml[A-Z]\w*)\(", source)) - {name}:
        found |= library_functions(pynvml, callee, seen)
    return found


def test_the_fake_exports_every_function_the_probe_reaches(fake_library: Path) -> None:
    import pynvml  # nvidia-ml-py, a dependency
    calls = probe_nvml_calls()
    assert {"nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetFieldValues"} <= calls
    needed = set().union(*(library_functions(pynvml, call, set()) for call in calls)) | {"nvmlErrorString"}
    assert "nvmlDeviceGetPciInfo_v3" in needed and "nvmlInitWithFlags" in needed
    assert sorted(needed - exported(fake_library)) == []


def test_the_recorded_h100_through_the_real_nvidia_ml_py(fake_library: Path, tmp_path: Path) -> None:
    facts = probed(fake_library, tmp_path)
    recorded = h100_facts()
    assert facts["gpu"] == recorded["gpu"]
    # The recording's NVML answered Not Supported for fabric and NVLink on this PCIe H100: unknown, not wrong.
    assert facts["fabric"]["gpus"] == recorded["fabric"]["gpus"] and facts["fabric"]["nvlinks"] == []
    assert [(f.code, f.status) for f in judged(facts) if f.status != Status.passed] == [("PF803", Status.warn)]


def test_a_call_with_arguments_nvidia_ml_py_does_not_take_is_said(fake_library: Path, tmp_path: Path) -> None:
    # Defect 1 as it was: the fabric call with the device alone. It must show, not read as "not supported".
    source = PROBE_SOURCE.replace('ask(nvml, "nvmlDeviceGetGpuFabricInfo", handle, ctypes.byref(info))',
                                       'ask(nvml, "nvmlDeviceGetGpuFabricInfo", handle)')
    source = source.replace('getattr(nvml, "c_nvmlGpuFabricInfo_v3_t", None)', "None")
    answers = {**h100_nvml_answers(), "0.fabric": "1 0 0 0"}
    facts = probe_on_the_fake(fake_library, write_answers(tmp_path / "nvml-facts.txt", answers), probe_source=source)
    assert facts["gpu"]["nvml_call_errors"] == ["nvmlDeviceGetGpuFabricInfo: TypeError: nvmlDeviceGetGpuFabricInfo() missing 1 "
                                                "required positional argument: 'gpuFabricInfo'"]


def test_a_call_the_library_lacks_is_said_not_taken_for_unsupported(fake_library: Path, tmp_path: Path) -> None:
    # The probe asks for the fabric through the versioned call first; a library without it (older drivers have
    # only nvmlDeviceGetGpuFabricInfo) must show in the facts, while the first call still answers.
    source = PROBE_SOURCE.replace('"nvmlDeviceGetGpuFabricInfoV"', '"nvmlDeviceGetGpuFabricInfoV_missing"')
    answers = {**h100_nvml_answers(), "0.fabric": "1 0 0 0"}
    facts = probe_on_the_fake(fake_library, write_answers(tmp_path / "nvml-facts.txt", answers), probe_source=source)
    assert facts["gpu"]["nvml_call_errors"] == ["nvmlDeviceGetGpuFabricInfoV_missing: AttributeError: module 'pynvml' has no "
                                                "attribute 'nvmlDeviceGetGpuFabricInfoV_missing'"]
    assert facts["fabric"]["gpus"][0]["state"] == "not_started"


def test_a_function_the_driver_lacks_is_said_and_the_older_call_answers(tmp_path: Path) -> None:
    # A library without nvmlDeviceGetGpuFabricInfoV: pynvml raises NVMLError_FunctionNotFound, which is said, and the
    # probe falls back to nvmlDeviceGetGpuFabricInfo (no health summary there).
    library = compile_fake(tmp_path, "FAKE_NVML_WITHOUT_FABRIC_V")
    assert "nvmlDeviceGetGpuFabricInfoV" not in exported(library) and "nvmlDeviceGetGpuFabricInfo" in exported(library)
    answers = {**h100_nvml_answers(), "0.fabric": "3 0 7 1", "0.fabric_cluster_uuid": CLUSTER_UUID}
    facts = probe_on_the_fake(library, write_answers(tmp_path / "nvml-facts.txt", answers))
    assert facts["gpu"]["nvml_call_errors"] == ["nvmlDeviceGetGpuFabricInfoV: NVMLError_FunctionNotFound: Function Not Found"]
    (gpu,) = facts["fabric"]["gpus"]
    assert (gpu["state"], gpu["status"], gpu["clique_id"], gpu["health_summary"]) == ("completed", "success", 7, None)


def test_nvlink_state_and_error_counters_reach_pf813(fake_library: Path, tmp_path: Path) -> None:
    # Four links, link 2 down, link 1 counting CRC flit errors (the counters in NVML's order: replay, recovery,
    # crc_flit, crc_data).
    facts = probed(fake_library, tmp_path, nvlinks="1 1 0 1", **{"nvlink1.errors": "0 0 12 0"},
                   **{f"nvlink{n}.errors": "0 0 0 0" for n in (0, 2, 3)})
    links = facts["fabric"]["nvlinks"]
    assert [(link["link"], link["active"]) for link in links] == [(0, True), (1, True), (2, False), (3, True)]
    assert links[1]["errors"] == {"replay": 0, "recovery": 0, "crc_flit": 12, "crc_data": 0}
    statuses = {(f.status, f.message) for f in by_code(judged(facts), "PF813")}
    assert statuses == {(Status.fail, "NVLink down: GPU 0 link 2"),
                        (Status.warn, "NVLink error counters: GPU 0 link 1 crc_flit=12")}


def test_compute_processes_reach_pf204_and_pf205(fake_library: Path, tmp_path: Path) -> None:
    # nvidia-smi.txt of the recording shows python3 (pid 404) holding 2836 MiB; facts.json, read a moment apart,
    # counted none. Here the library lists it, as nvidia-smi did, with the memory nvidia-smi printed in use.
    answers = {**h100_nvml_answers(), "0.processes": f"404:{2836 << 20}", "process.404": "python3",
               "0.memory": f"85520809984 {2847 << 20}"}
    facts = probe_on_the_fake(fake_library, write_answers(tmp_path / "nvml-facts.txt", answers))
    assert facts["gpu"]["nvml_call_errors"] == []
    assert facts["gpu"]["devices"][0]["processes"] == [{"pid": 404, "name": "python3", "used_memory_bytes": 2836 << 20}]
    findings = judged(facts)
    (occupied,) = by_code(findings, "PF205")
    assert (occupied.status, occupied.message) == (Status.warn, "GPU 0: 1 other compute process(es): 404 (python3)")
    assert by_code(findings, "PF204")[0].status == Status.passed  # 2.8 GiB of 80: under the 5% threshold


# ---------------------------------------------------------------------------------------------------------------------
# Fabric (defect 1: the call took one argument, so every GPU's fabric state was unknown and PF811 never fired)

HGX_LSPCI = DATA / "gpu-node" / "lspci" / "h100-hgx-lspci-vvv-excerpt.txt"
CLUSTER_UUID = "dc6e40c4d72243579ba65291dd461278"


@pytest.mark.parametrize("fabric, state, status, verdict", [
    ("1 0 0 0", "not_started", "success", Status.fail),
    ("2 0 0 0", "in_progress", "success", Status.fail),
    ("3 23 0 0", "completed", "error 23", Status.fail),  # NVML_ERROR_INSUFFICIENT_RESOURCES, as Azure/azhpc-images#506 shows
    ("3 0 2 2", "completed", "success", Status.warn),  # health summary Unhealthy
    ("3 0 2 1", "completed", "success", Status.passed),
])
def test_fabric_states_from_the_library_reach_pf811(fake_library: Path, tmp_path: Path, fabric: str, state: str, status: str,
                                                    verdict: Status) -> None:
    facts = probed(fake_library, tmp_path, fabric=fabric, fabric_cluster_uuid=CLUSTER_UUID)
    (gpu,) = facts["fabric"]["gpus"]
    assert (gpu["state"], gpu["status"], gpu["pci"]) == (state, status, "00000000:00:06.0")
    if state == "completed":
        assert gpu["cluster_uuid"] == "dc6e40c4-d722-4357-9ba6-5291dd461278" and gpu["clique_id"] == int(fabric.split()[2])
    (finding,) = by_code(judged(facts), "PF811")
    assert finding.status == verdict, finding


# ---------------------------------------------------------------------------------------------------------------------
# ECC, clocks, row remapping

def test_ecc_off_warns_and_differs_across_hosts(fake_library: Path, tmp_path: Path) -> None:
    facts = probed(fake_library, tmp_path, ecc_mode="0 0")
    gpu = facts["gpu"]["devices"][0]
    assert (gpu["ecc_enabled"], gpu["ecc_pending_enabled"]) == (False, False)
    (finding,) = by_code(judged(facts), "PF862")
    assert finding.status == Status.warn and finding.message.startswith("ECC is off on GPU 0")
    (cross,) = by_code(check_cluster({2: with_gpu(facts)}), "PF863")
    assert cross.status == Status.fail and cross.message == "ECC mode differs: node03 has off; the other 3 have on"


def test_ecc_about_to_change_warns(fake_library: Path, tmp_path: Path) -> None:
    (finding,) = by_code(judged(probed(fake_library, tmp_path, ecc_mode="1 0")), "PF862")
    assert finding.status == Status.warn and finding.message == "ECC mode changes at the next reboot: GPU 0 off"


def test_a_row_remapping_pending_fails_pf402(fake_library: Path, tmp_path: Path) -> None:
    facts = probed(fake_library, tmp_path, remapped_rows="0 1 1 0")
    assert facts["gpu"]["devices"][0]["remapped_rows_pending"] is True
    (finding,) = by_code(judged(facts), "PF402")
    assert finding.status == Status.fail and "pending" in finding.message


@pytest.mark.parametrize("mask, names, verdict, message", [
    (0x8, ["hw_slowdown"], Status.fail, "clocks held down: GPU 0 HW slowdown"),
    (0x40, ["hw_thermal_slowdown"], Status.fail, "clocks held down: GPU 0 HW thermal slowdown"),
    (0x80 | 0x8, ["hw_slowdown", "hw_power_brake_slowdown"], Status.fail, "clocks held down: GPU 0 HW slowdown, HW power brake"),
    (0x20, ["sw_thermal_slowdown"], Status.warn, "GPU 0: clocks lowered by the driver's thermal limit"),
    (0x1 | 0x4, ["gpu_idle", "sw_power_cap"], Status.passed, "no clocks held down on 1 GPUs"),
])
def test_clocks_held_down(fake_library: Path, tmp_path: Path, mask: int, names: list[str], verdict: Status, message: str) -> None:
    facts = probed(fake_library, tmp_path, clocks_event_reasons=hex(mask))
    assert facts["gpu"]["devices"][0]["clock_event_reasons"] == names
    (finding,) = by_code(judged(facts), "PF860")
    assert (finding.status, finding.message) == (verdict, message)


def test_a_hot_gpu_warns_above_the_threshold(fake_library: Path, tmp_path: Path) -> None:
    facts = probed(fake_library, tmp_path, temperature_c="91")
    (finding,) = by_code(judged(facts), "PF861")
    assert (finding.status, finding.message) == (Status.warn, "GPU 0 at 91 C before the job (above 85 C)")
    assert by_code(judged(facts, "thresholds.gpu_temperature_max_c=95"), "PF861")[0].status == Status.passed


# ---------------------------------------------------------------------------------------------------------------------
# PCIe generation, firmware across hosts, retired pages, MIG, recovery action

@pytest.mark.parametrize("pcie_gen, reasons, verdict, message", [
    ("4 4 5", "0x0", Status.warn, "GPU 0 in a Gen4 slot, capable of Gen5"),
    ("3 5 5", "0x0", Status.warn, "GPU 0 at PCIe Gen3 while not idle, capable of Gen5"),
    ("1 5 5", "0x1", Status.passed, "1 GPUs' PCIe generation as their links allow"),  # idle: the link saves power
])
def test_gpu_pcie_generation(fake_library: Path, tmp_path: Path, pcie_gen: str, reasons: str, verdict: Status,
                             message: str) -> None:
    facts = probed(fake_library, tmp_path, pcie_gen=pcie_gen, clocks_event_reasons=reasons)
    assert facts["gpu"]["devices"][0]["pcie_gen_gpu_max"] == int(pcie_gen.split()[2])
    (finding,) = by_code(judged(facts), "PF864")
    assert (finding.status, finding.message) == (verdict, message)


def test_firmware_that_differs_across_hosts_of_one_model_warns(fake_library: Path, tmp_path: Path) -> None:
    facts = probed(fake_library, tmp_path, vbios_version="96.00.99.00.01", inforom_image_version="G520.0200.00.04")
    findings = check_cluster({1: with_gpu(facts)})
    (vbios,) = by_code(findings, "PF866")
    (inforom,) = by_code(findings, "PF867")
    assert vbios.status == inforom.status == Status.warn
    assert vbios.message == ("VBIOS of NVIDIA H100 80GB HBM3 differs: node02 has 96.00.99.00.01; the other 3 have "
                             "96.00.DA.00.0C")
    assert inforom.message.startswith("InfoROM image of NVIDIA H100 80GB HBM3 differs: node02 has G520.0200.00.04")
    (same,) = by_code(check_cluster({}), "PF866")
    assert (same.status, same.message) == (Status.passed, "VBIOS of NVIDIA H100 80GB HBM3: 96.00.DA.00.0C on all 4 hosts")


@pytest.mark.parametrize("pending, verdict", [("1", Status.fail), ("0", Status.passed)])
def test_retired_pages_pending(fake_library: Path, tmp_path: Path, pending: str, verdict: Status) -> None:
    facts = probed(fake_library, tmp_path, retired_pages_pending=pending)
    assert facts["gpu"]["devices"][0]["retired_pages_pending"] is (pending == "1")
    (finding,) = by_code(judged(facts), "PF868")
    assert finding.status == verdict
    assert by_code(judged(probed(fake_library, tmp_path)), "PF868") == []  # the H100's NVML: Not Supported


@pytest.mark.parametrize("mig_mode, expect_mig, pf869, pf407", [
    ("0 0", "true", [Status.fail], []),  # the cluster runs MIG, this GPU does not
    ("1 1", "true", [Status.passed], []),  # as expected: PF407 keeps quiet
    ("1 1", "false", [], [Status.warn]),  # MIG where the cluster does not expect it: PF407's warning alone
    ("0 1", "false", [Status.warn], []),  # MIG comes on at the next reset
    ("0 0", "false", [Status.passed], []),
])
def test_mig_against_the_config(fake_library: Path, tmp_path: Path, mig_mode: str, expect_mig: str, pf869: list[Status],
                                pf407: list[Status]) -> None:
    findings = judged(probed(fake_library, tmp_path, mig_mode=mig_mode), f"training.gpu_mig={expect_mig}")
    assert [f.status for f in by_code(findings, "PF869")] == pf869
    assert [f.status for f in by_code(findings, "PF407")] == pf407


@pytest.mark.parametrize("action, verdict, text", [
    ("4", Status.fail, "GPU 0: the driver asks for recovery: drain_and_reset"),
    ("1", Status.fail, "GPU 0: the driver asks for recovery: gpu_reset"),
    ("0", Status.passed, "no recovery action asked for on 1 GPUs"),
])
def test_recovery_action(fake_library: Path, tmp_path: Path, action: str, verdict: Status, text: str) -> None:
    facts = probed(fake_library, tmp_path, field230=action)
    (finding,) = by_code(judged(facts), "PF870")
    assert (finding.status, finding.message) == (verdict, text)
    facts = probed(fake_library, tmp_path, field230="")  # an older driver: no such field
    assert facts["gpu"]["devices"][0]["recovery_action"] is None and by_code(judged(facts), "PF870") == []


def refused_at_init(fake_library: Path, tmp_path: Path, code: int) -> tuple[dict[str, Any], Finding]:
    """The facts of a host whose nvmlInit returns code, and its PF100 on a GPU cluster."""
    answers = {**h100_nvml_answers(), "init_error": str(code)}
    facts = probe_on_the_fake(fake_library, write_answers(tmp_path / "nvml-facts.txt", answers))
    (finding,) = by_code(judged(facts, "training.backend=nccl"), "PF100")
    assert finding.status == Status.fail and facts["gpu"]["source"] == "none"
    return facts, finding


def test_a_kernel_module_of_another_driver_version_is_named_not_called_a_missing_driver(fake_library: Path,
                                                                                      tmp_path: Path) -> None:
    # nvmlInit refused as the real library is when the module loaded is another driver version (an upgrade with no
    # reboot): NVML_ERROR_LIB_RM_VERSION_MISMATCH, which nvidia-ml-py words as its own table says.
    facts, finding = refused_at_init(fake_library, tmp_path, 18)
    assert "NVML: RM has detected an NVML/RM version mismatch." in facts["gpu"]["error"]
    assert finding.message.startswith(
        "the NVIDIA kernel module is another driver version than its libraries (upgraded, not yet rebooted): NVML: RM has")
    assert "reboot" in finding.remedy and "PF731" in finding.remedy
    # Another refusal stays a missing driver.
    _, finding = refused_at_init(fake_library, tmp_path, 9)  # NVML_ERROR_DRIVER_NOT_LOADED
    assert finding.message.startswith("no NVIDIA driver: NVML: Driver Not Loaded")


def test_gpus_a_container_may_no_longer_open_are_named_not_called_a_missing_driver(fake_library: Path,
                                                                                  tmp_path: Path) -> None:
    # nvmlInit refused with NVML_ERROR_UNKNOWN (999), as NVIDIA's notice NVIDIA/nvidia-docker#1730 shows it in a container
    # whose cgroup lost the NVIDIA device rules; the driver's /proc entry is there (probe_on_a_gpu_host).
    facts, finding = refused_at_init(fake_library, tmp_path, 999)
    assert "NVML: Unknown Error" in facts["gpu"]["error"]
    assert finding.message.startswith(
        "the NVIDIA driver is loaded but NVML may not open the GPUs (in a container: its access to them was taken away)")
    assert "recreate the container" in finding.remedy and "PF732" in finding.remedy
    # A host whose GPUs cannot be opened has GPUs: backend auto is nccl, and the refusal a failure, not a CPU host's pass.
    (auto,) = by_code(judged(facts), "PF100")
    assert auto.status == Status.fail
    # Where NVML cannot be loaded at all (an empty library first on the path), nvidia-smi's own line says the same.
    (tmp_path / "libnvidia-ml.so.1").write_bytes(b"")
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 'Failed to initialize NVML: Unknown Error'\nexit 255\n")
    smi.chmod(0o755)
    facts = probe_on_a_gpu_host({"PATH": f"{smi.parent}:/usr/bin:/bin", "LD_LIBRARY_PATH": str(tmp_path)})
    assert "nvidia-smi: Failed to initialize NVML: Unknown Error" in facts["gpu"]["error"], facts["gpu"]["error"]
    (finding,) = by_code(judged(facts), "PF100")
    assert finding.status == Status.fail and finding.message.startswith("the NVIDIA driver is loaded but NVML may not")


# ---------------------------------------------------------------------------------------------------------------------
# The nvidia-smi path: NVML cannot load, nvidia-smi answers as the recording

def probed_through_nvidia_smi(tmp_path: Path, xml: str) -> dict[str, Any]:
    (tmp_path / "q.xml").write_text(xml)
    # An empty libnvidia-ml.so.1 first on the library path: dlopen fails on it ("file too short") and searches no
    # further, so NVML cannot load here nor on a GPU host, whose real library the loader would otherwise find through
    # its cache (the H100 run of 2026-11-27 read source "nvml" here).
    (tmp_path / "libnvidia-ml.so.1").write_bytes(b"")
    folder = fake_nvidia_smi(tmp_path)
    facts = probe_on_a_gpu_host({"PATH": f"{folder}:/usr/bin:/bin", "FAKE_SMI_XML": str(tmp_path / "q.xml"),
                                 "LD_LIBRARY_PATH": str(tmp_path)})
    jsonschema.Draft202012Validator(load_schema("facts")).validate(facts)
    assert facts["gpu"]["source"] == "nvidia-smi", facts["gpu"]
    return facts


def test_the_nvidia_smi_path_reads_the_same_facts(tmp_path: Path) -> None:
    facts = probed_through_nvidia_smi(tmp_path, (H100 / "nvidia-smi-q.xml").read_text())
    (device,) = facts["gpu"]["devices"]
    (recorded,) = h100_facts()["gpu"]["devices"]
    schema_3 = {k: v for k, v in device.items() if k in probe.SMI_XML_FIELDS}
    # The XML was printed a moment after pynvml read 55 C.
    assert schema_3 == {**{k: recorded[k] for k in probe.SMI_XML_FIELDS}, "temperature_c": 54}
    assert [(f.code, f.status) for f in judged(facts) if f.code >= "PF860"] == [
        ("PF860", Status.passed), ("PF861", Status.passed), ("PF862", Status.passed), ("PF864", Status.passed),
        ("PF870", Status.passed)]


def test_the_nvidia_smi_path_judges_a_throttled_gpu(tmp_path: Path) -> None:
    xml = (H100 / "nvidia-smi-q.xml").read_text().replace(
        "<clocks_event_reason_hw_thermal_slowdown>Not Active<", "<clocks_event_reason_hw_thermal_slowdown>Active<")
    (finding,) = by_code(judged(probed_through_nvidia_smi(tmp_path, xml)), "PF860")
    assert (finding.status, finding.message) == (Status.fail, "clocks held down: GPU 0 HW thermal slowdown")


# ---------------------------------------------------------------------------------------------------------------------
# The RDMA NICs' PCIe link, read from sysfs on the recorded HGX H100's PCI tree (tests/data/gpu-node/lspci)

@pytest.fixture(scope="module")
def hgx_sysfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recorded HGX host's sysfs tree, built once (seconds) for the module."""
    return sysfs_from_lspci(HGX_LSPCI.read_text(), tmp_path_factory.mktemp("hgx"))


def nic_link_facts(root: Path, speed: str, width: str) -> dict[str, Any]:
    """The recorded HGX host's topology with every RDMA NIC's link files written: the first NIC trained at speed and
    width, the others at Gen5 x16 (the files' format is the kernel's: "32.0 GT/s PCIe", "16")."""
    nics = sorted((root / "class" / "infiniband").iterdir())
    for position, nic in enumerate(nics):
        device = nic / "device"
        (device / "max_link_speed").write_text("32.0 GT/s PCIe\n")
        (device / "max_link_width").write_text("16\n")
        (device / "current_link_speed").write_text((speed if position == 0 else "32.0 GT/s PCIe") + "\n")
        (device / "current_link_width").write_text((width if position == 0 else "16") + "\n")
    topology = probe.topology(str(root), str(root / "proc"))
    return variant(lambda facts: facts.update(topology=topology))


@pytest.mark.parametrize("speed, width, verdict, message", [
    ("16.0 GT/s PCIe", "16", Status.warn, "RDMA NIC PCIe link below its maximum: mlx5_0 (0000:1a:00.0) 16 GT/s x16, "
                                          "capable of 32 GT/s x16"),
    ("32.0 GT/s PCIe", "8", Status.warn, "RDMA NIC PCIe link below its maximum: mlx5_0 (0000:1a:00.0) 32 GT/s x8, "
                                         "capable of 32 GT/s x16"),
    ("32.0 GT/s PCIe", "16", Status.passed, "12 RDMA NIC functions at full PCIe speed and width"),
])
def test_nic_pcie_link(hgx_sysfs: Path, speed: str, width: str, verdict: Status, message: str) -> None:
    facts = nic_link_facts(hgx_sysfs, speed, width)
    link = next(d for d in facts["topology"]["devices"] if d["name"] == "mlx5_0")["pcie_link"]
    assert link == {"speed_gts": float(speed.split()[0]), "width": int(width), "max_speed_gts": 32.0, "max_width": 16}
    assert all(d["pcie_link"] is None for d in facts["topology"]["devices"] if d["kind"] != "nic")
    (finding,) = by_code(check_one(facts), "PF865")
    assert (finding.status, finding.message) == (verdict, message)
