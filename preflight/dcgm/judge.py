"""Judging the dcgm stage's diagnostic, host by host: the JSON document of `dcgmi diag -r LEVEL -j`, parsed into a finding
per failed test and GPU (PF851). A host without dcgmi gets "not run" and nothing fails because of it; a diagnostic past
its deadline, or one that printed no document, is a warning (PF852).
"""

from __future__ import annotations

import json
from typing import Any

from preflight.dcgm.contracts import DcgmHost, DcgmTest
from preflight.errors import last_line
from preflight.findings import Finding, Status
from preflight.transport import CommandResult

NOT_INSTALLED = 127  # the exit status of the stage's shell line on a host without dcgmi (preflight.dcgm.stage)


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
