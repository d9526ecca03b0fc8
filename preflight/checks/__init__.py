"""Checks: pure functions ``(facts, spec) -> findings``; no I/O anywhere in this package.

One module per code family: versions (PF1xx), node (PF2xx), network (PF3xx; its rails PF306-PF308 in rails, per rail),
gpu_health (PF4xx), cross (PF5xx, every host compared), and the GPU node's family PF8xx: xid (PF80x, the kernel log),
fabric (PF81x, NVLink and NVSwitch), topology (PF82x), infiniband (PF83x), gpu_nvml (PF860-PF870: clocks, temperature,
ECC mode, PCIe links, firmware, retired pages, MIG, recovery action). Importing a module registers its checks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from preflight.checks import (  # noqa: F401 - each registers its checks
    cross,
    fabric,
    gpu_health,
    gpu_nvml,
    infiniband,
    network,
    node,
    rails,
    topology,
    versions,
    xid,
)
from preflight.checks.registry import REGISTRY, ClusterView, Registered, check_codes
from preflight.facts import HostFacts
from preflight.findings import CLUSTER, INTERNAL_ERROR, Finding, internal_error
from preflight.records import HostRecord, resolve_backend
from preflight.spec import Backend, PreflightConfig

__all__ = ["ClusterView", "check_codes", "cross_check_codes", "evaluated", "run_checks", "run_cross_checks"]


def run_checks(records: Sequence[HostRecord], config: PreflightConfig,
               previous: Mapping[str, HostFacts] | None = None) -> list[Finding]:
    """Every registered check over the reached hosts, as far as the playbook evaluates its codes; previous holds each
    host's facts of the last kept report, where there is one. A check none of whose codes the playbook evaluates is not
    run at all (skip_checks switches off a check that crashes); a check that raises is one INTERNAL_ERROR finding."""
    view = ClusterView(config=config, backend=resolve_backend(records, config), previous=previous or {})
    findings: list[Finding] = []
    for entry in REGISTRY:
        if any(evaluated(code, config) for code in entry.codes):
            findings += _run_check(entry, records, view)
    return [f for f in findings if evaluated(f.code, config)]


def cross_check_codes() -> set[str]:
    """The codes the checks that compare hosts may emit."""
    return {code for entry in REGISTRY if entry.cross_check is not None for code in entry.codes}


def run_cross_checks(records: Sequence[HostRecord], config: PreflightConfig, backend: Backend) -> list[Finding]:
    """The checks that compare hosts, alone, over these hosts (emit-launch judges the hosts it keeps again)."""
    view = ClusterView(config=config, backend=backend)
    findings = [f for entry in REGISTRY if entry.cross_check is not None and any(evaluated(code, config) for code in entry.codes)
                for f in _run_check(entry, records, view)]
    return [f for f in findings if evaluated(f.code, config)]


def _run_check(entry: Registered, records: Sequence[HostRecord], view: ClusterView) -> list[Finding]:
    """One check's findings on every host (a host check) or across them (a cross check); where it raises, the one
    finding that says so, and the other hosts and checks still run."""
    switch_off = f"skip it with playbook.skip_checks=[{','.join(entry.codes)}]"
    findings: list[Finding] = []
    if entry.host_check is not None:
        for record in records:
            try:
                findings += list(entry.host_check(record, view))
            except Exception as e:  # a bug in one check
                findings.append(internal_error(f"check {entry.host_check.__name__}", record.host.name, e, switch_off))
    elif entry.cross_check is not None and len(records) > 1:
        try:
            findings += list(entry.cross_check(records, view))
        except Exception as e:  # a bug in one check
            findings.append(internal_error(f"check {entry.cross_check.__name__}", CLUSTER, e, switch_off))
    return findings


def evaluated(code: str, config: PreflightConfig) -> bool:
    """Whether the playbook evaluates a finding code: among its checks (when it names any; an internal error always
    is) and not skipped."""
    chosen = config.playbook.checks
    return (not chosen or code in chosen or code == INTERNAL_ERROR) and code not in config.playbook.skip_checks
