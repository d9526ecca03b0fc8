"""The report: one JSON document per run (schema-validated), a terminal table, an exit code."""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from preflight import __version__
from preflight.compose import Spec
from preflight.contracts import REPORT_SCHEMA_VERSION, HostEntry, ReportStatus
from preflight.errors import ExitCode
from preflight.findings import CLUSTER, Finding, Status, ordered, status_name, worst
from preflight.history import history_dir, new_path, rotate
from preflight.records import HostOutcome
from preflight.rendering import STYLE
from preflight.report_shape import Report, StageSections
from preflight.resources import validator
from preflight.stage_list import STAGES, load_stage, section_types
from preflight.stages import Stage

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


def build_report(spec: Spec, outcomes: Sequence[HostOutcome], findings: Sequence[Finding], started: dt.datetime, elapsed_s: float,
                 sections: StageSections | None = None) -> Report:
    """Assemble the report from the facts stage's outcomes, every finding, and the stages' sections by name (None for
    each stage not among them)."""
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
        **every_section(sections or StageSections(collective=None)),
    }
    validator("report").validate(report)
    return report


def section_keys() -> list[str]:
    """Every registered stage's section key, in the report's order: StageSections's keys, then each other stage's in
    the stage list's order (the order the report schema is written in)."""
    shipped = list(StageSections.__annotations__)
    return shipped + [name for name in section_types() if name not in shipped]


def with_section(sections: StageSections, name: str, section: object) -> StageSections:
    """sections with a stage's section added under the stage's name; the report's schema then validates its shape."""
    if name not in section_keys():
        raise RuntimeError(f"the {name} stage returned a section, but its entry in stage_list.STAGES names no section type")
    return cast(StageSections, {**sections, name: section})


def every_section(sections: StageSections) -> StageSections:
    """sections with every stage's key, in the schema's order: None for each stage absent from it."""
    present = cast(dict[str, object], sections)
    return cast(StageSections, {name: present.get(name) for name in section_keys()})


def report_text(report: Report) -> str:
    """The report as the JSON text that is saved and printed."""
    return json.dumps(report, indent=1, sort_keys=False) + "\n"


def save_report(report: Report, state_dir: str, text: str | None = None, keep: int = 100) -> Path:
    """Write the report (as text, when it is already rendered) into the state folder atomically (a temporary file,
    then rename): the latest, and a copy in the history, which keeps the newest `keep` (preflight.history)."""
    folder = Path(state_dir)
    folder.mkdir(parents=True, exist_ok=True)
    text = text or report_text(report)
    history = history_dir(folder)
    history.mkdir(exist_ok=True)
    for path in (new_path(history, report), folder / LATEST):
        write_atomically(path, text)
    rotate(history, keep)
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




def render(report: Report, show_all: bool = False) -> Any:
    """The report as rich renderables: findings table (root cause first) and a summary line."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    shown = [f for f in report["findings"] if show_all or f["status"] != "pass"]
    hidden = len(report["findings"]) - len(shown)
    # Four columns, the fix under its finding: at 80 columns a fifth squeezed both into a third of the width each.
    # Text wraps between words; only a word longer than the column (a very long path) is folded.
    table = Table(show_edge=False, pad_edge=False, expand=False)
    for column in ("status", "host", "code", "finding"):
        table.add_column(column, overflow="fold", no_wrap=column in ("status", "code"))
    for finding in shown:
        where = "(cluster)" if finding["host"] == CLUSTER else finding["host"]
        text = Text(finding["message"])
        if finding["remedy"]:
            text.append("\nfix: ", style="bold").append(finding["remedy"], style="dim")
        table.add_row(Text(finding["status"], style=STYLE[finding["status"]]), where, finding["code"], text)
    summary = verdict_line(report)
    parts: list[Any] = [table] if table.row_count else []
    for stage, section in stage_sections(report):
        parts += stage.text(section)
    if hidden:
        parts.append(Text(f"{hidden} passed check(s) not shown (--all shows them)", style="dim"))
    parts.append(summary)
    return Group(*parts)


def verdict_line(report: Report) -> Any:
    """The last line of the table alone (`--quiet`): the verdict, the cluster, its hosts, the time taken."""
    from rich.text import Text

    counts: dict[str, int] = {}
    for entry in report["hosts"]:
        counts[entry["status"]] = counts.get(entry["status"], 0) + 1
    per_status = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    collective = report["collective"]
    speed = collective.get("speed") if collective else None  # absent before schema 6
    # A pass says what it measured the speed against; without a reference the hosts were only judged against each other.
    judged = f"; {speed['reference_message']}" if speed and speed["reference"] == "none" else ""
    return Text.assemble((report["status"].upper(), STYLE[report["status"]]),
                         f"  {report['cluster']}: {len(report['hosts'])} host(s) ({per_status}), playbook {report['playbook']}, "
                         f"{report['elapsed_s']:.1f} s{judged}")


def console(stderr: bool = False) -> Any:
    """A rich console that styles only a terminal (or FORCE_COLOR) and never under NO_COLOR (https://no-color.org);
    its width is the terminal's (COLUMNS, else 80 when not a terminal)."""
    from rich.console import Console

    # Rich alone only drops the colours under NO_COLOR and keeps bold and dim: no styles at all is what users ask for.
    return Console(stderr=stderr, color_system=None if os.environ.get("NO_COLOR") else "auto")


def stage_sections(report: Report) -> list[tuple[Stage, Any]]:
    """Each stage with a section in the report, in the stage list's order: what it renders (a report of an older schema
    lacks the sections of later stages)."""
    sections = cast(dict[str, Any], report)  # each stage's section is under its name (the facts stage has none)
    return [(load_stage(name), sections[name]) for name in STAGES if sections.get(name)]
