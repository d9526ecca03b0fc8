"""Findings: what a check concluded about one host (or the cluster), with a stable code."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from traceback import format_exception

from preflight.contracts import FindingEntry, FindingStatus
from preflight.errors import one_line


class Status(str, Enum):
    """Nagios-like: ``unknown`` (could not check) is kept apart from ``fail``."""

    passed = "pass"
    warn = "warn"
    fail = "fail"
    unknown = "unknown"


_NAMES: dict[Status, FindingStatus] = {Status.passed: "pass", Status.warn: "warn", Status.fail: "fail", Status.unknown: "unknown"}


def status_name(status: Status) -> FindingStatus:
    """A status as the report spells it."""
    return _NAMES[status]


# Severity order used to sort findings (root cause first) and to roll up a host's status.
SEVERITY = {Status.fail: 0, Status.unknown: 1, Status.warn: 2, Status.passed: 3}

CLUSTER = "*"  # the host of a finding about the whole cluster (a cross-host check)


@dataclass(frozen=True)
class Finding:
    """One conclusion: code (``PFnnn``, see ``preflight explain``), status, host, what, and the fix."""

    code: str
    status: Status
    host: str
    message: str
    remedy: str = ""
    # Environment variables that avoid the failure at a cost (NCCL_P2P_DISABLE=1 for the 545 driver); emit-launch
    # sets them only with launch.allow_workarounds.
    workaround: dict[str, str] = field(default_factory=dict)
    traceback: str = ""  # an internal error's (INTERNAL_ERROR) traceback, kept in the saved report for a bug report

    def to_json(self) -> FindingEntry:
        """The report's form of this finding."""
        entry: FindingEntry = {"code": self.code, "status": status_name(self.status), "host": self.host, "message": self.message,
                               "remedy": self.remedy, "workaround": dict(self.workaround)}
        if self.traceback:
            entry["traceback"] = self.traceback
        return entry


# A check or stage that raised: its one line, status unknown (the run could not tell), the other checks and stages run.
INTERNAL_ERROR = "PF009"


def internal_error(where: str, host: str, error: Exception, switch_off: str) -> Finding:
    """The finding for an exception raised by a check or stage (where, e.g. "check dev_shm"), with its traceback;
    switch_off says how to run without it until it is fixed."""
    return Finding(INTERNAL_ERROR, Status.unknown, host, f"internal error in {where}: {type(error).__name__}: {one_line(error, 300)}",
                   f"a bug in preflight: {switch_off}, and report it with the traceback the saved report keeps",
                   traceback="".join(format_exception(error)))


def ordered(findings: list[Finding]) -> list[Finding]:
    """Root cause first: by severity, then by code (lower codes are more fundamental), then host."""
    return sorted(findings, key=lambda f: (SEVERITY[f.status], f.code, f.host))


def worst(statuses: list[Status]) -> Status:
    """The most severe status of several; pass when there are none."""
    return min(statuses, key=SEVERITY.__getitem__, default=Status.passed)
