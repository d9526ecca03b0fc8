"""The dcgm stage's part of the report: one line in the terminal (``text``), and on the HTML page each host's outcome
(``html``)."""

from __future__ import annotations

from html import escape
from typing import Any

from preflight.dcgm.contracts import DcgmSection
from preflight.rendering import badge, status_line, table


def text(dcgm: DcgmSection) -> list[Any]:
    """One line in the terminal: each host's outcome (the first 8), and the worst of them."""
    line = "; ".join(f"{h['host']}: {h['status']}" for h in dcgm["hosts"][:8]) + (" ..." if len(dcgm["hosts"]) > 8 else "")
    return [status_line("dcgm", _worst(dcgm), f"dcgmi diag -r {dcgm['level']}: {line}")]


def html(dcgm: DcgmSection) -> str:
    """Its part of the HTML page: the worst outcome and each host's."""
    rows = [[escape(h["host"]), badge(h["status"])] for h in dcgm["hosts"]]
    return (f'<h2 id="dcgm">DCGM diagnostic</h2><p>{badge(_worst(dcgm))} <code>dcgmi diag -r {dcgm["level"]}</code> on '
            f"{len(dcgm['hosts'])} host(s), each within {dcgm['timeout_s']:g} s</p>" + table(("host", "outcome"), rows, "dcgm"))


def _worst(dcgm: DcgmSection) -> str:
    statuses = {h["status"] for h in dcgm["hosts"]}
    return "fail" if "fail" in statuses else "not run" if statuses <= {"not run"} else \
        "warn" if statuses & {"timed out", "error"} else "pass"
