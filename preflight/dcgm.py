"""The optional dcgm stage: NVIDIA DCGM's diagnostic (`dcgmi diag -r LEVEL -j`) on every host at once, each under
dcgm.timeout_s, parsed into a finding per failed test and GPU (PF851). A host without dcgmi gets "not run" and nothing
fails because of it; a diagnostic past its deadline, or one that printed no document, is a warning (PF852).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from html import escape
from typing import Any

from preflight.contracts import DcgmHost, DcgmSection, DcgmTest
from preflight.errors import last_line
from preflight.findings import Finding, Status
from preflight.interrupt import Activity, hosts_phrase
from preflight.records import HostRecord
from preflight.rendering import badge, status_line, table
from preflight.spec import PreflightConfig
from preflight.stages import StageContext, StageResult
from preflight.transport import CommandResult, RemoteCommand, Transport

# The level is an integer from the validated config, passed as an argument; exit 127 says dcgmi is not there.
_RUN_DIAG = 'command -v dcgmi >/dev/null 2>&1 || exit 127; exec dcgmi diag -r "$1" -j'
NOT_INSTALLED = 127


def parse_document(text: str) -> dict[str, Any] | None:  # raw JSON of dcgmi's document
    """The JSON document in dcgmi's output, which may start with warning lines; None when there is none."""
    start = text.find("{")
    if start < 0:
        return None
    try:
        document = json.loads(text[start:text.rfind("}") + 1])
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def _warnings(result: dict[str, Any]) -> list[str]:  # one result of the raw document
    found = []
    for item in result.get("warnings") or []:
        text = item.get("warning") if isinstance(item, dict) else item
        if isinstance(text, str) and text:
            found.append(text)
    return found


def diag_tests(document: dict[str, Any]) -> tuple[list[DcgmTest], str | None]:  # raw JSON, read defensively
    """Every test result of a `dcgmi diag -j` document (DCGM 1.x to 3.x under "DCGM GPU Diagnostic", 4.x under "DCGM
    Diagnostic"; null entries, which DCGM prints between tests, skipped) and DCGM's version."""
    top = document.get("DCGM GPU Diagnostic") or document.get("DCGM Diagnostic") or {}
    tests: list[DcgmTest] = []
    for category in top.get("test_categories") or []:
        if not isinstance(category, dict):
            continue
        for test in category.get("tests") or []:
            if not isinstance(test, dict):
                continue
            for result in test.get("results") or []:
                if not isinstance(result, dict):
                    continue
                gpus = next((result[k] for k in ("gpu_ids", "gpu_id", "entity_id") if k in result), "")
                tests.append({"category": str(category.get("category", "")), "test": str(test.get("name", "")),
                              "gpus": str(gpus), "status": str(result.get("status", "")).upper(), "warnings": _warnings(result)})
    metadata = document.get("metadata")
    # DCGM 4.x moved the version out of the results into "metadata" (NVIDIA/DCGM's testing/python3/dcgm_diag_schema.json).
    version = top.get("version") or (metadata.get("version") if isinstance(metadata, dict) else None)
    return tests, str(version) if version is not None else None


