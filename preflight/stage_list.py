"""The stages of ``preflight check``, in the order a run performs them: one entry per stage, each a plain import.

It sits above every stage's module and below the report and the commands, so the architecture test sees each import
and would fail on a stage that imported the list. Each entry imports its stage's module only when it is called, so a
facts-only run never loads the collective's code (its modules cost more to import than the facts stage's). The
playbook's sweep and pairwise are parts of the collective stage and have no entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from preflight import spec
from preflight.collective.contracts import CollectiveSection
from preflight.connectivity.contracts import ConnectivitySection
from preflight.contracts import DcgmSection
from preflight.findings import INTERNAL_ERROR
from preflight.spec import PreflightConfig
from preflight.stages import Stage, stage_name
from preflight.storage.contracts import StorageSection


@dataclass(frozen=True)
class StageEntry:
    """One stage's registration: all the report, the schema generator and the renderers need to know of it."""

    load: Callable[[], Stage]  # its module's STAGE, the module imported only when called
    section: type | None = None  # its report section's TypedDict (its package's contracts); None: it has no section


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


# The playbook's name of each stage (its section's key in the report), and its entry; a stage runs after every stage
# it reads. Adding a stage is its package and one line here.
STAGES: dict[str, StageEntry] = {
    spec.Stage.facts: StageEntry(_facts),
    spec.Stage.dcgm: StageEntry(_dcgm, DcgmSection),
    spec.Stage.connectivity: StageEntry(_connectivity, ConnectivitySection),
    spec.Stage.collective: StageEntry(_collective, CollectiveSection),
    spec.Stage.storage: StageEntry(_storage, StorageSection),
}


def load_stage(name: str) -> Stage:
    """The stage called name, its module imported now."""
    stage = STAGES[name].load()
    if stage_name(stage.name) != stage_name(name):
        raise RuntimeError(f"the stage list's {stage_name(name)} entry is the {stage_name(stage.name)} stage")
    return stage


def section_types() -> dict[str, type]:
    """Each stage's section type, under its key in the report, in the list's order (stages without a section left out)."""
    return {stage_name(name): entry.section for name, entry in STAGES.items() if entry.section is not None}


def playbook_stages(config: PreflightConfig) -> list[Stage]:
    """The stages a run performs, in STAGES's order: facts always (every other stage reads its records), and those the
    playbook names. A stage named without an entry of its own (sweep, pairwise) is a part of the collective."""
    named = {stage_name(name) for name in config.playbook.stages}
    return [load_stage(name) for name in STAGES if name == spec.Stage.facts or stage_name(name) in named]


def all_codes() -> set[str]:
    """Every code a run may emit: each stage's (every stage's module imported), and the internal error's."""
    return {INTERNAL_ERROR} | {code for name in STAGES for code in load_stage(name).codes}
