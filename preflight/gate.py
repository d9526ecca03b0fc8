"""``preflight gate``: the node-local checks of a playbook on this machine, for a scheduler's pre-job gate.

A scheduler acts on two things: the exit code (errors.ExitCode) and one line it can keep as a drain
reason. A health check is killed after a minute and runs on every node, so the gate does no SSH and no
collective, imports nothing that costs seconds (never torch), saves no report, and starts the probe
before Hydra composes the config, so that the two overlap.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from preflight.errors import one_line

if TYPE_CHECKING:
    from preflight.report_shape import Report

GATE_PLAYBOOK = "playbook=gate"
# Slurm keeps a node's reason as given; a long one is unreadable in `sinfo -R`, and newlines break it.
REASON_MAX_CHARS = 160


@dataclass(frozen=True)
class GateResult:
    """The gate's report (as `check --json` would print it) and its drain line."""

    report: Report
    line: str


def drain_line(report: Report) -> str:
    """One line for a drain reason: the root cause first (shortened, never its count of others), or `ok` and the warnings."""
    findings = report["findings"]  # already root cause first
    bad = [f for f in findings if f["status"] in ("fail", "unknown")]
    if bad:
        first = bad[0]
        head, text = f"preflight: {first['code']} ", one_line(first["message"])
        others = sorted({f["code"] for f in bad[1:]})
        tail = f" (+{len(bad) - 1} more: {', '.join(others)})" if len(bad) > 1 else ""
    else:
        passed = sum(1 for f in findings if f["status"] == "pass")
        warned = sorted({f["code"] for f in findings if f["status"] == "warn"})
        head, text = "preflight: ok, ", f"{passed} checks passed on {report['hosts'][0]['name']}"
        tail = f"; warnings: {', '.join(warned)}" if warned else ""
    room = REASON_MAX_CHARS - len(head) - len(tail)
    if len(text) > room:
        text = text[:max(room - 3, 0)] + "..."
    return head + text + tail


def run_gate(overrides: Sequence[str], config_dir: str | None, host_name: str | None = None) -> GateResult:
    """Probe this machine, run the playbook's checks on it, and return the report and its drain line."""
    # Imported here so that a bad argument costs nothing; these are what the gate may pay for.
    from preflight.checks import run_checks
    from preflight.gather import read_facts
    from preflight.report import build_report
    from preflight.this_machine import compose_while_probing, probe_as_host

    started_at = dt.datetime.now(dt.timezone.utc)
    began = time.monotonic()
    spec, result = compose_while_probing([GATE_PLAYBOOK, *overrides], config_dir)
    host, result = probe_as_host(spec, result, host_name)
    outcome = read_facts(host, result)
    findings = run_checks([outcome.record] if outcome.record is not None else [], spec.config)
    report = build_report(spec, [outcome], findings, started_at, time.monotonic() - began)
    return GateResult(report=report, line=drain_line(report))
