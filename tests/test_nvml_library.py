"""The probe through the real nvidia-ml-py, against a libnvidia-ml.so.1 compiled here from NVML's own header.

The fake library (tests/fake_nvml/fake_nvml.c) answers from the real H100 recording, changed only in the fields under
test: fabric not started, in progress or failed, ECC off, clocks held down, a row remapping pending. The probe runs as
on a host (`python3 -`, the script on stdin) and its facts are judged by the real checks. A call the probe makes with
arguments nvidia-ml-py does not take, or one the fake does not export, is loud here (gpu.nvml_call_errors).
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from nvml_fake import PROBE, compile_fake, exported, h100_nvml_answers, probe_on_the_fake, write_answers
from recorded import h100_facts, variant
from test_checks import by_code, check_one

from preflight.findings import Finding, Status
from preflight.resources import load_schema


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


def judged(facts: dict[str, Any], *overrides: str) -> list[Finding]:
    """The real checks over the recorded H100 whose GPU and fabric sections are the probe's."""
    return check_one(variant(lambda f: f.update(gpu=facts["gpu"], fabric=facts["fabric"])), *overrides)


# ---------------------------------------------------------------------------------------------------------------------
# The fake covers the probe, and the probe calls nvidia-ml-py as it is declared


def probe_nvml_calls() -> set[str]:
    """The pynvml functions the probe calls: nvml.X attributes and ask(nvml, "X", ...) names."""
    tree = ast.parse(PROBE.read_text())
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
    pynvml = pytest.importorskip("pynvml")
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


def test_a_call_the_library_lacks_is_said_not_taken_for_unsupported(fake_library: Path, tmp_path: Path) -> None:
    # The probe asks for the fabric through the versioned call first; a library without it (drivers before R550 have
    # only nvmlDeviceGetGpuFabricInfo) must show in the facts, while the first call still answers.
    source = PROBE.read_text().replace('"nvmlDeviceGetGpuFabricInfoV"', '"nvmlDeviceGetGpuFabricInfoV_missing"')
    answers = {**h100_nvml_answers(), "0.fabric": "1 0 0 0"}
    facts = probe_on_the_fake(fake_library, write_answers(tmp_path / "nvml-facts.txt", answers), probe_source=source)
    assert facts["gpu"]["nvml_call_errors"] == ["nvmlDeviceGetGpuFabricInfoV_missing: AttributeError: module 'pynvml' has no "
                                                "attribute 'nvmlDeviceGetGpuFabricInfoV_missing'"]
    assert facts["fabric"]["gpus"][0]["state"] == "not_started"


# ---------------------------------------------------------------------------------------------------------------------
# Fabric (defect 1: the call took one argument, so every GPU's fabric state was unknown and PF811 never fired)

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

def test_ecc_off(fake_library: Path, tmp_path: Path) -> None:
    facts = probed(fake_library, tmp_path, ecc_mode="0 0")
    gpu = facts["gpu"]["devices"][0]
    assert (gpu["ecc_enabled"], gpu["ecc_pending_enabled"]) == (False, False)


def test_a_row_remapping_pending_fails_pf402(fake_library: Path, tmp_path: Path) -> None:
    facts = probed(fake_library, tmp_path, remapped_rows="0 1 1 0")
    assert facts["gpu"]["devices"][0]["remapped_rows_pending"] is True
    (finding,) = by_code(judged(facts), "PF402")
    assert finding.status == Status.fail and "pending" in finding.message


THROTTLED: list[tuple[int, list[str]]] = [
    (0x8, ["hw_slowdown"]), (0x40, ["hw_thermal_slowdown"]), (0x80, ["hw_power_brake_slowdown"]),
    (0x1 | 0x4, ["gpu_idle", "sw_power_cap"]),
]


@pytest.mark.parametrize("mask, names", THROTTLED)
def test_clock_event_reasons(fake_library: Path, tmp_path: Path, mask: int, names: list[str]) -> None:
    facts = probed(fake_library, tmp_path, clocks_event_reasons=hex(mask))
    assert facts["gpu"]["devices"][0]["clock_event_reasons"] == names
