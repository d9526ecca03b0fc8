"""The Stage protocol: what every stage of ``preflight check`` declares and how the pipeline runs it.

A stage is its module's ``STAGE``, registered in ``stage_list.STAGES``: its name (as the playbook's stages give it,
and its section's key in the report), the finding codes it may emit (``preflight explain`` must know each
one), whether it needs reached hosts, the earlier stages whose sections or findings it reads, and
``run(context) -> StageResult``. A stage sees the sections and findings of the stages it declares it reads, and no
other's; every stage shares the probe's records (the hosts reached, with their facts).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from preflight.errors import PreflightError
from preflight.findings import CLUSTER, Finding, internal_error
from preflight.interrupt import Activity
from preflight.records import HostRecord, resolve_backend
from preflight.spec import Backend, PreflightConfig
from preflight.transport import HostRouter

SectionT = TypeVar("SectionT", covariant=True)
KeyT = TypeVar("KeyT", bound=str)
ValueT = TypeVar("ValueT")


class UndeclaredRead(RuntimeError):
    """A stage looked up an earlier stage's section or findings without naming that stage in its reads: a bug in it."""


class DeclaredReads(Mapping[KeyT, ValueT]):
    """The earlier stages' sections or findings as one stage sees them: only those of the stages it declares. Looking up
    another stage's raises UndeclaredRead rather than answer "not run", which would change the stage's verdict quietly."""

    def __init__(self, found: Mapping[KeyT, ValueT], reader: str, declared: Collection[str]) -> None:
        self._declared = frozenset(declared)
        self._keys = [key for key in found if key in self._declared]
        self._values = {key: found[key] for key in self._keys}
        self._reader = reader

    def __getitem__(self, key: KeyT) -> ValueT:
        if key not in self._declared:
            raise UndeclaredRead(f"the {self._reader} stage read the {key} stage's results without naming it in its reads")
        return self._values[key]

    def __iter__(self) -> Iterator[KeyT]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


@dataclass(frozen=True)
class StageResult(Generic[SectionT]):
    """What a stage found, and its section of the report (None for a stage without one, such as facts)."""

    findings: list[Finding]
    section: SectionT | None = None


@dataclass(frozen=True)
class StageContext:
    """What a stage may read: the run's config and connections, the reached hosts, and the earlier stages' results."""

    config: PreflightConfig
    transport: HostRouter  # the run's router: its connections, and what an interrupt must clean
    records: Sequence[HostRecord]  # the hosts the probe reached, with their validated facts
    backend: Backend  # resolved from the records: nccl or gloo, never auto
    activity: Activity  # what the run does now, for the line an interrupt prints
    # The sections of the stages run before, by stage name, each its stage's own type (its package's contracts).
    sections: Mapping[str, object] = field(default_factory=dict)
    findings: Mapping[str, Sequence[Finding]] = field(default_factory=dict)  # theirs, before the playbook's filter


class Stage(Protocol):
    """One stage of a run. Implemented by a class with these attributes and ``run``; the module's ``STAGE`` is one."""

    @property
    def name(self) -> str:
        """The playbook's name for it, its key in stage_list.STAGES; its report section is under this key."""

    @property
    def codes(self) -> tuple[str, ...]:
        """Every finding code it may emit."""

    @property
    def needs_records(self) -> bool:
        """Whether it needs a probed host: it is not run when no host could be probed."""

    @property
    def reads(self) -> tuple[str, ...]:
        """Earlier stages whose sections or findings it reads; stage_list.STAGES runs them before it."""

    def run(self, context: StageContext) -> StageResult[object]:
        """The stage's findings and section."""

    def text(self, section: Any) -> list[Any]:  # its own section type; rich renderables
        """Its report section in the terminal, under the findings table (a stage without a section: none)."""

    def html(self, section: Any) -> str:  # its own section type
        """Its report section's part of the HTML page, escaped ("" for none)."""


def run_stage(stage: Stage, context: StageContext) -> StageResult[object]:
    """The stage's result; where it raises, one INTERNAL_ERROR finding that says so, and the run goes on."""
    try:
        return stage.run(context)
    except PreflightError:
        raise  # said on purpose: the run cannot go on (a rendezvous port someone holds), with its exit code
    except Exception as e:  # a bug in one stage: the other stages still run
        return StageResult([internal_error(f"stage {stage.name}", CLUSTER, e, f"leave {stage.name} out of playbook.stages")])


def declared_context(stage: Stage, config: PreflightConfig, transport: HostRouter, records: Sequence[HostRecord],
                     activity: Activity, sections: Mapping[str, object], findings: Mapping[str, Sequence[Finding]]) -> StageContext:
    """The context the pipeline hands stage: every earlier stage's sections and findings cut to those it reads."""
    return StageContext(config, transport, records, resolve_backend(records, config), activity,
                        # a read-only Mapping at run time, not a dict: a stage looks its sections up, never changes them
                        DeclaredReads(sections, stage.name, stage.reads),
                        DeclaredReads(findings, stage.name, stage.reads))

