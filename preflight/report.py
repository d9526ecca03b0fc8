"""The report: one JSON document per run (schema-validated), a terminal table, an exit code."""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from preflight import __version__
from preflight.compose import Spec
from preflight.contracts import CollectiveSection, ConnectivitySection, HostEntry, Report, ReportStatus
from preflight.errors import ExitCode
from preflight.findings import CLUSTER, Finding, Status, ordered, status_name, worst
from preflight.records import HostOutcome
from preflight.resources import validator

REPORT_SCHEMA_VERSION = 3
# Schema 3 added the connectivity section; a schema 2 report (no such key) is still read by emit-launch.
READABLE_REPORT_SCHEMAS = (2, 3)
LATEST = "report.json"  # in the state folder: the last report, which emit-launch reads

EXIT_CODES: dict[ReportStatus, int] = {"pass": ExitCode.PASSED, "fail": ExitCode.FAILED, "incomplete": ExitCode.INCOMPLETE}


def overall_status(findings: Sequence[Finding]) -> ReportStatus:
    """fail if anything failed; incomplete if something could not be checked; else pass."""
    statuses = {f.status for f in findings}
    if Status.fail in statuses:
        return "fail"
    if Status.unknown in statuses:
        return "incomplete"
    return "pass"


def build_report(
    spec: Spec, outcomes: Sequence[HostOutcome], findings: Sequence[Finding], started: dt.datetime, elapsed_s: float,
    collective: CollectiveSection | None = None, connectivity: ConnectivitySection | None = None,
) -> Report:
    """Assemble the report from the facts stage's outcomes and every finding."""
    every = ordered([*(o.problem for o in outcomes if o.problem is not None), *findings])
    statuses: dict[str, list[Status]] = {}
    for finding in every:
        statuses.setdefault(finding.host, []).append(finding.status)
    hosts: list[HostEntry] = []
    for outcome in outcomes:
        hosts.append({
            "name": outcome.host.name,
            "address": outcome.host.address,
            "status": status_name(worst(statuses.get(outcome.host.name, []))),
            "reason": outcome.problem.message if outcome.problem else None,
            "facts": outcome.record.facts if outcome.record else None,
        })
    status = overall_status(every)
    report: Report = {
        "schema": REPORT_SCHEMA_VERSION,
        "preflight_version": __version__,
        "created_at": started.isoformat(timespec="seconds"),
        "elapsed_s": round(elapsed_s, 3),
        "cluster": spec.config.cluster.name,
        "playbook": spec.config.playbook.name,
        "spec_digest": spec.digest,
        "config_digests": spec.group_digests(),
        "status": status,
        "exit_code": EXIT_CODES[status],
        "hosts": hosts,
        "findings": [f.to_json() for f in every],
        "collective": collective,
        "connectivity": connectivity,
    }
    validator("report").validate(report)
    return report


def report_text(report: Report) -> str:
    """The report as the JSON text that is saved and printed."""
    return json.dumps(report, indent=1, sort_keys=False) + "\n"


def save_report(report: Report, state_dir: str, text: str | None = None) -> Path:
    """Write the report (as text, when it is already rendered) into the state folder atomically (a temporary file,
    then rename)."""
    folder = Path(state_dir)
    folder.mkdir(parents=True, exist_ok=True)
    stamp = report["created_at"].replace(":", "").replace("-", "")
    text = text or report_text(report)
    kept = folder / "reports" / f"{stamp}-{report['cluster']}.json"
    kept.parent.mkdir(exist_ok=True)
    for path in (kept, folder / LATEST):
        write_atomically(path, text)
    return folder / LATEST


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    """Never leave a half-written file: write beside it, flush, then rename over it."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(handle, mode)  # mkstemp's 0600 would make a launch file unreadable to the job's user
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "hang": "bold red", "unknown": "magenta", "incomplete": "magenta"}


def render(report: Report, show_all: bool = False) -> Any:
    """The report as rich renderables: findings table (root cause first) and a summary line."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    shown = [f for f in report["findings"] if show_all or f["status"] != "pass"]
    hidden = len(report["findings"]) - len(shown)
    with_fix = any(f["remedy"] for f in shown)
    table = Table(show_edge=False, pad_edge=False, expand=False)
    for column in ("status", "host", "code", "finding", *(["fix"] if with_fix else [])):
        table.add_column(column, overflow="fold")
    for finding in shown:
        where = "(cluster)" if finding["host"] == CLUSTER else finding["host"]
        cells: list[Text | str] = [Text(finding["status"], style=_STYLE[finding["status"]]), where, finding["code"], finding["message"]]
        table.add_row(*cells, *([finding["remedy"]] if with_fix else []))
    counts: dict[str, int] = {}
    for entry in report["hosts"]:
        counts[entry["status"]] = counts.get(entry["status"], 0) + 1
    per_status = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    summary = Text.assemble(
        (report["status"].upper(), _STYLE[report["status"]]),
        f"  {report['cluster']}: {len(report['hosts'])} host(s) ({per_status}), playbook {report['playbook']}, "
        f"{report['elapsed_s']:.1f} s",
    )
    parts: list[Any] = [table] if table.row_count else []
    connectivity = report.get("connectivity")  # absent from schema 2 reports
    if connectivity and connectivity["status"] != "skipped":
        parts.append(Text.assemble(("connectivity ", "bold"), (connectivity["status"].upper(), _STYLE.get(connectivity["status"], "")),
                                   f"  {connectivity['message']} ({connectivity['elapsed_s']:.1f} s)"))
    collective = report["collective"]
    if collective and collective["status"] != "skipped":
        # The collective's outcome in one line, whatever the findings filter hides: it is the headline of a full check.
        verified = collective["verify"]
        detail = f" ({verified['bytes_per_rank']:,} B per rank, {verified['wrong']} wrong)" if verified else ""
        parts.append(Text.assemble(("collective ", "bold"), (collective["status"].upper(), _STYLE.get(collective["status"], "")),
                                   f"  {collective['message']}{detail}"))
    if collective and collective["sweep"]:
        sweep = Table(title=f"bandwidth ({collective['backend']}, {collective['world_size']} ranks; GB/s as nccl-tests)",
                      show_edge=False, pad_edge=False)
        for column in ("op", "bytes", "algbw mean", "busbw min", "busbw mean"):
            sweep.add_column(column, justify="right")
        for row in collective["sweep"]:
            sweep.add_row(row["op"], f"{row['bytes']:,}", f"{row['algbw_mean_GBps']:.3f}", f"{row['busbw_min_GBps']:.3f}",
                          f"{row['busbw_mean_GBps']:.3f}")
        parts.append(sweep)
    if hidden:
        parts.append(Text(f"{hidden} passed check(s) not shown (--all shows them)", style="dim"))
    parts.append(summary)
    return Group(*parts)
