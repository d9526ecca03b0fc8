"""One run of ``preflight check``: Spec -> Facts -> Findings -> Report, in that order only."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any

from preflight.checks import run_checks
from preflight.compose import Spec
from preflight.gather import gather_facts
from preflight.report import build_report
from preflight.transport import CommandResult, HostRouter


def run_check(spec: Spec, on_result: Callable[[CommandResult], None] | None = None) -> dict[str, Any]:
    """Probe every host, run every check, and return the validated report."""
    started = dt.datetime.now(dt.timezone.utc)
    began = time.monotonic()
    transport = HostRouter(spec.config.ssh, on_result)
    try:
        outcomes = gather_facts(spec.config, transport)
    finally:
        transport.close()
    findings = run_checks([o.record for o in outcomes if o.record is not None], spec.config)
    return build_report(spec, outcomes, findings, started, time.monotonic() - began)
