"""The check registry: every check declares the codes it can emit, so the remedy catalogue
can be proven complete, and runs as a pure function of facts and spec."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from preflight.facts import HostFacts
from preflight.findings import Finding
from preflight.spec import Backend, HostSpec, PreflightConfig


@dataclass(frozen=True)
class HostRecord:
    """One reached host: its spec, its facts, and bounds on its clock's offset from ours."""

    host: HostSpec
    facts: HostFacts
    # (low, high) bounds on host clock minus local clock, from the probe's timestamp and
    # the command's round trip; None when the transport measured no round trip.
    clock_offset_s: tuple[float, float] | None = None


@dataclass(frozen=True)
class ClusterView:
    """What every check may read besides one host's facts."""

    config: PreflightConfig
    backend: Backend  # resolved: nccl or gloo, never auto

    def pin(self, component: str) -> str:
        """The PEP 440 pin for a component, empty for any."""
        return str(getattr(self.config.pins, component))


HostCheck = Callable[[HostRecord, ClusterView], Iterable[Finding]]
CrossCheck = Callable[[Sequence[HostRecord], ClusterView], Iterable[Finding]]


@dataclass(frozen=True)
class Registered:
    """A check with the codes it may emit."""

    codes: tuple[str, ...]
    host_check: HostCheck | None = None
    cross_check: CrossCheck | None = None


REGISTRY: list[Registered] = []

# Codes made by stages rather than checks: a host that could not be probed, and the collective.
STAGE_CODES = ("PF001", "PF002", "PF601", "PF602", "PF604", "PF605", "PF606")


def host_check(*codes: str) -> Callable[[HostCheck], HostCheck]:
    """Register a per-host check that may emit ``codes``."""

    def register(fn: HostCheck) -> HostCheck:
        REGISTRY.append(Registered(codes=codes, host_check=fn))
        return fn

    return register


def cross_check(*codes: str) -> Callable[[CrossCheck], CrossCheck]:
    """Register a check over all reached hosts that may emit ``codes``."""

    def register(fn: CrossCheck) -> CrossCheck:
        REGISTRY.append(Registered(codes=codes, cross_check=fn))
        return fn

    return register


def all_codes() -> set[str]:
    """Every code preflight can emit."""
    return {code for entry in REGISTRY for code in entry.codes} | set(STAGE_CODES)
