"""The report's whole JSON shape: the head every report holds (contracts.ReportHead) and each stage's section under the
stage's name, composed from the stage packages' own ``contracts`` modules.

It sits above the stages, beside their list (stage_list), so that the shapes below it import no stage: the stages and
the history read the head or their own sections, and only the report and the commands read the composed Report.
"""

from __future__ import annotations

from typing import TypedDict, cast

from preflight import spec
from preflight.collective.contracts import CollectiveSection
from preflight.connectivity.contracts import ConnectivitySection
from preflight.contracts import DcgmSection, ReportHead
from preflight.storage.contracts import StorageSection


class _EveryReportsSections(TypedDict):
    collective: CollectiveSection | None  # in every report: schema 2 had it


class StageSections(_EveryReportsSections, total=False):
    """Each stage's section of the report, under the stage's name (spec.Stage); None, in a report, for a stage the run
    did not perform. A new stage with a section adds its key here; the report schema is generated from it."""

    connectivity: ConnectivitySection | None  # schema 3 on
    dcgm: DcgmSection | None  # schema 5 on
    storage: StorageSection | None  # schema 6 on; None also when no path is configured


class Report(ReportHead, StageSections):
    """One run's report: what `check --json` prints and `state_dir/report.json` holds: its sections follow the
    findings, each present (None when the playbook did not run it) from the schema that added it on."""


def with_section(sections: StageSections, name: spec.Stage, section: object) -> StageSections:
    """sections with a stage's section added under the stage's name; the report's schema then validates its shape."""
    if name.value not in StageSections.__annotations__:
        raise RuntimeError(f"the {name.value} stage returned a section, but report_shape.StageSections has no {name.value!r} key")
    return cast(StageSections, {**sections, name.value: section})

