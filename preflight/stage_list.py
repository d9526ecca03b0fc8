"""The stages of ``preflight check``, in the order a run performs them: one entry per stage, each a plain import.

It sits above every stage's module and below the report and the commands, so the architecture test sees each import
and would fail on a stage that imported the list. Each entry imports its stage's module only when it is called, so a
facts-only run never loads the collective's code (its modules cost more to import than the facts stage's). The
playbook's sweep and pairwise are parts of the collective stage and have no entry.
"""

from __future__ import annotations

from collections.abc import Callable

from preflight import spec
from preflight.findings import INTERNAL_ERROR
from preflight.spec import PreflightConfig
from preflight.stages import Stage


def _facts() -> Stage:
    from preflight.checks.stage import STAGE
    return STAGE


def _dcgm() -> Stage:
    from preflight.dcgm import STAGE
    return STAGE


def _connectivity() -> Stage:
    from preflight.connectivity.stage import STAGE
    return STAGE


def _collective() -> Stage:
    from preflight.collective.stage import STAGE
    return STAGE


def _storage() -> Stage:
    from preflight.storage.stage import STAGE
    return STAGE


# The playbook's name of each stage, and its module's STAGE; a stage runs after every stage it reads.
STAGES: dict[spec.Stage, Callable[[], Stage]] = {
    spec.Stage.facts: _facts,
    spec.Stage.dcgm: _dcgm,
    spec.Stage.connectivity: _connectivity,
    spec.Stage.collective: _collective,
    spec.Stage.storage: _storage,
}


def load_stage(name: spec.Stage) -> Stage:
    """The stage called name, its module imported now."""
    stage = STAGES[name]()
    if stage.name != name:
        raise RuntimeError(f"the stage list's {name.value} entry is the {stage.name.value} stage")
    return stage


def playbook_stages(config: PreflightConfig) -> list[Stage]:
    """The stages a run performs, in STAGES's order: facts always (every other stage reads its records), and those the
    playbook names. A stage named without an entry of its own (sweep, pairwise) is a part of the collective."""
    named = set(config.playbook.stages)
    return [load_stage(name) for name in STAGES if name == spec.Stage.facts or name in named]


def all_codes() -> set[str]:
    """Every code a run may emit: each stage's (every stage's module imported), and the internal error's."""
    return {INTERNAL_ERROR} | {code for name in STAGES for code in load_stage(name).codes}
