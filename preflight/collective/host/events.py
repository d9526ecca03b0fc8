"""What the ranks and their supervisor print, one JSON object a line (their types: preflight/collective/wire.py), and
the bandwidth formulas; the orchestrator imports these too, so torch is imported by none of them."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from preflight.collective.wire import (
        Event,
    )


EVENT_PREFIX = "PREFLIGHT "
PHASES = ("init", "identity", "verify", "compute", "neighbours", "sweep", "finish")
# Where the compute probe's slices are timed: the first in its own phase, the next at the end of the neighbour test, the
# rest at the end of the sweep (see Rank._compute_slices).
COMPUTE_POINTS = ("compute", "neighbours", "sweep")
SWEEP_OPS = ("all_gather", "all_reduce")
EXIT_OK, EXIT_ERROR, EXIT_TIMEOUT = 0, 1, 3

# Correction factors from algbw to busbw, as nccl-tests defines them (doc/PERFORMANCE.md), for the ops the sweep runs.
_BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
}
# torchrun's --tee puts "[default0]:" before each line a worker prints; the event is still whole after it.
_EVENT_LINE = re.compile(r"^(?:\[[^\]\s]*\]:)?" + re.escape(EVENT_PREFIX) + r"(\{.*\})\s*$")



# ---------------------------------------------------------------------------------------------------------------------
# Events: what the ranks and their supervisor print, one JSON object a line (their types: preflight/collective/wire.py)


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' factor from algorithm bandwidth to bus bandwidth for this op over world_size ranks."""
    if op not in _BUS_FACTORS:
        raise ValueError(f"unknown collective {op!r}; known: {', '.join(sorted(_BUS_FACTORS))}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, not {world_size}")
    return _BUS_FACTORS[op](world_size)


def algbw_gbps(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 bytes, as nccl-tests): size / time of one operation."""
    if seconds <= 0:
        raise ValueError(f"an operation's time must be positive, not {seconds}")
    return size_bytes / seconds / 1e9


def busbw_gbps(op: str, size_bytes: int, seconds: float, world_size: int) -> float:
    """Bus bandwidth in GB/s: algbw times nccl-tests' factor for op, comparable with the hardware's peak."""
    return algbw_gbps(size_bytes, seconds) * bus_factor(op, world_size)


def event_line(event: Event) -> bytes:
    """One event as the line parse_lines reads back."""
    return (EVENT_PREFIX + json.dumps(event, separators=(",", ":")) + "\n").encode()


def parse_lines(text: str) -> list[dict[str, Any]]:  # raw JSON from a host, typed by whoever reads it
    """The events in any stdout: every line that is EVENT_PREFIX and a JSON object; other lines are ignored."""
    events = []
    for line in text.splitlines():
        match = _EVENT_LINE.match(line)
        if match is None:
            continue
        try:
            event = json.loads(match.group(1))
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events



def one_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:500]


def env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None or not value.isdigit():
        raise ValueError(f"{name} must be set by torchrun to a number, not {value!r}")
    return int(value)
