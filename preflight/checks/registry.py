"""The check registry: every check declares the codes it can emit, so the remedy catalogue
can be proven complete, and runs as a pure function of facts and spec."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from preflight.facts import HostFacts
from preflight.findings import Finding, Status
from preflight.records import HostRecord, configured_interface_name
from preflight.spec import Backend, PreflightConfig


@dataclass(frozen=True)
class ClusterView:
    """What every check may read besides one host's facts."""

    config: PreflightConfig
    backend: Backend  # resolved: nccl or gloo, never auto
    # Each host's facts in the cluster's last kept report (state_dir/history), for checks of what changed since.
    previous: Mapping[str, HostFacts] = field(default_factory=dict)

    def pin(self, component: str) -> str:
        """The PEP 440 pin for a component, empty for any."""
        return str(getattr(self.config.pins, component))

    @property
    def uses_gpus(self) -> bool:
        """Whether the job runs on GPUs (nccl)."""
        return self.backend == Backend.nccl

    @property
    def several_hosts(self) -> bool:
        """Whether ranks on other hosts must reach this one's addresses (loopback is harmless only on one host)."""
        return len(self.config.cluster.hosts) > 1

    def configured_interface(self, record: HostRecord) -> str | None:
        """The socket interface the config names for this host, or None for auto."""
        return configured_interface_name(record.host, self.config)


def host_finding(code: str, status: Status, record: HostRecord, message: str, remedy: str = "",
                 workaround: dict[str, str] | None = None) -> Finding:
    """A finding about one reached host."""
    return Finding(code=code, status=status, host=record.host.name, message=message, remedy=remedy, workaround=workaround or {})


HostCheck = Callable[[HostRecord, ClusterView], Iterable[Finding]]
CrossCheck = Callable[[Sequence[HostRecord], ClusterView], Iterable[Finding]]


@dataclass(frozen=True)
class Registered:
    """A check with the codes it may emit."""

    codes: tuple[str, ...]
    host_check: HostCheck | None = None
    cross_check: CrossCheck | None = None


REGISTRY: list[Registered] = []


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


def check_codes() -> set[str]:
    """Every code the registered checks can emit."""
    return {code for entry in REGISTRY for code in entry.codes}