def judge_host(host: str, level: int, result: CommandResult) -> tuple[list[Finding], DcgmHost]:
    """PF851/PF852 and the report's account of one host's diagnostic."""
    if result.reached and result.exit_code == NOT_INSTALLED:
        entry: DcgmHost = {"host": host, "status": "not run", "message": "not run: dcgmi is not installed", "version": None, "tests": []}
        return [Finding("PF852", Status.passed, host, entry["message"])], entry
    if not result.reached:
        reason = (result.reason or "").lower()
        entry = {"host": host, "status": "timed out" if "time" in reason or "deadline" in reason else "error",
                 "message": f"dcgmi diag -r {level}: {result.reason}", "version": None, "tests": []}
        return [Finding("PF852", Status.warn, host, entry["message"], "run `dcgmi diag -r 1` by hand; is nv-hostengine running?")], entry
    document = parse_document(result.stdout)
    if document is None:
        why = last_line(result.stderr) or last_line(result.stdout) or f"exit status {result.exit_code}"
        entry = {"host": host, "status": "error", "message": f"dcgmi diag -r {level} printed no result: {why}", "version": None,
                 "tests": []}
        return [Finding("PF852", Status.warn, host, entry["message"], "run `dcgmi diag -r 1` by hand; is nv-hostengine running?")], entry
    tests, version = diag_tests(document)
    findings = []
    for test in tests:
        if test["status"] in ("FAIL", "WARN"):
            detail = f": {test['warnings'][0][:160]}" if test["warnings"] else ""
            findings.append(Finding("PF851", Status.fail if test["status"] == "FAIL" else Status.warn, host,
                                    f"DCGM {test['test']} {test['status']} on GPU {test['gpus']}{detail}",
                                    "fix what the test names and run `dcgmi diag -r 3`; drain the node on a hardware failure"))
    counts = {s: sum(1 for t in tests if t["status"] == s) for s in ("PASS", "FAIL", "WARN", "SKIP")}
    summary = f"dcgmi diag -r {level} (DCGM {version}): " + ", ".join(f"{n} {s.lower()}" for s, n in counts.items() if n)
    if not findings:
        findings.append(Finding("PF851", Status.passed, host, summary))
    entry = {"host": host, "status": "fail" if counts["FAIL"] else "pass", "message": summary, "version": version, "tests": tests}
    return findings, entry


def run_dcgm_stage(config: PreflightConfig, transport: Transport, records: Sequence[HostRecord],
                   activity: Activity | None = None) -> tuple[list[Finding], DcgmSection]:
    """`dcgmi diag -r LEVEL -j` on every host at once, each within dcgm.timeout_s; findings and the report section."""
    level = config.dcgm.level
    if activity is not None:
        activity.now("dcgm", f"dcgmi diag -r {level} on {hosts_phrase(len(records))}")
    commands = [RemoteCommand(host=r.host, argv=["sh", "-c", _RUN_DIAG, "sh", str(level)], timeout_s=config.dcgm.timeout_s)
                for r in records]
    findings: list[Finding] = []
    section: DcgmSection = {"level": level, "timeout_s": config.dcgm.timeout_s, "hosts": []}
    for record, result in zip(records, transport.run(commands, all_at_once=True), strict=True):
        more, entry = judge_host(record.host.name, level, result)
        findings += more
        section["hosts"].append(entry)
    return findings, section


def dcgm_text(dcgm: DcgmSection) -> list[Any]:
    """One line in the terminal: each host's outcome (the first 8), and the worst of them."""
    line = "; ".join(f"{h['host']}: {h['status']}" for h in dcgm["hosts"][:8]) + (" ..." if len(dcgm["hosts"]) > 8 else "")
    return [status_line("dcgm", _worst(dcgm), f"dcgmi diag -r {dcgm['level']}: {line}")]


def dcgm_html(dcgm: DcgmSection) -> str:
    """Its part of the HTML page: the worst outcome and each host's."""
    rows = [[escape(h["host"]), badge(h["status"])] for h in dcgm["hosts"]]
    return (f'<h2 id="dcgm">DCGM diagnostic</h2><p>{badge(_worst(dcgm))} <code>dcgmi diag -r {dcgm["level"]}</code> on '
            f"{len(dcgm['hosts'])} host(s), each within {dcgm['timeout_s']:g} s</p>" + table(("host", "outcome"), rows, "dcgm"))


def _worst(dcgm: DcgmSection) -> str:
    statuses = {h["status"] for h in dcgm["hosts"]}
    return "fail" if "fail" in statuses else "not run" if statuses <= {"not run"} else \
        "warn" if statuses & {"timed out", "error"} else "pass"


class DcgmStage:
    """DCGM's diagnostic on every reached host (PF851, PF852)."""

    name = "dcgm"
    codes = ("PF851", "PF852")
    needs_records = True
    reads: tuple[str, ...] = ()

    def run(self, context: StageContext) -> StageResult[DcgmSection]:
        findings, section = run_dcgm_stage(context.config, context.transport, context.records, context.activity)
        return StageResult(findings, section)


    def text(self, section: DcgmSection) -> list[Any]:
        return dcgm_text(section)

    def html(self, section: DcgmSection) -> str:
        return dcgm_html(section)

STAGE = DcgmStage()
