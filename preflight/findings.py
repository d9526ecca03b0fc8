"""Findings: what a check concluded about one host (or the cluster), with a stable code."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from preflight.contracts import FindingEntry, FindingStatus


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

    def to_json(self) -> FindingEntry:
        """The report's form of this finding."""
        return {"code": self.code, "status": status_name(self.status), "host": self.host, "message": self.message,
                "remedy": self.remedy, "workaround": dict(self.workaround)}


def ordered(findings: list[Finding]) -> list[Finding]:
    """Root cause first: by severity, then by code (lower codes are more fundamental), then host."""
    return sorted(findings, key=lambda f: (SEVERITY[f.status], f.code, f.host))


def worst(statuses: list[Status]) -> Status:
    """The most severe status of several; pass when there are none."""
    return min(statuses, key=SEVERITY.__getitem__, default=Status.passed)
