"""Checks: pure functions ``(facts, spec) -> findings``; no I/O anywhere in this package."""

from __future__ import annotations

from collections.abc import Sequence

from preflight.checks import cross as _cross  # noqa: F401 - registers the cross-host checks
from preflight.checks import host as _host  # noqa: F401 - registers the per-host checks
from preflight.checks.registry import REGISTRY, ClusterView, HostRecord, all_codes
from preflight.findings import Finding
from preflight.spec import Backend, PreflightConfig

__all__ = ["ClusterView", "HostRecord", "all_codes", "evaluated", "resolve_backend", "run_checks"]


def resolve_backend(records: Sequence[HostRecord], config: PreflightConfig) -> Backend:
    """``auto`` means nccl where any reached host has a GPU, else gloo."""
    if config.training.backend != Backend.auto:
        return config.training.backend
    has_gpu = any(r.facts["gpu"]["devices"] for r in records)
    return Backend.nccl if has_gpu else Backend.gloo


def run_checks(records: Sequence[HostRecord], config: PreflightConfig) -> list[Finding]:
    """Every registered check over the reached hosts, as far as the playbook evaluates its codes."""
    view = ClusterView(config=config, backend=resolve_backend(records, config))
    findings: list[Finding] = []
    for entry in REGISTRY:
        if entry.host_check is not None:
            for record in records:
                findings.extend(entry.host_check(record, view))
        elif entry.cross_check is not None and len(records) > 1:
            findings.extend(entry.cross_check(records, view))
    return [f for f in findings if evaluated(f.code, config)]


def evaluated(code: str, config: PreflightConfig) -> bool:
    """Whether the playbook evaluates a finding code: among its checks (when it names any) and not skipped."""
    chosen = config.playbook.checks
    return (not chosen or code in chosen) and code not in config.playbook.skip_checks
