"""NCCL's own diagnostics (NCCL_RUN_DIAGNOSTICS=1 and NCCL_RUN_RAS_DIAGNOSTICS=1, NCCL 2.31 on) and PF844, on recorded
report lines: the user guide's samples as printed there, and failing reports built from the format strings of NCCL's
src/diagnostics.cc, src/diagnostics/p2p.cc and ib_write_bw.cc (tests/data/gpu-node/README.md names each source)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from test_checks import by_code
from test_gpu_node import NODE, ib_records, nccl_log

from preflight.collective.nccl_network import diagnostics_env, judge_transport, nccl_version_tuple, parse_nccl_diagnostics
from preflight.findings import CLUSTER, Status
from preflight.records import HostRecord
from preflight.resources import load_schema

IB_LOG = "net-ib-gdrdma-aks-rdma-infiniband-pr-36.log"


def diag_log(name: str) -> str:
    return (NODE / "nccl" / name).read_text()


def test_the_report_lines_parse_with_and_without_nccls_host_prefix() -> None:
    # The user guide prints the lines without DIAG_PRINT's "host:pid ": the host is the one whose output it is.
    (ok,), closing, seen = parse_nccl_diagnostics(diag_log("diag-ok-nvidia-docs-later.log"), "node01")
    assert seen and closing == ["NCCL diagnostics completed in 245.3 ms across 8 ranks"]
    assert (ok["host"], ok["level"], ok["check"], ok["failed"]) == ("node01", "OK", "p2p", False)
    assert ok["text"] == "verified P2P access in both directions between every GPU pair (56 peer accesses)"
    results, closing, _ = parse_nccl_diagnostics(diag_log("diag-p2p-write-mismatch-nccl-2.31.2-formats.log"), "node01")
    assert closing == ["NCCL diagnostics completed in 311.8 ms across 8 ranks"]
    assert [(r["host"], r["level"], r["check"], r["failed"]) for r in results] == [("node01", "INFO", "p2p", True)] * 3
    assert results[0]["text"] == "54/56 directed GPU P2P edges verified"
    assert results[1]["text"].startswith("write mismatch srcRank=2 srcCudaDev=2 srcNvmlDev=2 dstRank=5")
    # The bandwidth check's [INFO] lines are notes to review (an outlier rank), not failures.
    bandwidth, closing, _ = parse_nccl_diagnostics(diag_log("diag-net-bw-nvidia-docs.log"), "node01")
    assert closing == [] and [(r["host"], r["level"], r["check"], r["failed"]) for r in bandwidth] == [
        ("node01", "OK", "net bw", False), ("node01", "INFO", "net bw", False), ("node01", "INFO", "net bw", False)]
    # The 2.31.2 guide's sample says what 2.31.2's p2p.cc prints ("all %llu directed GPU P2P edges verified").
    (ok,), _, _ = parse_nccl_diagnostics(diag_log("diag-ok-nvidia-docs-2.31.2.log"), "node01")
    assert (ok["level"], ok["check"], ok["text"], ok["failed"]) == ("OK", "p2p", "all 56 directed GPU P2P edges verified", False)
    # NCCL's INFO lines of an older release say nothing to this parser.
    assert parse_nccl_diagnostics(nccl_log(IB_LOG), "node01") == ([], [], False)
    # The RAS report: the same line shape, checks named in capitals, its own closing line.
    ras, closing, _ = parse_nccl_diagnostics(diag_log("ras-diag-ok-nvidia-docs-2.31.2.log"), "node01")
    assert [(r["host"], r["level"], r["check"]) for r in ras] == [
        ("node01", "OK", "GPU inventory"), ("node01", "OK", "CUDA driver version"), ("node01", "OK", "ECC"),
        ("node01", "OK", "NVLink"), ("node01", "OK", "NCCL environment")]
    assert ras[0]["text"] == "8x NVIDIA H100 per node consistent across 8 ranks in comm 0x1234"
    assert closing == ["RAS diagnostics completed in 12.3 ms across 8 RAS peers"]


def test_diagnostics_that_passed_pass_and_land_in_a_schema_5_report(tmp_path: Path) -> None:
    records = ib_records(tmp_path)
    outputs = {"node01": nccl_log(IB_LOG) + diag_log("diag-ok-nvidia-docs-later.log"), "node02": nccl_log(IB_LOG)}
    findings, section = judge_transport(records, outputs, ["2.31.2"] * 8, diagnostics_requested=True)
    (passed,) = by_code(findings, "PF844")
    assert (passed.status, passed.host) == (Status.passed, "node01")
    assert passed.message == ("NCCL's own diagnostics passed: p2p: verified P2P access in both directions between every GPU "
                              "pair (56 peer accesses) (NCCL diagnostics completed in 245.3 ms across 8 ranks)")
    # Both reports on one host: one finding, both closing lines in the section.
    outputs["node01"] += diag_log("ras-diag-ok-nvidia-docs-2.31.2.log")
    findings, section = judge_transport(records, outputs, ["2.31.2"] * 8, diagnostics_requested=True)
    (passed,) = by_code(findings, "PF844")
    assert passed.status == Status.passed and "NCCL environment: NCCL_* env vars consistent across 8 ranks" in passed.message
    assert section["diagnostics"] is not None and section["diagnostics"]["summaries"] == [
        "NCCL diagnostics completed in 245.3 ms across 8 ranks", "RAS diagnostics completed in 12.3 ms across 8 RAS peers"]
    diagnostics = section["diagnostics"]
    assert diagnostics is not None and (diagnostics["nccl_version"], diagnostics["ran"]) == ("2.31.2", True)
    schema = load_schema("report")
    transport = {"$ref": "#/$defs/TransportSection"}  # the collective section's transport, as the report schema names it
    jsonschema.validate(section, {**transport, "$defs": schema["$defs"]})
    # A schema 5 report written before the diagnostics stays valid; a malformed line does not.
    jsonschema.validate({k: v for k, v in section.items() if k != "diagnostics"}, {**transport, "$defs": schema["$defs"]})
    broken = {**section, "diagnostics": {**diagnostics, "results": [{**diagnostics["results"][0], "level": "WARN"}]}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, {**transport, "$defs": schema["$defs"]})


def test_a_failed_p2p_check_fails_with_nccls_words(tmp_path: Path) -> None:
    records = ib_records(tmp_path)
    # Twice, as two communicator inits print it: NCCL's words once each.
    outputs = {"node01": nccl_log(IB_LOG) + diag_log("diag-p2p-write-mismatch-nccl-2.31.2-formats.log") * 2}
    findings, _ = judge_transport(records, outputs, ["2.31.2"], diagnostics_requested=True)
    (failed,) = by_code(findings, "PF844")
    assert (failed.status, failed.host) == (Status.fail, "node01")  # the configured name, not NCCL's hostname
    assert failed.message.startswith("NCCL's own diagnostics failed: p2p: 54/56 directed GPU P2P edges verified | p2p: write "
                                     "mismatch srcRank=2 srcCudaDev=2 srcNvmlDev=2 dstRank=5 dstCudaDev=5 dstNvmlDev=5 path=NVL")
    assert "'nvidia-smi topo -p2p n'" in failed.message and failed.message.count("read mismatch srcRank=5") == 1
    # The user guide's partial summary is a failure too.
    findings, _ = judge_transport(records, {"node01": diag_log("diag-p2p-partial-nvidia-docs-later.log")}, ["2.31.0"], True)
    (partial,) = by_code(findings, "PF844")
    assert partial.status == Status.fail and "only 52/56 GPU-to-GPU peer accesses passed verification" in partial.message


def test_review_notes_warn_and_a_missing_report_warns(tmp_path: Path) -> None:
    records = ib_records(tmp_path)
    findings, _ = judge_transport(records, {"node01": diag_log("diag-net-bw-nvidia-docs.log")}, ["2.32.3"], True)
    (note,) = by_code(findings, "PF844")
    assert (note.status, note.host) == (Status.warn, "node01") and "cross-nic rank 3 (node0): 265.1 Gbit/s" in note.message
    # ib_write_bw missing on a node makes that rank's setup fail: a note, the tool is optional; a timed-out run fails.
    outputs = {"node01": diag_log("diag-net-bw-setup-failed-nccl-formats.log"),
               "node02": diag_log("diag-net-bw-timed-out-nccl-formats.log")}
    findings, _ = judge_transport(records, outputs, ["2.31.2"], True)
    assert [(f.status, f.host) for f in by_code(findings, "PF844")] == [(Status.warn, "node01"), (Status.fail, "node02")]
    (timed_out,) = [f for f in by_code(findings, "PF844") if f.status == Status.fail]
    assert "net bw: mode=same server_rank=0 server_host=node0 server_device=mlx5_0 client_rank=8" in timed_out.message
    assert "tool run timed out" in timed_out.message
    # RAS's "mismatch" across ranks is a note to review, not the P2P check's failed verification.
    findings, _ = judge_transport(records, {"node01": diag_log("ras-diag-env-mismatch-nvidia-docs-2.31.2.log")}, ["2.31.2"], True)
    (ras,) = by_code(findings, "PF844")
    assert (ras.status, ras.host) == (Status.warn, "node01")
    assert "NCCL environment: NCCL_DEBUG=INFO on rank(s) {0,1,2,3} | NCCL environment: NCCL_DEBUG=WARN" in ras.message
    findings, section = judge_transport(records, {"node01": nccl_log(IB_LOG)}, ["2.31.2"], True)
    (missing,) = by_code(findings, "PF844")
    assert (missing.status, missing.host) == (Status.warn, "node01") and "no 'NCCL DIAG' report" in missing.message
    assert section["diagnostics"] is not None and not section["diagnostics"]["ran"]
    # 2.31 ranks the launch did not ask (the facts said no version): said, not failed.
    findings, _ = judge_transport(records, {"node01": nccl_log(IB_LOG)}, ["2.31.2"], False)
    assert [(f.status, f.host) for f in by_code(findings, "PF844")] == [(Status.unknown, CLUSTER)]


def test_older_nccl_changes_nothing(tmp_path: Path) -> None:
    records = ib_records(tmp_path)
    outputs = {"node01": nccl_log(IB_LOG), "node02": nccl_log("net-ib-no-device-nccl-issue-1637.log")}
    for reported in (["2.30.7"], [], ["2.31.2", "2.28.9"]):
        findings, section = judge_transport(records, outputs, reported)
        assert not by_code(findings, "PF844") and section["diagnostics"] is None
    # The recorded 2.25.1 log's own version line keeps it off even when a worker says newer.
    _, section = judge_transport(records, {"node02": nccl_log("net-ib-no-device-nccl-issue-1637.log")}, ["2.31.2"])
    assert section["diagnostics"] is None
    assert (nccl_version_tuple("2.31.2+cuda12.9"), nccl_version_tuple("2.9"), nccl_version_tuple(None)) == ((2, 31, 2), (2, 9), None)


def with_nccl(records: list[HostRecord], versions: list[str | None]) -> list[HostRecord]:
    """The records with only torch's NCCL version changed, one version per host."""
    changed = []
    for record, version in zip(records, versions, strict=True):
        facts: Any = copy.deepcopy(record.facts)
        facts["torch"]["nccl_version"] = version
        changed.append(HostRecord(host=record.host, facts=facts))
    return changed


