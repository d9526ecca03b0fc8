"""What the facts stage hands on: for each host a record of its facts, or why it has none; and the readings of those
facts that the checks, the launch and emit-launch share.

It sits on the ground floor, beside the facts it holds: every stage above may import it, and it imports none of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from preflight.facts import HostFacts, Interface
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
class HostOutcome:
    """The facts stage's result for one host: a record to check, or why there is none."""

    host: HostSpec
    record: HostRecord | None
    problem: Finding | None  # PF001/PF002 when record is None


def has_driver(facts: HostFacts) -> bool:
    """Whether the host's NVIDIA driver could be read at all."""
    return facts["gpu"]["source"] != "none"


def find_interface(facts: HostFacts, name: str) -> Interface | None:
    """An interface of the host by name."""
    return next((i for i in facts["net"]["interfaces"] if i["name"] == name), None)


def configured_interface_name(host: HostSpec, config: PreflightConfig) -> str | None:
    """The socket interface the config names for a host, or None for auto."""
    name = host.interface if host.interface != "auto" else config.network.socket_ifname
    return None if name == "auto" else name


def resolve_backend(records: Sequence[HostRecord], config: PreflightConfig) -> Backend:
    """``auto`` means nccl where any reached host has a GPU, else gloo."""
    if config.training.backend != Backend.auto:
        return config.training.backend
    has_gpu = any(r.facts["gpu"]["devices"] for r in records)
    return Backend.nccl if has_gpu else Backend.gloo
