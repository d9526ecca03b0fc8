"""The stages of ``preflight check``, in the order a run performs them: one entry per stage, each a plain import.

It sits above every stage's module and below the report and the commands, so the architecture test sees each import
and would fail on a stage that imported the list. Each entry imports its stage's module only when it is called, so a
facts-only run never loads the collective's code (its modules cost more to import than the facts stage's). The
playbook's sweep and pairwise are parts of the collective stage: its entry names them as its options.

The playbook's stages are checked here, against this list, rather than in the config's types: a stage's package brings
its name with its entry, and a run refuses a name no entry knows before any host is touched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from preflight.collective.contracts import PAIRWISE, SWEEP, CollectiveSection
from preflight.connectivity.contracts import ConnectivitySection
from preflight.dcgm.contracts import DcgmSection
from preflight.errors import InputError
from preflight.findings import INTERNAL_ERROR
from preflight.spec import PreflightConfig
from preflight.stages import Stage
from preflight.storage.contracts import StorageSection


@dataclass(frozen=True)
class StageEntry:
    """One stage's registration: all the report, the schema generator and the renderers need to know of it."""

    load: Callable[[], Stage]  # its module's STAGE, the module imported only when called
    section: type | None = None  # its report section's TypedDict (its package's contracts); None: it has no section
    # Other names the playbook may list to switch on parts of this stage (the collective's sweep and pairwise); each
    # means nothing without the stage's own name.
    options: tuple[str, ...] = ()
    remedies: Path | None = None  # its remedy catalogue, in its package: an entry per code it emits (preflight explain)


_HERE = Path(__file__).resolve().parent


def _facts() -> Stage:
    from preflight.checks.stage import STAGE
    return STAGE


def _dcgm() -> Stage:
    from preflight.dcgm.stage import STAGE
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
    "facts": StageEntry(_facts, remedies=_HERE / "checks" / "remedies.yaml"),
    "dcgm": StageEntry(_dcgm, DcgmSection, remedies=_HERE / "dcgm" / "remedies.yaml"),
    "connectivity": StageEntry(_connectivity, ConnectivitySection, remedies=_HERE / "connectivity" / "remedies.yaml"),
    "collective": StageEntry(_collective, CollectiveSection, (SWEEP, PAIRWISE), _HERE / "collective" / "remedies.yaml"),
    "storage": StageEntry(_storage, StorageSection, remedies=_HERE / "storage" / "remedies.yaml"),
}
FACTS = "facts"  # the stage every run performs: every other stage reads its records


def load_stage(name: str) -> Stage:
    """The stage called name, its module imported now."""
    stage = STAGES[name].load()
    if stage.name != name:
        raise RuntimeError(f"the stage list's {name} entry is the {stage.name} stage")
    return stage


def section_types() -> dict[str, type]:
    """Each stage's section type, under its key in the report, in the list's order (stages without a section left out)."""
    return {name: entry.section for name, entry in STAGES.items() if entry.section is not None}


def known_names() -> list[str]:
    """Every name playbook.stages may give, in the list's order: each stage's, then its options'."""
    return [known for name, entry in STAGES.items() for known in (name, *entry.options)]


def playbook_stages(config: PreflightConfig) -> list[Stage]:
    """The stages a run performs, in STAGES's order: facts always (every other stage reads its records), and those the
    playbook names. A name no entry knows is bad input: InputError, before any stage's module is imported."""
    known = known_names()
    unknown = [name for name in config.playbook.stages if name not in known]
    if unknown:
        raise InputError(f"playbook.stages: unknown stage {unknown[0]!r} in playbook {config.playbook.name} "
                         f"(known: {', '.join(known)})")
    named = set(config.playbook.stages)
    return [load_stage(name) for name in STAGES if name == FACTS or name in named]


def all_codes() -> set[str]:
    """Every code a run may emit: each stage's (every stage's module imported), and the internal error's."""
    return {INTERNAL_ERROR} | {code for name in STAGES for code in load_stage(name).codes}


def remedy_files() -> list[Path]:
    """Each stage's remedies file, in the list's order (read by preflight.catalogue; no stage's module imported)."""
    return [entry.remedies for entry in STAGES.values() if entry.remedies is not None]