def test_the_launch_asks_for_diagnostics_only_where_every_host_has_2_31(tmp_path: Path) -> None:
    records = ib_records(tmp_path)
    assert records[0].facts["torch"]["nccl_version"] == "2.28.9"  # the recorded H100's NCCL
    assert diagnostics_env(records) == {}
    assert diagnostics_env(with_nccl(records, ["2.31.2", "2.32.3"])) == {"NCCL_RUN_DIAGNOSTICS": "1", "NCCL_RUN_RAS_DIAGNOSTICS": "1"}
    assert diagnostics_env(with_nccl(records, ["2.31.2", "2.30.7"])) == {}
    assert diagnostics_env(with_nccl(records, ["2.31.2", None])) == {}


def test_the_terminal_report_says_what_the_diagnostics_said(tmp_path: Path) -> None:
    from io import StringIO

    from rich.console import Console

    from preflight.report import render

    outputs = {"node01": diag_log("diag-p2p-write-mismatch-nccl-2.31.2-formats.log")}
    _, transport = judge_transport(ib_records(tmp_path), outputs, ["2.31.2"], diagnostics_requested=True)
    collective = {"status": "pass", "message": "all_reduce verified", "verify": None, "sweep": [], "transport": transport}
    report = {"findings": [], "hosts": [], "status": "fail", "cluster": "prod", "playbook": "full", "elapsed_s": 1.0,
              "collective": collective}
    out = StringIO()
    Console(file=out, width=200).print(render(report))  # type: ignore[arg-type]  # only the keys render reads here
    assert "NCCL diagnostics FAIL  NCCL 2.31.2: NCCL diagnostics completed in 311.8 ms across 8 ranks (PF844)" in out.getvalue()
