"""The Stage protocol: what every stage of ``preflight check`` declares and how the pipeline runs it.

A stage is its module's ``STAGE``, registered in ``stage_list.STAGES``: its name (the playbook's ``spec.Stage`` value,
which is also its section's key in the report), the finding codes it may emit (``preflight explain`` must know each
one), whether it needs reached hosts, the earlier stages whose sections it reads, and ``run(context) -> StageResult``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar, cast

from preflight import spec
from preflight.contracts import StageSections
from preflight.errors import PreflightError
from preflight.findings import CLUSTER, Finding, internal_error
from preflight.interrupt import Activity
from preflight.records import HostRecord
from preflight.spec import Backend, PreflightConfig
from preflight.transport import HostRouter

SectionT = TypeVar("SectionT", covariant=True)


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
    sections: StageSections = field(default_factory=lambda: StageSections())  # the sections of the stages run before
    findings: Mapping[spec.Stage, Sequence[Finding]] = field(default_factory=dict)  # theirs, before the playbook's filter


class Stage(Protocol):
    """One stage of a run. Implemented by a class with these attributes and ``run``; the module's ``STAGE`` is one."""

    @property
    def name(self) -> spec.Stage:
        """The playbook's name for it; its report section, when it has one, is under this key."""

    @property
    def codes(self) -> tuple[str, ...]:
        """Every finding code it may emit."""

    @property
    def needs_records(self) -> bool:
        """Whether it needs a probed host: it is not run when no host could be probed."""

    @property
    def reads(self) -> tuple[spec.Stage, ...]:
        """Earlier stages whose sections or findings it reads; stage_list.STAGES runs them before it."""

    def run(self, context: StageContext) -> StageResult[object]:
        """The stage's findings and section."""


def run_stage(stage: Stage, context: StageContext) -> StageResult[object]:
    """The stage's result; where it raises, one INTERNAL_ERROR finding that says so, and the run goes on."""
    try:
        return stage.run(context)
    except PreflightError:
        raise  # said on purpose: the run cannot go on (a rendezvous port someone holds), with its exit code
    except Exception as e:  # a bug in one stage: the other stages still run
        name = stage.name.value
        return StageResult([internal_error(f"stage {name}", CLUSTER, e, f"leave {name} out of playbook.stages")])


def with_section(sections: StageSections, name: spec.Stage, section: object) -> StageSections:
    """sections with a stage's section added under the stage's name; the report's schema then validates its shape."""
    if name.value not in StageSections.__annotations__:
        raise RuntimeError(f"the {name.value} stage returned a section, but contracts.StageSections has no {name.value!r} key")
    return cast(StageSections, {**sections, name.value: section})

