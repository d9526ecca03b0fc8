"""A small stage defined outside preflight, to show that a stage is its package and one entry in the stage list: it
reports each reached host's hostname length (from the probe's facts) as its section, with one finding code, PF990, whose
remedy (its entry in remedies.yaml, beside this file) is the fix a failing finding carries."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

import yaml

from hostname_stage.contracts import HostnameLength, HostnameSection
from preflight.findings import Finding, Status
from preflight.rendering import badge, status_line, table
from preflight.stages import StageContext, StageResult

NAME = "hostname"
LONGEST = 63  # a DNS label's limit: a longer hostname is not one label
REMEDIES = Path(__file__).with_name("remedies.yaml")  # the package's remedy catalogue, named by its stage list entry


class HostnameStage:
    """Each reached host's hostname length (PF990)."""

    name = NAME
    codes = ("PF990",)
    needs_records = True
    reads: tuple[str, ...] = ()

    def run(self, context: StageContext) -> StageResult[HostnameSection]:
        fix = " ".join(yaml.safe_load(REMEDIES.read_text(encoding="utf-8"))["PF990"]["fix"].split())
        rows: list[HostnameLength] = []
        findings = []
        for record in context.records:
            hostname = record.facts["host"]["hostname"]
            rows.append({"host": record.host.name, "hostname": hostname, "length": len(hostname)})
            status = Status.fail if len(hostname) > LONGEST else Status.passed
            findings.append(Finding("PF990", status, record.host.name, f"hostname {hostname!r}: {len(hostname)} characters",
                                    fix if status == Status.fail else ""))
        return StageResult(findings, {"longest": LONGEST, "hosts": rows})

    def text(self, section: HostnameSection) -> list[Any]:
        line = "; ".join(f"{h['host']}: {h['length']}" for h in section["hosts"])
        worst = "fail" if any(h["length"] > section["longest"] for h in section["hosts"]) else "pass"
        return [status_line("hostname", worst, f"hostname lengths: {line}")]

    def html(self, section: HostnameSection) -> str:
        rows = [[escape(h["host"]), escape(h["hostname"]), str(h["length"]),
                 badge("fail" if h["length"] > section["longest"] else "pass")] for h in section["hosts"]]
        return '<h2 id="hostname">Hostname lengths</h2>' + table(("host", "hostname", "length", "outcome"), rows, "hostname")


STAGE = HostnameStage()
