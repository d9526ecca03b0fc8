"""The state folder's history: every report ``check`` (or ``agent``) saves is also kept in ``state_dir/history``, named
``<UTC time>-<cluster>.json`` so that names sort in time, at most ``history_keep`` of them (the oldest removed). The
baseline (preflight.collective.baseline, PF613) reads it back, newest first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

from preflight.contracts import ReportHead
from preflight.errors import InputError
from preflight.facts import HostFacts
from preflight.input_files import read_json_file

HISTORY = "history"


def history_dir(state_dir: str | Path) -> Path:
    """Where the state folder keeps its reports."""
    return Path(state_dir) / HISTORY


def new_path(folder: Path, report: ReportHead) -> Path:
    """A name for the report in the history that no other report has: its time, its cluster, and a count when two
    reports of one cluster share a second."""
    stamp = report["created_at"].replace(":", "").replace("-", "")
    path = folder / f"{stamp}-{report['cluster']}.json"
    count = 1
    while path.exists():
        count += 1
        path = folder / f"{stamp}-{report['cluster']}-{count}.json"
    return path


def _kept(folder: Path) -> list[Path]:
    """The history's reports, oldest first (the names start with the UTC time)."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix == ".json" and not p.name.startswith("."))


def rotate(folder: Path, keep: int) -> list[Path]:
    """Remove the oldest reports beyond keep; the ones removed."""
    kept = _kept(folder)
    removed = kept[:max(0, len(kept) - keep)]
    for path in removed:
        with contextlib.suppress(FileNotFoundError):  # another check rotating at the same moment
            path.unlink()
    return removed


def _cluster_reports(state_dir: str | Path, cluster: str) -> Iterator[ReportHead]:
    """Every kept report of the cluster, newest first; a file that is not JSON of a report of this cluster is passed over."""
    for path in reversed(_kept(history_dir(state_dir))):
        if f"-{cluster}" not in path.name:
            continue
        try:
            document = read_json_file(path, "report")
        except (OSError, InputError):  # too large, not UTF-8, not JSON, nested too deep: not a report to compare with
            continue
        if isinstance(document, dict) and document.get("cluster") == cluster and isinstance(document.get("hosts"), list):
            yield cast(ReportHead, document)


def passing_reports(state_dir: str | Path, cluster: str, wanted: int, match: Callable[[ReportHead], bool]) -> list[ReportHead]:
    """The last `wanted` reports of the cluster that passed and match, newest first. Only the top-level shape is checked
    here: whoever reads a stage's section (match, then the caller) must expect a report of another version."""
    found: list[ReportHead] = []
    for report in _cluster_reports(state_dir, cluster):
        if len(found) >= wanted:
            break
        if report.get("status") == "pass" and match(report):
            found.append(report)
    return found


def last_facts(state_dir: str | Path, cluster: str, reports: int = 5) -> dict[str, HostFacts]:
    """Each host's facts in the newest of the cluster's kept reports that has them (looking at most `reports` back),
    for the checks of what changed since (PF833). Facts of an older schema may lack sections: readers use .get."""
    found: dict[str, HostFacts] = {}
    for count, report in enumerate(_cluster_reports(state_dir, cluster)):
        if count >= reports:
            break
        for host in report.get("hosts", []):
            facts = host.get("facts")
            if isinstance(facts, dict) and host.get("name") not in found:
                found[host["name"]] = facts
    return found
