"""The report's whole JSON shape: the head every report holds (contracts.ReportHead) and each stage's section under the
stage's name, composed from the stage packages' own ``contracts`` modules.

It sits above the stages, beside their list (stage_list), so that the shapes below it import no stage: the stages and
the history read the head or their own sections, and only the report and the commands read the composed Report.
"""

from __future__ import annotations

from typing import TypedDict

from preflight.collective.contracts import CollectiveSection
from preflight.connectivity.contracts import ConnectivitySection
from preflight.contracts import ReportHead
from preflight.dcgm.contracts import DcgmSection
from preflight.storage.contracts import StorageSection


class _EveryReportsSections(TypedDict):
    collective: CollectiveSection | None  # in every report: schema 2 had it


class StageSections(_EveryReportsSections, total=False):
    """The shipped stages' sections of the report, each under its stage's name; None, in a report, for a stage the run
    did not perform. The stage list's entry names a stage's section type (stage_list.STAGES), which is all a new stage
    needs: the report, its schema and its renderers take each registered section from there, in these keys' order first.
    A key here gives the report's readers typed access to a section, and a test holds it to the entry's type."""

    connectivity: ConnectivitySection | None  # schema 3 on
    dcgm: DcgmSection | None  # schema 5 on
    storage: StorageSection | None  # schema 6 on; None also when no path is configured


class Report(ReportHead, StageSections):
    """One run's report: what `check --json` prints and `state_dir/report.json` holds: its sections follow the
    findings, each present (None when the playbook did not run it) from the schema that added it on."""

