"""Running the dcgm stage: `dcgmi diag -r LEVEL -j` on every host at once, each under dcgm.timeout_s, over the run's
connections; ``judge`` reads what each host printed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from preflight.dcgm.contracts import DcgmSection
from preflight.dcgm.judge import NOT_INSTALLED, judge_host
from preflight.findings import Finding
from preflight.interrupt import Activity, hosts_phrase
from preflight.records import HostRecord
from preflight.spec import PreflightConfig
from preflight.stages import StageContext, StageResult
from preflight.transport import RemoteCommand, Transport

# The level is an integer from the validated config, passed as an argument; NOT_INSTALLED says dcgmi is not there.
_RUN_DIAG = f'command -v dcgmi >/dev/null 2>&1 || exit {NOT_INSTALLED}; exec dcgmi diag -r "$1" -j'


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
        from preflight.dcgm.render import text
        return text(section)

    def html(self, section: DcgmSection) -> str:
        from preflight.dcgm.render import html
        return html(section)


STAGE = DcgmStage()
