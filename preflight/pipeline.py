"""One run of ``preflight check``: Spec -> Facts -> Findings -> Report, in that order only."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any

from preflight.checks import evaluated, run_checks
from preflight.compose import Spec
from preflight.gather import gather_facts, run_ssh_config
from preflight.records import resolve_backend
from preflight.report import build_report
from preflight.spec import Stage
from preflight.transport import CommandResult, HostRouter


def run_check(spec: Spec, on_result: Callable[[CommandResult], None] | None = None) -> dict[str, Any]:
    """Probe every host, run every check, and return the validated report."""
    started = dt.datetime.now(dt.timezone.utc)
    began = time.monotonic()
    config = spec.config
    transport = HostRouter(run_ssh_config(config), on_result)
    collective = None
    try:
        outcomes = gather_facts(config, transport)
        records = [o.record for o in outcomes if o.record is not None]
        findings = run_checks(records, config)
        if Stage.collective in config.playbook.stages and records:
            # Imported here: the facts-only path (and the gate) never pays for it.
            from preflight.collective import run_collective_stage

            # The same connections as the facts stage: one per host for the whole run.
            more, collective = run_collective_stage(config, transport, resolve_backend(records, config), records,
                                                    sweep=Stage.sweep in config.playbook.stages)
            findings += [f for f in more if evaluated(f.code, config)]
    finally:
        transport.close()
    return build_report(spec, outcomes, findings, started, time.monotonic() - began, collective)
