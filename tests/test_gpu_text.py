"""GPU nodes, second pass on real text (issue #37): an SXid known only by its severity line, Xid lines whose address is
redacted, a GPU that never initialized, Xid 32's advice, the Xid and SXid table read from NVIDIA's catalogue, clock
event reasons from drivers before R535 (nvidia-smi's older XML, NVML's older call), the fake libnvidia-ml answering as
R470, R535 and the newest generation, and `diagnose` reading gzip-compressed logs. Each sample's source is in
tests/data/gpu-node/README.md; each test here failed before its fix.
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path
from typing import Any

import pytest
from nvml_fake import compile_fake, exported, h100_nvml_answers, probe_on_the_fake, write_answers
from recorded import DATA, variant
from test_checks import by_code, check_one
from test_gpu_field import events, with_events  # the kernel-log readers of tests/data/gpu-node/kernel

from preflight import bundle
from preflight.checks.xid import XID_CATALOGUE, judge_event
from preflight.checks.xid_catalogue import BUCKET_ACTIONS, SOURCE, catalogue
from preflight.diagnose import diagnose_file
from preflight.findings import Status

probe = bundle.load(bundle.FACTS)  # the facts probe as hosts get it, loaded as a module

KERNEL = DATA / "gpu-node" / "kernel"
SMI = DATA / "gpu-node" / "smi"
LENT_H100 = DATA / "h100-lent-2026-11-27"


# ---------------------------------------------------------------------------------------------------------------------
# Item 1: the NVSwitch driver's severity line


def test_an_sxid_known_only_by_its_severity_line_says_fatal_or_not() -> None:
    found = {e["code"]: e for e in events("sxid-severity-line-only-cut.log")}
    assert (found[20034]["fatal"], found[22013]["fatal"]) == (True, False)
    findings = {re.search(r"SXid \d+", f.message).group(0): f  # type: ignore[union-attr]
                for f in by_code(check_one(with_events(list(found.values()), 4)), "PF802")}
    assert (findings["SXid 20034"].status, findings["SXid 22013"].status) == (Status.fail, Status.warn)
    result = diagnose_file(str(KERNEL / "sxid-severity-line-only-cut.log"))
    (sxid,) = result.diagnoses
    assert [e.split(", ")[0] for e in sxid.details["event"]] == ["SXid 20034 on 0000:05:00.0 (1x): fatal",
                                                                  "SXid 22013 on 0000:04:00.0 (1x): not fatal"]
    assert not any("severity unknown" in e for e in sxid.details["event"])


def test_an_sxid_with_only_data_lines_takes_the_catalogues_severity() -> None:
    line = ("nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028, Data {0x000001c0, 0x00bd5c8a, 0x00000500, 0x00000064, "
            "0x00000000, 0x40008000, 0x5a001100, 0x00000000, 0x00000000}")  # leptonai/gpud#338's line
    (event,) = probe.xid_events([line], None, 0.0)[0]
    fatal, meaning, action = judge_event(event)
    assert fatal and "NVIDIA's catalogue calls it fatal (NVSWITCH_ERR_HW_NPORT_EGRESS_PRIVRSPERR)" in meaning
    assert action == BUCKET_ACTIONS["RESET_FABRIC"]


# ---------------------------------------------------------------------------------------------------------------------
# Item 2: a redacted address


def test_xid_lines_whose_address_is_redacted_count_and_say_so() -> None:
    found = events("xid-redacted-address-79-154.log")
    assert [(e["pci"], e["code"]) for e in found] == [("", 79), ("", 154)]
    findings = by_code(check_one(with_events(found)), "PF801")
    assert [(f.status, f.message.split(" (")[0]) for f in findings] == [
        (Status.fail, "a GPU whose address the log hides: Xid 79"), (Status.fail, "a GPU whose address the log hides: Xid 154")]
    result = diagnose_file(str(KERNEL / "xid-redacted-address-79-154.log"))
    assert result.exit_code == 1
    (diagnosis,) = result.diagnoses
    assert diagnosis.details["event"][0].startswith("Xid 79 on a GPU whose address the log hides (1x): fatal")
    assert [e.line for e in diagnosis.excerpts] == [1, 4]


def test_xid_154_is_judged_by_the_action_it_names() -> None:
    base = {"kind": "Xid", "pci": "0000:3b:00", "code": 154, "count": 1, "first_unix_s": None, "last_unix_s": None,
            "fatal": None}
    reboot = "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    cleared = "GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)"
    assert judge_event({**base, "message": reboot})[0] is True  # type: ignore[typeddict-item]
    assert judge_event({**base, "message": cleared})[0] is False  # type: ignore[typeddict-item]


# ---------------------------------------------------------------------------------------------------------------------
# Item 5: a GPU that never initialized


def test_rm_init_adapter_failed_is_a_gpu_that_never_initialized() -> None:
    (event,) = events("rm-init-adapter-failed-open-gpu-kernel-modules-789.log")
    assert (event["kind"], event["pci"], event["code"]) == ("Xid", "0000:98:00", 143)
    assert event["message"].startswith("RmInitAdapter failed! (0x62:0x65:1792)")
    (finding,) = by_code(check_one(with_events([event])), "PF801")
    assert finding.status == Status.fail and "Xid 143 (GPU initialization failure" in finding.message
    (diagnosis,) = diagnose_file(str(KERNEL / "rm-init-adapter-failed-open-gpu-kernel-modules-789.log")).diagnoses
    assert diagnosis.code == "PF801" and [e.line for e in diagnosis.excerpts] == [2]


# ---------------------------------------------------------------------------------------------------------------------
# Items 6 and "sources of truth": the catalogue


def test_xid_32_is_the_pcie_path_not_the_application() -> None:
    meaning = XID_CATALOGUE[32]
    assert meaning.origin == "gpu" and "PCIe" in meaning.meaning and "application's fault" not in meaning.action
    assert "PCIE" in meaning.action and "ROBUST_CHANNEL_PBDMA_ERROR, RESTART_APP, NONFATAL" in meaning.source


def test_every_xid_and_sxid_is_nvidias_with_its_action_and_source() -> None:
    xids, sxids = catalogue("Xid"), catalogue("SXid")
    assert sorted(xids) == list(range(1, 163)) and len(sxids) == 398
    assert all(entry.action == BUCKET_ACTIONS[entry.bucket] for entry in (*xids.values(), *sxids.values()))
    for code, meaning in XID_CATALOGUE.items():
        entry = xids[code]
        assert meaning.source.startswith(SOURCE) and f"{entry.bucket}, {'FATAL' if entry.fatal else 'NONFATAL'}" in meaning.source
        assert meaning.fatal == entry.fatal and meaning.action.startswith(entry.action), code
    # Where preflight judged by guess before: NVIDIA's catalogue has Xid 109 reset the GPU and Xid 38 ignored.
    assert (XID_CATALOGUE[109].fatal, XID_CATALOGUE[38].fatal) == (True, False)
    # The SXid the issue saw only by its severity line: NVIDIA's catalogue resets the GPU for it too.
    assert (sxids[24007].bucket, sxids[24007].fatal) == ("RESET_GPU", True)


# ---------------------------------------------------------------------------------------------------------------------
# Item 4: clock event reasons before R535


def test_nvidia_smi_xml_before_r535_names_its_clock_reasons_throttle() -> None:
    old = (SMI / "q-x-clocks-throttle-reasons-built-netdata-2922.xml").read_text()
    assert probe.parse_smi_xml(old)["00000000:01:00.0"]["clock_event_reasons"] == ["gpu_idle"]
    slowed = old.replace("<clocks_throttle_reason_hw_slowdown>Not Active<", "<clocks_throttle_reason_hw_slowdown>Active<")
    assert probe.parse_smi_xml(slowed)["00000000:01:00.0"]["clock_event_reasons"] == ["gpu_idle", "hw_slowdown"]
    # The lent H100's R580 capture names them clocks_event_reasons: still read.
    new = probe.parse_smi_xml((LENT_H100 / "nvidia-smi-q.xml").read_text())
    assert [gpu["clock_event_reasons"] for gpu in new.values()] == [["gpu_idle"]]

    def held(facts: dict[str, Any]) -> None:
        facts["gpu"]["devices"][0]["clock_event_reasons"] = probe.parse_smi_xml(slowed)["00000000:01:00.0"]["clock_event_reasons"]
    (finding,) = by_code(check_one(variant(held)), "PF860")
    assert (finding.status, finding.message) == (Status.fail, "clocks held down: GPU 0 HW slowdown")


def test_a_captured_r460_host_of_eight_v100s_under_load_reads_whole_and_passes() -> None:
    """A real `nvidia-smi -q -x` of driver 460.73.01 (schema v11, the throttle names): eight V100S at work, two of them
    at their software power cap, which is a GPU doing its job and no clock held down."""
    parsed = probe.parse_smi_xml((SMI / "q-x-v100s-8-r460-captured-guancecloud-datakit.xml").read_text())
    assert len(parsed) == 8 and all(gpu["clock_event_reasons"] is not None for gpu in parsed.values())
    assert {bus for bus, gpu in parsed.items() if gpu["clock_event_reasons"]} == {"00000000:00:10.0", "00000000:00:13.0"}
    assert {tuple(gpu["clock_event_reasons"] or ()) for gpu in parsed.values()} == {(), ("sw_power_cap",)}
    assert sorted(gpu["temperature_c"] for gpu in parsed.values()) == [57, 57, 58, 59, 61, 61, 64, 66]
    # R460 has no Device Max PCIe generation (NVML's GpuMax call came later): unknown, not a guess.
    assert {gpu["pcie_gen_gpu_max"] for gpu in parsed.values()} == {None}

    def eight(facts: dict[str, Any]) -> None:
        base = facts["gpu"]["devices"][0]
        facts["gpu"]["devices"] = [{**base, "index": k, "clock_event_reasons": gpu["clock_event_reasons"],
                                    "temperature_c": gpu["temperature_c"]} for k, gpu in enumerate(parsed.values())]
    found = check_one(variant(eight))
    assert [(f.status, f.message) for f in by_code(found, "PF860")] == [(Status.passed, "no clocks held down on 8 GPUs")]
    assert {f.status for f in by_code(found, "PF861")} == {Status.passed}


def test_the_display_clock_reason_has_one_name_whichever_path_read_it() -> None:
    # nvidia-smi's cell is display_clocks_setting; NVML's reason (0x100) is named display_clock_setting in the facts.
    xml = (LENT_H100 / "nvidia-smi-q.xml").read_text().replace(
        "<clocks_event_reason_display_clocks_setting>Not Active<", "<clocks_event_reason_display_clocks_setting>Active<")
    (gpu,) = probe.parse_smi_xml(xml).values()
    assert gpu["clock_event_reasons"] == ["gpu_idle", "display_clock_setting"]
    assert "display_clock_setting" in {name for _, name in probe.CLOCK_EVENT_REASONS}


# ---------------------------------------------------------------------------------------------------------------------
# Older names of NVML calls: the fake answering as each driver generation

# What each generation's libnvidia-ml lacks of what the probe asks (nvml.h in NVIDIA/go-nvml: 11.4 at 1e34b77 for R470,
# 12.2 at 075f45f for R535), each said in gpu.nvml_call_errors; a call NVML renamed falls back without a word.
GENERATIONS = {
    "R470": (["FAKE_NVML_R470"], ["nvmlDeviceGetGpuMaxPcieLinkGeneration", "nvmlDeviceGetGpuFabricInfoV",
                                  "nvmlDeviceGetGpuFabricInfo"]),
    "R535": (["FAKE_NVML_R535"], ["nvmlDeviceGetGpuFabricInfoV"]),
    "newest": ([], []),
}


@pytest.mark.parametrize("generation", list(GENERATIONS))
def test_the_probe_on_each_driver_generations_library(generation: str, tmp_path: Path) -> None:
    defines, lacking = GENERATIONS[generation]
    library = compile_fake(tmp_path, *defines)
    assert ("nvmlDeviceGetCurrentClocksEventReasons" in exported(library)) == (generation != "R470")
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" in exported(library)
    answers = {**h100_nvml_answers(), "0.clocks_event_reasons": hex(0x8)}  # HW slowdown
    facts = probe_on_the_fake(library, write_answers(tmp_path / "nvml-facts.txt", answers))
    errors = [re.sub(r":.*", "", note) for note in facts["gpu"]["nvml_call_errors"]]
    assert errors == lacking
    (gpu,) = facts["gpu"]["devices"]
    assert gpu["clock_event_reasons"] == ["hw_slowdown"]
    assert (gpu["pcie_gen_gpu_max"] is None) == (generation == "R470")
    assert (gpu["recovery_action"] is None) == (generation != "newest")  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION is 13.0's

    def probed(recorded: dict[str, Any]) -> None:
        recorded.update(gpu=facts["gpu"], fabric=facts["fabric"])
    (finding,) = by_code(check_one(variant(probed)), "PF860")
    assert (finding.status, finding.message) == (Status.fail, "clocks held down: GPU 0 HW slowdown")


# ---------------------------------------------------------------------------------------------------------------------
# Item 8: a support bundle's gzip


def test_diagnose_reads_a_gzip_compressed_support_bundle(tmp_path: Path) -> None:
    # The .gz is made here from a captured log; no real nvidia-bug-report.log.gz is in the data.
    plain = KERNEL / "rm-init-adapter-failed-open-gpu-kernel-modules-789.log"
    bundle = tmp_path / "nvidia-bug-report.log.gz"
    bundle.write_bytes(gzip.compress(plain.read_bytes(), mtime=0))
    zipped, unzipped = diagnose_file(str(bundle)), diagnose_file(str(plain))
    assert zipped.exit_code == unzipped.exit_code == 1
    assert [d.details["event"] for d in zipped.diagnoses] == [d.details["event"] for d in unzipped.diagnoses]
    rotated = tmp_path / "kern.log.1.gz"  # logrotate's compressed kern.log, two gzip members as `cat a.gz b.gz` gives
    text = (KERNEL / "sxid-severity-line-only-cut.log").read_bytes()
    rotated.write_bytes(gzip.compress(text[:60], mtime=0) + gzip.compress(text[60:], mtime=0))
    (sxid,) = diagnose_file(str(rotated)).diagnoses
    assert sxid.matches == 2
