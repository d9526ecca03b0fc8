"""The facts stage: every registered check over the hosts the probe reached (the probe itself is gather.py's)."""

from __future__ import annotations

from typing import Any

from preflight.checks import check_codes, run_checks
from preflight.history import last_facts
from preflight.stages import StageContext, StageResult

# What gather.py says of a host it could not read: unreachable (PF001), or a probe that failed (PF002).
PROBE_CODES = ("PF001", "PF002")


class FactsStage:
    """The per-host and cross-host checks; a check of what changed reads the cluster's last kept facts."""

    name = "facts"
    needs_records = True
    reads: tuple[str, ...] = ()

    @property
    def codes(self) -> tuple[str, ...]:
        return (*PROBE_CODES, *sorted(check_codes()))

    def run(self, context: StageContext) -> StageResult[object]:
        config = context.config
        return StageResult(run_checks(context.records, config, last_facts(config.state_dir, config.cluster.name)))


    def text(self, section: Any) -> list[Any]:
        return []  # the facts are every host's entry, rendered by the report itself

    def html(self, section: Any) -> str:
        return ""

STAGE = FactsStage()
