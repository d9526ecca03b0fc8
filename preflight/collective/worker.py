"""preflight's per-rank worker, started by torchrun on every host: init, identity, verify, compute, neighbours, sweep, finish.

The collective copies this one file to each host and runs ``python -m torch.distributed.run ... worker.py '<config json>'``,
so it imports the standard library and torch only, never preflight. It reports on stdout in lines that start with
EVENT_PREFIX, each one JSON object (see parse_lines): a ``phase`` line when each phase starts, then exactly one of
``result`` (exit 0), ``error`` (exit 1) or ``timeout`` (exit 3, from the watchdog: a hung collective cannot be
interrupted any other way). A rank that fails tells its peers through torchrun's store, and they stop at once with an
``error`` whose ``after`` names it (see PeerWatch). Every event's shape is a TypedDict in preflight/collective/wire.py
(PhaseEvent, ResultEvent, ErrorEvent, TimeoutEvent, CutEvent), imported here for the type checker only. The formulas and
parse_lines are imported by the orchestrator, so torch is imported only inside the functions that need it.

``worker.py supervise NPROC '<config json>' -- <torchrun argv>`` is the host's side of the launch: it runs torchrun in
a session of its own, relays its output, and cuts what a rank cannot cut itself (see Supervisor). Under ``preflight
agent`` the hosts are ranks of one launch already, and the supervisor runs ``worker.py ranks`` instead of torchrun: it
starts the host's ranks itself (see ranks_main).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import IO, TYPE_CHECKING, Any, Literal, TypeVar

if TYPE_CHECKING:
    import torch

    # The config and event types, for the type checker only: a host runs this file alone, without preflight.
    from preflight.collective.wire import (
        ComputeResult,
        ErrorEvent,
        Event,
        Identity,
        LinkResult,
        PeerFailure,
        ResultEvent,
        SweepResult,
        TimeoutEvent,
        VerifyResult,
        WorkerConfigJson,
    )

H = TypeVar("H", bound=Hashable)  # a host, by index (the ranks) or by name (the judge)
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
_PARENT_POLL_S = 0.5
_OUTPUT_LOCK_WAIT_S = 5.0
_MASK32 = 0xFFFFFFFF


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


# The sizes stop growing when two doublings in a row each gained less than this (busbw of the slowest rank): the link is
# full, and bigger messages would only cost time. Three sizes at least are always measured.
PLATEAU_GAIN = 0.05
# Nor do they grow past a size whose one iteration took the slowest rank this many times the size's time budget (1 s at
# the default 0.05 s): the next doubling would take twice as long an iteration, through a link far below what the larger
# sizes are there to measure (a 40 Mbit/s host made one sweep of 6 hosts last a minute), and the figure at this size
# already says how slow it is.
LONGEST_STEP_BUDGETS = 20
# A link of the neighbour test sends at most this many messages (1 GB at gloo's 1 MiB): a budget far above the default's.
NEIGHBOUR_MAX_MESSAGES = 1000


def plateaued(busbw: Sequence[float]) -> bool:
    """Whether a sweep whose busbw per size (ascending) is busbw has stopped gaining."""
    if len(busbw) < 3:
        return False
    return busbw[-1] < busbw[-2] * (1 + PLATEAU_GAIN) and busbw[-2] < busbw[-3] * (1 + PLATEAU_GAIN)


def sweep_bytes(op: str, size_bytes: int, world_size: int) -> int:
    """The bytes a sweep step really moves: size rounded down so that every rank's share is whole float32 elements."""
    if op not in SWEEP_OPS:
        raise ValueError(f"the sweep runs {', '.join(SWEEP_OPS)}, not {op!r}")
    unit = 4 * world_size
    return size_bytes // unit * unit


def neighbour_phases(count: int) -> list[list[tuple[int, int]]]:
    """The neighbour test's ring between count hosts (indices in rank order), in phases, as NCCL's ring diagnostics:
    each host sends to its ring neighbour (i -> i+1), even to odd, then odd to even, and the ring's closing link on its
    own when the count is odd, so that the links of a phase run at once without sharing a host. Every host has two
    partners (one with two hosts); the suspects are then measured again (repeat_plan)."""
    return lay_out([(i, (i + 1) % count) for i in range(count)])


def lay_out(links: Sequence[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Links laid into phases greedily in their order, no host in two links of a phase."""
    phases: list[list[tuple[int, int]]] = []
    busy: list[set[int]] = []
    for link in dict.fromkeys(link for link in links if link[0] != link[1]):
        free = next((k for k, used in enumerate(busy) if not used & set(link)), None)
        if free is None:
            phases.append([])
            busy.append(set())
            free = len(phases) - 1
        phases[free].append(link)
        busy[free].update(link)
    return phases


def pair_round_phases(rounds: Sequence[Sequence[tuple[int, int]]]) -> list[list[tuple[int, int]]]:
    """The pairwise stage's rounds (disjoint pairs of host indices each) as phases of the neighbour test: each round's
    pairs one way at once (a -> b), then the other way (b -> a), so that a pair's two directions are timed apart and
    its slower one is its figure."""
    return [phase for pairs in rounds for phase in lay_out([*pairs, *((b, a) for a, b in pairs)])]


def next_chunk(budget_s: float, elapsed_s: float, sent: int) -> int:
    """How many messages a link of the neighbour test sends next, after sent messages in elapsed_s: one to start with;
    none once the budget is spent (when less than half a message's time is left) or NEIGHBOUR_MAX_MESSAGES were sent;
    else as many as the rate so far fits in what is left, but at most as many as were sent already, so that an early
    message timed too fast (a socket buffer taking it whole) at most doubles the time before the rate is measured again."""
    if sent == 0:
        return 1
    per_message = elapsed_s / sent
    left = budget_s - elapsed_s
    if sent >= NEIGHBOUR_MAX_MESSAGES or left < per_message / 2:
        return 0
    return max(1, min(sent, round(left / per_message) if per_message > 0 else sent, NEIGHBOUR_MAX_MESSAGES - sent))


def peers_median(measured: Sequence[tuple[Hashable, Hashable, float]]) -> float:
    """The yardstick of the neighbour test: the median over hosts of each host's best link (sending or receiving), so
    that a slow host, which takes part in two of a 4-host ring's four links, does not drag it down with it. 0 for no
    links."""
    best: dict[Hashable, float] = {}
    for src, dst, rate in measured:
        best[src], best[dst] = max(rate, best.get(src, 0.0)), max(rate, best.get(dst, 0.0))
    ordered = sorted(best.values())
    return (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) / 2 if ordered else 0.0


def repeat_plan(count: int, measured: Sequence[tuple[int, int, float]], suspect_fraction: float, repeats: int
                ) -> list[list[tuple[int, int, str]]]:
    """The neighbour test's repeats, when anything is a suspect: per repeat, a whole ring shifted to other partners
    (host i sends to i + shift, a shift of 2, 3, ... so that each host sends to and receives from hosts it has not met
    in the ring), each link tagged "round"; and every suspect link measured again, tagged "link". A host's sending is a
    suspect when its best link sending (of those measured: the ring and any pair rounds) is under suspect_fraction of
    the peers' median (peers_median), its receiving likewise; a link, when it is under that (and not in the round
    already). Every host is measured in every repeat, so each repeat has its own yardstick, measured at the same moment
    as the suspects' figures (repeat_ratios). A host that sends slowly is slow again with every receiver; a neighbour
    that only received from it is fast with its other senders. No suspect: no repeat. Every rank computes the same plan
    from the same gathered figures."""
    if not measured or repeats < 1 or count < 2:
        return []
    # A link measured twice (the ring's and a pair round's) and fast once is no suspect: its best figure is judged.
    sends, receives, links = _suspects(measured, suspect_fraction)
    suspect_links = sorted(links)
    if not (sends or receives or links):
        return []
    # Shifts 2, 3, ..., count - 1, then 1 (the ring's own): new partners first, as many as there are.
    shifts = [*range(2, count), 1]
    plan: list[list[tuple[int, int, str]]] = []
    for r in range(repeats):
        ring = [(i, (i + shifts[r % len(shifts)]) % count) for i in range(count)]
        plan.append([*((a, b, "round") for a, b in dict.fromkeys(ring)), *((a, b, "link") for a, b in suspect_links if (a, b) not in ring)])
    return plan


def rails_plan(count: int, measured: Mapping[int, Sequence[tuple[int, int, float]]], suspect_fraction: float, repeats: int
               ) -> list[list[tuple[int, int, str]]]:
    """The repeats of a launch whose ranks are bound to rails, per rail its figures (rail -> (src, dst, GB/s)): each rail's
    suspects are its own (repeat_plan on its figures, against its own median), and a repeat measures every rail's at once,
    each rank on its own rail, so the repeat's links are the union of the rails' (a shifted ring is the same on every rail)."""
    plans = [repeat_plan(count, figures, suspect_fraction, repeats) for figures in measured.values()]
    merged: list[list[tuple[int, int, str]]] = []
    for r in range(max((len(plan) for plan in plans), default=0)):
        merged.append(list(dict.fromkeys(link for plan in plans if r < len(plan) for link in plan[r])))
    return merged


def _median(values: Sequence[float]) -> float | None:
    ordered = sorted(values)
    return (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) / 2 if ordered else None


def _suspects(measured: Sequence[tuple[H, H, float]], suspect_fraction: float) -> tuple[set[H], set[H], set[tuple[H, H]]]:
    """The suspects of the first figures: the hosts whose best link sending is under suspect_fraction of the peers'
    median, those whose best link receiving is, and the links whose best figure is."""
    line = suspect_fraction * peers_median(measured)
    sending: dict[H, float] = {}
    receiving: dict[H, float] = {}
    fastest: dict[tuple[H, H], float] = {}
    for src, dst, rate in measured:
        sending[src], receiving[dst] = max(rate, sending.get(src, 0.0)), max(rate, receiving.get(dst, 0.0))
        fastest[(src, dst)] = max(rate, fastest.get((src, dst), 0.0))
    return ({h for h, rate in sending.items() if rate < line}, {h for h, rate in receiving.items() if rate < line},
            {link for link, rate in fastest.items() if rate < line})


def repeat_ratios(measured: Sequence[tuple[H, H, float]], again: Sequence[tuple[H, H, int, str, float]],
                  suspect_fraction: float) -> list[float | None]:
    """Each figure of one repeat, (src, dst, phase, "round" or "link", GB/s), as a ratio of what it is judged against:
    the lower of the median of the repeat's round (its shifted ring) and the median of the other links of its own phase,
    both without the links of a host suspect both ways (with four hosts, half a round's links would be a slow host's
    own). Both were measured beside the figure, the phase to the same tenth of a second: on a shared machine the same
    link varies tenfold from one second to the next, and a loaded moment slows every link of a phase alike; so a figure
    is slow only where it is slow beside its round and beside its phase. None: nothing to judge it against."""
    sends, receives, _ = _suspects(measured, suspect_fraction)
    both = sends & receives
    ring = [rate for _, _, _, of, rate in again if of == "round"]
    round_yard = _median([rate for src, dst, _, of, rate in again if of == "round" and src not in both and dst not in both] or ring)
    out: list[float | None] = []
    for k, (_, _, phase, _, rate) in enumerate(again):
        mates = _median([r for j, (src, dst, p, _, r) in enumerate(again) if j != k and p == phase and src not in both and dst not in both])
        yards = [y for y in (round_yard, mates) if y]
        out.append(rate / min(yards) if yards else None)
    return out


def settled(measured: Sequence[tuple[int, int, float]], again: Sequence[tuple[int, int, int, str, float]], suspect_fraction: float) -> bool:
    """Whether a repeat left nothing to measure again: no suspect of the first figures (a host's sending, its receiving,
    a link) was under suspect_fraction in it (repeat_ratios, as the judge takes them). A suspect back at speed once is
    noise whatever later repeats say, as a deficit must hold in every repeat: so the repeats stop there."""
    sends, receives, links = _suspects(measured, suspect_fraction)
    for (src, dst, _, of, _), ratio in zip(again, repeat_ratios(measured, again, suspect_fraction), strict=True):
        slow = ratio is not None and ratio < suspect_fraction
        if slow and ((of == "round" and (src in sends or dst in receives)) or (src, dst) in links):
            return False
    return True


def cgroup_throttled_s(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> float | None:
    """Seconds this process's CPU cgroup has been held back by its quota so far (cgroup v1 cpu.stat's throttled_time, v2's
    throttled_usec); None where no cpu.stat can be read. A quota (a container's CPU limit, a cgroup's cfs_quota_us) shows
    here whatever else loads the host: the compute probe says how much of its time the quota took."""
    try:
        with open(proc_cgroup, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    candidates = []
    for line in lines:
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if "cpu" in controllers.split(","):
            candidates += [f"{root}/cpu{path}", f"{root}/cpu,cpuacct{path}"]
        elif controllers == "":
            candidates.append(f"{root}{path}" if path != "/" else root)
    for folder in candidates:
        try:
            with open(os.path.join(folder, "cpu.stat"), encoding="utf-8") as f:
                stat = dict(line.split() for line in f.read().splitlines() if len(line.split()) == 2)
        except (OSError, ValueError):
            continue
        if "throttled_time" in stat:
            return int(stat["throttled_time"]) / 1e9
        if "throttled_usec" in stat:
            return int(stat["throttled_usec"]) / 1e6
    return None


def identity_problems(identity: Sequence[Identity]) -> list[str]:
    """What the gathered identities say is wrong: one GPU used by two ranks, torch or NCCL versions that differ."""
    problems = []
    by_gpu: dict[str, list[Identity]] = {}
    for who in identity:
        if who["gpu_uuid"]:
            by_gpu.setdefault(who["gpu_uuid"], []).append(who)
    # GPU UUIDs are unique worldwide, so one UUID under two cluster host names is one machine listed twice.
    for uuid, ranks in sorted(by_gpu.items()):
        if len(ranks) > 1:
            problems.append(f"GPU {uuid} is used by ranks {_rank_list(ranks)} on {', '.join(_host_list(ranks))}: "
                            "each rank needs its own GPU (LOCAL_RANK must pick the CUDA device)")
    keys: tuple[tuple[Literal["torch", "nccl"], str], ...] = (("torch", "torch"), ("nccl", "NCCL"))
    for key, name in keys:
        by_version: dict[str, list[Identity]] = {}
        for who in identity:
            version = who[key]
            if version is not None:
                by_version.setdefault(version, []).append(who)
        if len(by_version) > 1:
            listed = "; ".join(f"{version} on {_host_summary(ranks)}" for version, ranks in sorted(by_version.items()))
            problems.append(f"{name} versions differ between ranks: {listed}")
    return problems


def _rank_list(ranks: Sequence[Identity]) -> list[int]:
    return sorted(who["rank"] for who in ranks)


def _host_list(ranks: Sequence[Identity]) -> list[str]:
    return sorted({who["host"] for who in ranks})


def _host_summary(ranks: Sequence[Identity], shown: int = 5) -> str:
    hosts = _host_list(ranks)
    more = f" and {len(hosts) - shown} more" if len(hosts) > shown else ""
    return ", ".join(hosts[:shown]) + more


# ---------------------------------------------------------------------------------------------------------------------
# Configuration


# Every key of the config and of its sweep, each required (preflight/collective/wire.py's WorkerConfigJson and
# SweepConfig, which a test holds these to): a key that is missing or unknown is refused, as a misspelt one would
# otherwise leave a default in its place and a test silently out.
CONFIG_KEYS = ("run_id", "backend", "seed", "host", "deadlines_s", "verify_bytes", "sweep", "compute_s", "neighbour_s",
               "neighbour_bytes", "suspect_fraction", "repeats", "neighbour_ring", "pair_rounds", "rails")
SWEEP_KEYS = ("sizes", "ops", "warmup", "iters", "time_per_size_s")
MAX_RAILS = 64  # as many as the config allows (preflight.spec.Rails)


@dataclass(frozen=True)
class WorkerConfig:
    """argv[1] of the worker, validated (its JSON: preflight/collective/wire.py's WorkerConfigJson)."""

    run_id: str  # names the launch; it is in every worker's command line, so `pgrep -f` finds a run's processes
    backend: str  # nccl or gloo
    seed: int  # with the rank, derives the verified payload
    host: str  # the cluster's name for this host, in every event
    deadlines_s: dict[str, float]  # per phase, from the phase's start
    verify_bytes: int  # payload per rank of the verified all_gather
    sweep_sizes: list[int]  # total bytes per message, as nccl-tests counts them; empty: no sweep
    sweep_ops: list[str]
    warmup: int  # untimed iterations per size
    iters: int  # timed iterations per size; with a time budget, at most this many
    # Adaptive: the timed iterations fill about this many seconds per size (at least 1, at most iters), and the sizes stop
    # growing once busbw has plateaued; None: every size, iters iterations each.
    time_per_size_s: float | None
    compute_s: float  # the compute probe's matmuls fill about this long; 0: no probe
    neighbour_s: float  # each phase of the neighbour test sends for about this long; 0: no neighbour test
    neighbour_bytes: int  # per message of the neighbour test
    # A host's sending or receiving, or a link, under this fraction of the median link is a suspect (repeat_plan).
    suspect_fraction: float
    repeats: int  # each suspect is measured again this many times; 0: none
    neighbour_ring: bool  # the ring; False: only the pair rounds (a launch of the pairwise stage)
    # The pairwise stage's rounds, measured after the ring (pair_round_phases): per round, its disjoint pairs of hosts
    # (the cluster's names); empty: none.
    pair_rounds: list[list[tuple[str, str]]]
    rails: int  # rails per host, each local rank bound to one (preflight/rail_env.py); 0: one interface

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        """Parse and validate; ValueError names the key that is wrong, missing or unknown."""
        try:
            parsed = json.loads(text)
        except ValueError as e:
            raise ValueError(f"the worker's config is not JSON: {e}") from None
        _keys(parsed, CONFIG_KEYS)
        _keys(parsed["sweep"], SWEEP_KEYS, "sweep.")
        _keys(parsed["deadlines_s"], PHASES, "deadlines_s.")
        data: WorkerConfigJson = parsed
        backend = _field(data["backend"], str, "backend")
        if backend not in ("nccl", "gloo"):
            raise ValueError(f"backend must be nccl or gloo, not {backend!r}")
        deadlines = data["deadlines_s"]
        for phase in PHASES:
            value = deadlines[phase]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"deadlines_s.{phase} must be a positive number of seconds, not {value!r}")
        sweep = data["sweep"]
        sizes = _field(sweep["sizes"], list, "sweep.sizes")
        if not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes):
            raise ValueError(f"sweep.sizes must be positive integers, not {sizes!r}")
        ops = _field(sweep["ops"], list, "sweep.ops")
        if not all(op in SWEEP_OPS for op in ops):
            raise ValueError(f"sweep.ops must be among {', '.join(SWEEP_OPS)}, not {ops!r}")
        warmup, iters = _field(sweep["warmup"], int, "sweep.warmup"), _field(sweep["iters"], int, "sweep.iters")
        if warmup < 0 or iters < 1:
            raise ValueError(f"sweep.warmup must be >= 0 and sweep.iters >= 1, not {warmup} and {iters}")
        budget = sweep["time_per_size_s"]
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget <= 0):
            raise ValueError(f"sweep.time_per_size_s must be a positive number of seconds or null, not {budget!r}")
        compute_s, neighbour_s = _seconds(data["compute_s"], "compute_s"), _seconds(data["neighbour_s"], "neighbour_s")
        suspect_fraction = data["suspect_fraction"]
        if isinstance(suspect_fraction, bool) or not isinstance(suspect_fraction, (int, float)) or not 0 <= suspect_fraction <= 1:
            raise ValueError(f"suspect_fraction must be a number from 0 to 1, not {suspect_fraction!r}")
        repeats = data["repeats"]
        if isinstance(repeats, bool) or not isinstance(repeats, int) or not 0 <= repeats <= 20:
            raise ValueError(f"repeats must be an integer from 0 to 20, not {repeats!r}")
        neighbour_bytes = data["neighbour_bytes"]
        if isinstance(neighbour_bytes, bool) or not isinstance(neighbour_bytes, int) or neighbour_bytes < 4:
            raise ValueError(f"neighbour_bytes must be an integer of at least 4, not {neighbour_bytes!r}")
        ring = data["neighbour_ring"]
        if not isinstance(ring, bool):
            raise ValueError(f"neighbour_ring must be true or false, not {ring!r}")
        pair_rounds = data["pair_rounds"]
        if not isinstance(pair_rounds, list) or not all(
                isinstance(pairs, list) and all(isinstance(pair, list) and len(pair) == 2 and all(isinstance(h, str) for h in pair)
                                                for pair in pairs) for pairs in pair_rounds):
            raise ValueError(f"pair_rounds must be a list of rounds, each a list of [host, host] pairs, not {pair_rounds!r}")
        rails = data["rails"]
        if isinstance(rails, bool) or not isinstance(rails, int) or not 0 <= rails <= MAX_RAILS:
            raise ValueError(f"rails must be an integer from 0 to {MAX_RAILS}, not {rails!r}")
        verify_bytes = _field(data["verify_bytes"], int, "verify_bytes")
        if verify_bytes < 4:
            raise ValueError(f"verify_bytes must be at least 4 (one int32 element), not {verify_bytes}")
        return cls(run_id=_field(data["run_id"], str, "run_id"), backend=backend, seed=_field(data["seed"], int, "seed"),
                   host=_field(data["host"], str, "host"), deadlines_s={p: float(deadlines[p]) for p in PHASES},
                   verify_bytes=verify_bytes, sweep_sizes=list(sizes), sweep_ops=list(ops), warmup=warmup, iters=iters,
                   time_per_size_s=None if budget is None else float(budget), compute_s=compute_s, neighbour_s=neighbour_s,
                   neighbour_bytes=neighbour_bytes, suspect_fraction=float(suspect_fraction), repeats=repeats,
                   neighbour_ring=ring, pair_rounds=[[(a, b) for a, b in pairs] for pairs in pair_rounds], rails=rails)


def _keys(data: object, keys: Sequence[str], where: str = "") -> None:
    """data is a JSON object with exactly these keys: none missing (no key has a default), none unknown (a misspelt one)."""
    if not isinstance(data, dict):
        raise ValueError(f"{where.rstrip('.') or 'the config'} must be a JSON object, not {data!r}")
    missing, unknown = [where + k for k in keys if k not in data], sorted(where + str(k) for k in data if k not in keys)
    problems = ([f"lacks {', '.join(missing)}"] if missing else []) + \
        ([f"has unknown key(s) {', '.join(unknown)} (known: {', '.join(where + k for k in keys)})"] if unknown else [])
    if problems:
        raise ValueError("the worker's config " + "; ".join(problems))


def _seconds(value: object, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{key} must be a number of seconds, at least 0, not {value!r}")
    return float(value)


def _field(value: object, kind: type, key: str) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{key} must be a {kind.__name__}, not {value!r}")
    return value


# ---------------------------------------------------------------------------------------------------------------------
# Output and watchdog


class Output:
    """Writes event lines whole, even when several local ranks share one stdout pipe."""

    def __init__(self, lock_path: str) -> None:
        self.lock_path = lock_path

    def emit(self, event: Event) -> None:
        """Write one event line and flush it."""
        data = event_line(event)
        with self._locked():
            sys.stdout.flush()
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(sys.stdout.fileno(), view):]
            except OSError:
                # The reader is gone (the orchestrator was cut): nobody is left to tell, and the watchdog still bounds the run.
                return

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # A pipe write longer than PIPE_BUF (4 KiB; rank 0's result with every identity) can be interleaved with the other
        # local ranks' writes: all ranks of a host take a lock beside worker.py. Bounded, so a stuck writer cannot stop a
        # timeout event.
        try:
            fd = os.open(self.lock_path, os.O_WRONLY | os.O_CREAT, 0o600)
        except OSError:
            yield
            return
        try:
            give_up = time.monotonic() + _OUTPUT_LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > give_up:
                        break
                    time.sleep(0.002)
                except OSError:
                    break  # a filesystem without locks: lines short enough are still whole
            yield
        finally:
            os.close(fd)


class Watchdog:
    """Ends the process when a phase overruns its deadline, or when the process that started it is gone."""

    def __init__(self, parent_pid: int, on_timeout: Callable[[str, float], None]) -> None:
        self.parent_pid = parent_pid
        self.on_timeout = on_timeout
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._phase: str | None = None
        self._deadline_s = 0.0
        self._expires: float | None = None
        self._exit_code = EXIT_TIMEOUT
        self._thread = threading.Thread(target=self._watch, name="preflight-watchdog", daemon=True)

    def start(self) -> None:
        """Start watching; no deadline until arm()."""
        self._thread.start()

    def arm(self, phase: str | None, deadline_s: float, *, exit_code: int = EXIT_TIMEOUT) -> None:
        """From now, deadline_s for phase; phase None overruns silently (cleanup after an event that already stands)."""
        with self._lock:
            self._phase = phase
            self._deadline_s = deadline_s
            self._expires = time.monotonic() + deadline_s
            self._exit_code = exit_code
        self._changed.set()

    def _watch(self) -> None:
        while True:
            with self._lock:
                phase, deadline_s, expires, exit_code = self._phase, self._deadline_s, self._expires, self._exit_code
            now = time.monotonic()
            if expires is not None and now >= expires:
                if phase is not None:
                    self.on_timeout(phase, deadline_s)
                os._exit(exit_code)
            if os.getppid() != self.parent_pid:
                # torchrun is gone, and with it whoever would read our output or stop us.
                os._exit(EXIT_TIMEOUT)
            wait = _PARENT_POLL_S if expires is None else min(_PARENT_POLL_S, expires - now)
            self._changed.wait(wait)
            self._changed.clear()


class PeerWatch:
    """Tells the other ranks of the launch when this one fails, and stops this one when another does.

    A rank whose init fails (a missing interface, an unreachable peer) never joins gloo's or NCCL's rendezvous, and its
    peers would wait there until their init deadline: once per launch, so once per round when splitting a failing set.
    The first rank to fail writes its error under a key of torchrun's agent store; every rank keeps a second client
    of that store blocked on the key (no polling: the store answers when the key is set), and ends the moment it is.
    Only under torchrun's shared agent store (TORCHELASTIC_USE_AGENT_STORE): without it the store lives in rank 0's
    process, and the phase deadlines alone bound the wait."""

    def __init__(self, run_id: str, wait_s: float, post_s: float) -> None:
        self.key = f"preflight/{run_id}/failed"
        self.wait_s = wait_s
        self.post_s = post_s

    @staticmethod
    def _endpoint() -> tuple[str, int] | None:
        host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or not host or not port.isdigit():
            return None
        return host, int(port)

    def _client(self, timeout_s: float) -> Any:
        from torch.distributed import TCPStore  # type: ignore[attr-defined]  # torch's stub leaves it out of __all__

        endpoint = self._endpoint()
        if endpoint is None:
            return None
        return TCPStore(endpoint[0], endpoint[1], is_master=False, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)

    def start(self, on_peer_failed: Callable[[PeerFailure], None]) -> None:
        """Call on_peer_failed(what the failing rank posted) from a thread of its own once any rank posts."""
        if self._endpoint() is not None:
            threading.Thread(target=self._watch, args=(on_peer_failed,), name="preflight-peers", daemon=True).start()

    def _watch(self, on_peer_failed: Callable[[PeerFailure], None]) -> None:
        try:
            store = self._client(self.wait_s)
            store.wait([self.key], timedelta(seconds=self.wait_s))
            failed = _peer_failure(json.loads(store.get(self.key)))
        except Exception:
            # The store is gone (the launch is over) or never answered: the phase deadlines still bound this rank.
            return
        if failed is not None:
            on_peer_failed(failed)

    def post(self, failed: PeerFailure) -> None:
        """Tell the peers; the first rank to fail is the one they hear of. Best effort, within post_s."""
        try:
            store = self._client(self.post_s)
            if store is not None and store.add(self.key + "/count", 1) == 1:
                store.set(self.key, json.dumps(failed))
        except Exception:
            traceback.print_exc()


def _peer_failure(posted: object) -> PeerFailure | None:
    """What a peer posted, when it has the shape post() gives it."""
    if not isinstance(posted, dict):
        return None
    rank, host, phase, error = posted.get("rank"), posted.get("host"), posted.get("phase"), posted.get("error")
    if isinstance(rank, int) and isinstance(host, str) and isinstance(phase, str) and isinstance(error, str):
        return {"rank": rank, "host": host, "phase": phase, "error": error}
    return None


def die_with_parent() -> None:
    """On Linux, have the kernel SIGKILL this process when its parent dies.

    torch elastic starts workers in a new session, so killing torchrun's process group does not reach them."""
    if not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


# ---------------------------------------------------------------------------------------------------------------------
# The verified payload (torch is imported inside)


def payload(seed: int, rank: int, elements: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Rank's int32 payload: a bijective hash of the element index keyed by (seed, rank), so every element differs
    from its neighbours and from the same element of every other rank, on any device and torch version."""
    import torch

    key = seed * 1000003 + rank
    offset = (key * 0x9E3779B1) & _MASK32
    # Every product stays below 2**63: int64 never overflows, so CPU and CUDA agree exactly.
    v = (torch.arange(elements, dtype=torch.int64, device=device) + offset) & _MASK32
    v = (v * 0x2545F491) & _MASK32
    v = v ^ (v >> 16)
    v = (v * 0x045D9F3B) & _MASK32
    v = v ^ (v >> 16)
    return (v - (1 << 31)).to(torch.int32)


def count_wrong(received: torch.Tensor, seed: int, world_size: int) -> tuple[int, dict[int, int]]:
    """Wrong elements in an all_gather's output (every rank's payload in rank order): the total and, for each
    source rank with any, its count."""
    import torch

    if received.dim() != 1 or received.numel() % world_size:
        raise ValueError(f"received must be 1-D with a multiple of {world_size} elements, not shape {tuple(received.shape)}")
    elements = received.numel() // world_size
    # One expected chunk at a time, so the check needs memory for one rank's payload, not the whole world's.
    counts = torch.stack([torch.ne(received[src * elements:(src + 1) * elements], payload(seed, src, elements, received.device)).sum()
                          for src in range(world_size)]).tolist()
    by_source = {src: int(n) for src, n in enumerate(counts) if n}
    return sum(by_source.values()), by_source


def all_gather_json(value: Any, world_size: int, device: torch.device | str = "cpu") -> list[Any]:
    """Every rank's JSON-able value, in rank order. torch's all_gather_object decodes through numpy, which torch does
    not require: in an environment without it (a fresh venv with only torch) every rank failed with "Numpy is not
    available". JSON bytes in uint8 tensors, padded to the longest, need nothing but torch."""
    import torch
    import torch.distributed as dist

    data = json.dumps(value).encode()
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world_size)]
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64, device=device))
    longest = max(int(size.item()) for size in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8, device=device)
    mine[:len(data)] = torch.tensor(list(data), dtype=torch.uint8, device=device)
    chunks = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(world_size)]
    dist.all_gather(chunks, mine)
    return [json.loads(bytes(chunk[:int(size.item())].tolist())) for chunk, size in zip(chunks, sizes, strict=True)]


# ---------------------------------------------------------------------------------------------------------------------
# The run


class Worker:
    """One rank's run through the phases."""

    def __init__(self, config: WorkerConfig, rank: int, local_rank: int, world_size: int, *, started: float, parent_pid: int,
                 output: Output) -> None:
        self.config = config
        self.rank = rank
        self.local_rank = local_rank
        self.world_size = world_size
        self.started = started
        self.output = output
        self.watchdog = Watchdog(parent_pid, self._timed_out)
        # The launch cannot outlast every phase's deadline; posting must leave the finish deadline time to spare.
        self.peers = PeerWatch(config.run_id, wait_s=sum(config.deadlines_s.values()), post_s=min(10.0, config.deadlines_s["finish"] / 2))
        self._end_lock = threading.Lock()
        self._ended = False
        self.phase: str = PHASES[0]
        self.phases_s: dict[str, float] = {}
        self.hostname = socket.gethostname()
        self.gpu_uuid: str | None = None
        self.torch_version = ""
        self.nccl_version: str | None = None
        self.identity: list[Identity] = []
        self.problems: list[str] = []
        # Replaced by the verify phase, which every result comes after.
        self.verify: VerifyResult = {"bytes": 0, "elements": 0, "wrong": 0, "wrong_by_source_rank": {}}
        self.sweep: list[SweepResult] = []
        self.import_s = 0.0
        self.compute: ComputeResult | None = None
        self._matmul: tuple[Any, Any, Any] = (None, None, None)  # the compute probe's operands and output, kept for its slices
        self.links: list[LinkResult] = []
        self.pair_links: list[LinkResult] = []
        # The rail this rank's wrapper bound it to (preflight/rail_env.py's rail_of, the same rule).
        ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE") or local_rank + 1)
        self.rail = local_rank * config.rails // max(ranks_here, 1) if config.rails else 0

    def _t(self) -> float:
        return round(time.monotonic() - self.started, 3)

    def _conclude(self, event: ResultEvent | ErrorEvent | TimeoutEvent) -> bool:
        """Emit this rank's one final event (result, error or timeout), unless another thread already has."""
        with self._end_lock:
            if self._ended:
                return False
            self._ended = True
        self.output.emit(event)
        return True

    def _timed_out(self, phase: str, deadline_s: float) -> None:
        self._conclude({"event": "timeout", "phase": phase, "rank": self.rank, "local_rank": self.local_rank, "host": self.config.host,
                        "pid": os.getpid(), "deadline_s": deadline_s, "t": self._t()})

    def _peer_failed(self, failed: PeerFailure) -> None:
        stopped: ErrorEvent = {"event": "error", "phase": self.phase, "rank": self.rank, "local_rank": self.local_rank,
                               "host": self.config.host, "pid": os.getpid(), "t": self._t(), "after": failed,
                               "error": f"stopped: rank {failed['rank']} on {failed['host']} failed in {failed['phase']}"}
        if self._conclude(stopped):
            os._exit(EXIT_ERROR)

    def _enter(self, phase: str) -> None:
        self.phase = phase
        self.output.emit({"event": "phase", "phase": phase, "rank": self.rank, "local_rank": self.local_rank, "host": self.config.host,
                          "pid": os.getpid(), "t": self._t()})
        self.watchdog.arm(phase, self.config.deadlines_s[phase])

    def run(self) -> int:
        """All phases; the exit code."""
        self.watchdog.start()
        steps = {"init": self._init, "identity": self._identity, "verify": self._verify, "compute": self._compute,
                 "neighbours": self._neighbours, "sweep": self._sweep, "finish": self._finish}
        try:
            # Importing torch takes seconds: torchrun's start-up allowance covers it, no phase deadline does.
            import torch.distributed  # noqa: F401

            self.import_s = self._t()
            self.peers.start(self._peer_failed)
            for phase in PHASES:
                begun = time.monotonic()
                self._enter(phase)
                steps[phase]()
                if phase in COMPUTE_POINTS[1:]:
                    self._compute_slices(phase)
                self.phases_s[phase] = round(time.monotonic() - begun, 3)
        except Exception as e:
            # Cleanup after an error gets the finish deadline; its overrun adds nothing to the error already reported.
            self.watchdog.arm(None, self.config.deadlines_s["finish"], exit_code=EXIT_ERROR)
            traceback.print_exc()
            error: ErrorEvent = {"event": "error", "phase": self.phase, "rank": self.rank, "local_rank": self.local_rank,
                                 "host": self.config.host, "pid": os.getpid(), "error": _one_line(e), "t": self._t(),
                                 "unix_s": time.time()}
            if self._conclude(error):
                self.peers.post({"rank": self.rank, "host": self.config.host, "phase": self.phase, "error": error["error"]})
            return EXIT_ERROR
        finally:
            _destroy_if_initialized()
        if not self._conclude(self._result()):
            return EXIT_ERROR  # a peer failed first; this rank is stopping with that error
        # The way out can still hang (a flush into a pipe nobody reads any more); the result already stands.
        self.watchdog.arm(None, self.config.deadlines_s["finish"], exit_code=EXIT_OK)
        return EXIT_OK

    def _device(self) -> torch.device:
        import torch

        return torch.device("cuda", self.local_rank) if self.config.backend == "nccl" else torch.device("cpu")

    def _sync(self) -> None:
        import torch

        # gloo's collectives return when they are done; NCCL's return when they are queued on the GPU.
        if self.config.backend == "nccl":
            torch.cuda.synchronize(self.local_rank)

    def _init(self) -> None:
        import torch
        import torch.distributed as dist

        # The process group's timeout also bounds every later collective, so it must not cut a phase with a longer
        # deadline short: the watchdog enforces each phase's own deadline.
        timeout = timedelta(seconds=max(self.config.deadlines_s.values()))
        if self.config.backend == "nccl":
            # A rank on another rank's GPU is the classic ncclInvalidUsage: bind the device before NCCL sees it.
            torch.cuda.set_device(self.local_rank)
            dist.init_process_group("nccl", timeout=timeout, device_id=self._device())
        else:
            dist.init_process_group("gloo", timeout=timeout)
        if dist.get_world_size() != self.world_size or dist.get_rank() != self.rank:
            raise RuntimeError(f"the process group has rank {dist.get_rank()} of {dist.get_world_size()}, "
                               f"torchrun said {self.rank} of {self.world_size}")

    def _identity(self) -> None:
        import torch

        self.torch_version = torch.__version__
        if self.config.backend == "nccl":
            self.gpu_uuid = str(torch.cuda.get_device_properties(self.local_rank).uuid)
            version = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
            self.nccl_version = ".".join(str(part) for part in version) if isinstance(version, tuple) else str(version)
        mine: Identity = {"host": self.config.host, "hostname": self.hostname, "rank": self.rank, "local_rank": self.local_rank,
                          "gpu_uuid": self.gpu_uuid, "torch": self.torch_version, "nccl": self.nccl_version}
        gathered: list[Any] = all_gather_json(mine, self.world_size, self._device())
        self.identity = sorted(gathered, key=lambda who: who["rank"])
        self.problems = identity_problems(self.identity)

    def _verify(self) -> None:
        import torch

        elements = self.config.verify_bytes // 4
        mine = payload(self.config.seed, self.rank, elements, self._device())
        received = torch.empty(elements * self.world_size, dtype=torch.int32, device=self._device())
        _all_gather_single()(received, mine)
        wrong, by_source = count_wrong(received, self.config.seed, self.world_size)
        self.verify = {"bytes": elements * 4, "elements": elements * self.world_size, "wrong": wrong,
                       "wrong_by_source_rank": {str(src): n for src, n in by_source.items()}}

    def _compute(self) -> None:
        """A fixed square matmul on every rank at once, each on its own (mamf-finder's measure, one shape): a host whose
        CPU is throttled or whose GPU clocks are held down stands out against the others' figures. Set up here, and timed
        in one slice per repeat of the speed judge, spread over the launch (COMPUTE_POINTS): the first here, the next at
        the end of the neighbour test, the rest at the end of the sweep."""
        if self.config.compute_s <= 0:
            return
        import torch

        on_gpu = self.config.backend == "nccl"
        n, dtype = (8192, torch.bfloat16) if on_gpu else (256, torch.float32)
        # Made where they are used: 8192^2 random floats made on the CPU and copied would cost more than the probe.
        a = torch.rand(n, n, dtype=dtype, device=self._device())
        b = torch.rand(n, n, dtype=dtype, device=self._device())
        out = torch.matmul(a, b)  # the first call picks its kernel and allocates: untimed
        self._sync()
        self._matmul = (a, b, out)
        self.compute = {"n": n, "dtype": str(dtype).replace("torch.", ""), "iters": 0, "seconds": 0.0, "tflops": 0.0,
                        "throttled_s": 0.0, "slices_tflops": []}
        self._compute_slices("compute")

    def _compute_slices(self, point: str) -> None:
        """The compute probe's slices due at this point of the launch. A slice is one repeat's evidence: slices timed back to
        back share one moment of the host's load (another process's burst covered all three on a shared 2-core machine),
        so a host was named for a moment; spread over the launch, a host is slow at compute when it is slow at three
        moments, as a throttled CPU or a GPU held at low clocks is."""
        if self.compute is None:
            return
        import torch
        import torch.distributed as dist

        slices = max(1, self.config.repeats)
        due = sum(1 for i in range(slices) if COMPUTE_POINTS[min(i, len(COMPUTE_POINTS) - 1)] == point)
        if due == 0:
            return
        a, b, out = self._matmul
        n = self.compute["n"]
        # Every rank's timed loop at once, as a training step's compute is: ranks of one host then share its CPU alike, and
        # a rank still busy with the phase before (or already done) does not make another's window lighter or heavier.
        dist.barrier()
        # One thread on CPU: a core's pace, the same on every host whatever its count of cores, and a quota shows in it.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        throttled_before = cgroup_throttled_s()
        begun = time.perf_counter()
        for part in range(1, due + 1):
            slice_iters, slice_begun = 0, time.perf_counter()
            while True:
                torch.matmul(a, b, out=out)
                self._sync()
                slice_iters += 1
                if time.perf_counter() - begun >= self.config.compute_s / slices * part:
                    break
            self.compute["slices_tflops"].append(round(2 * n ** 3 * slice_iters / (time.perf_counter() - slice_begun) / 1e12, 6))
            self.compute["iters"] += slice_iters
        throttled_after = cgroup_throttled_s()
        torch.set_num_threads(threads)
        self.compute["seconds"] = round(self.compute["seconds"] + time.perf_counter() - begun, 6)
        self.compute["tflops"] = round(2 * n ** 3 * self.compute["iters"] / self.compute["seconds"] / 1e12, 6)
        known = self.compute["throttled_s"]
        self.compute["throttled_s"] = None if known is None or throttled_before is None or throttled_after is None \
            else round(known + throttled_after - throttled_before, 6)

    def _neighbours(self) -> None:
        """Each rank sends to its counterpart (the same local rank) on its neighbour hosts, the links of a phase at once,
        each phase for about neighbour_s (see neighbour_phases): point-to-point over the job's own process group, so on
        NCCL its real transport and on gloo its sockets. Every rank times the links it sends on. Then the pairwise stage's
        rounds, if any, in the same way (pair_round_phases); then every suspect of either, measured again (repeat_plan),
        until a repeat leaves none slow (settled)."""
        if self.config.neighbour_s <= 0:
            return
        import torch

        hosts = list(dict.fromkeys(who["host"] for who in self.identity))
        ranks = {(who["host"], who["local_rank"]): who["rank"] for who in self.identity}
        buffer = torch.zeros(self.config.neighbour_bytes // 4, dtype=torch.float32, device=self._device())
        index = {host: i for i, host in enumerate(hosts)}
        phases = neighbour_phases(len(hosts)) if self.config.neighbour_ring else []
        self._send_phases([[(a, b, ()) for a, b in links] for links in phases], hosts, ranks, buffer, first=1, repeat=0, into=self.links)
        rounds = [[(index[a], index[b]) for a, b in pairs if a in index and b in index] for pairs in self.config.pair_rounds]
        self._send_phases([[(a, b, ()) for a, b in links] for links in pair_round_phases(rounds)], hosts, ranks, buffer, first=1,
                          repeat=0, into=self.pair_links)
        if self.config.repeats < 1:
            return
        # Every rank's figures, so that every rank plans the same repeats (each link at its slowest rank).
        # Each link of the ring and of each round at its slowest rank, as the judge takes them (a link in both is two).
        # On rails, each rail's figures apart: rail r's links are judged against rail r's (rails_plan).
        gathered: list[Any] = all_gather_json([[link["src"], link["dst"], kind, link["phase"], link["GBps"], link["rail"]]
                                               for kind, rows in (("ring", self.links), ("pair", self.pair_links)) for link in rows],
                                              self.world_size, self._device())
        slowest: dict[tuple[int, int, str, int, int], float] = {}
        for src, dst, kind, phase, rate, rail in (row for rows in gathered for row in rows):
            key = (index[src], index[dst], kind, int(phase), int(rail))
            slowest[key] = min(float(rate), slowest.get(key, float("inf")))
        measured: dict[int, list[tuple[int, int, float]]] = {}
        for (a, b, _, _, rail), rate in slowest.items():
            measured.setdefault(rail, []).append((a, b, rate))
        plan = rails_plan(len(hosts), measured, self.config.suspect_fraction, self.config.repeats)
        number = len(phases) + 1
        for repeat, links in enumerate(plan, start=1):
            # A round's ring in its own phases, then the suspect links: a link timed beside the round is no yardstick.
            laid: list[list[tuple[int, int, tuple[str, ...]]]] = [[(a, b, (of,)) for a, b in phase] for of in ("round", "link")
                                                                  for phase in lay_out([(a, b) for a, b, tag in links if tag == of])]
            self._send_phases(laid, hosts, ranks, buffer, first=number, repeat=repeat, into=self.links)
            number += len(laid)
            # Every rank's figures of this repeat, so that every rank stops at the same one (settled).
            rows: list[Any] = all_gather_json([[link["src"], link["dst"], link["phase"], link["of"][0], link["GBps"], link["rail"]]
                                               for link in self.links if link["repeat"] == repeat], self.world_size, self._device())
            figures: dict[tuple[int, int, int, str, int], float] = {}
            for sender, receiver, at, tag, rate, rail in (row for rank_rows in rows for row in rank_rows):
                figure = (index[sender], index[receiver], int(at), str(tag), int(rail))
                figures[figure] = min(float(rate), figures.get(figure, float("inf")))
            if all(settled(mine, [(a, b, at, tag, rate) for (a, b, at, tag, r), rate in figures.items() if r == rail],
                           self.config.suspect_fraction) for rail, mine in measured.items()):
                break

    def _send_phases(self, phases: list[list[tuple[int, int, tuple[str, ...]]]], hosts: list[str], ranks: dict[tuple[str, int], int],
                     buffer: torch.Tensor, first: int, repeat: int, into: list[LinkResult]) -> None:
        """Run the phases (numbered from first), the links of each at once, each link (src, dst, in a repeat its tag:
        repeat_plan's "round" or "link"); this rank times the links it sends on and keeps them in into."""
        import torch.distributed as dist

        me = hosts.index(self.config.host)
        for number, links in enumerate(phases, start=first):
            dist.barrier()  # phases never overlap: a link shares its hosts with no other at a time
            for src, dst, of in links:
                peer = ranks.get((hosts[dst if src == me else src], self.local_rank))
                if me not in (src, dst) or peer is None:
                    continue
                messages, seconds = self._exchange(peer, src == me, buffer)
                if src == me:
                    into.append({"src": hosts[src], "dst": hosts[dst], "local_rank": self.local_rank, "rail": self.rail, "phase": number,
                                 "bytes": buffer.numel() * 4, "messages": messages, "seconds": round(seconds, 6),
                                 "GBps": round(buffer.numel() * 4 * messages / seconds / 1e9, 6), "repeat": repeat, "of": list(of)})

    def _exchange(self, peer: int, sending: bool, buffer: torch.Tensor) -> tuple[int, float]:
        """One link of the neighbour test, both ends alike: the sender sends messages in chunks, each chunk announced by
        its count (0: the end) and sized by next_chunk from the rate so far, so that the link sends for about neighbour_s
        however wrong its first message's time was; then an acknowledgement back, so that the time is the receiver's, not
        the sender's buffer's. The messages sent and their seconds (the receiver's count and seconds at its end)."""
        import torch
        import torch.distributed as dist

        device = self._device()
        ack = torch.zeros(1, dtype=torch.int64, device=device)
        count = torch.zeros(1, dtype=torch.int64, device=device)
        forth, back = (dist.send, dist.recv) if sending else (dist.recv, dist.send)  # this end's part, the way the bytes go
        # The pair's first message sets up its connection: a small one, untimed, so that a slow link costs no extra message.
        forth(ack, peer)
        back(ack, peer)
        self._sync()
        begun = time.perf_counter()
        messages = 0
        while True:
            if sending:
                count.fill_(next_chunk(self.config.neighbour_s, time.perf_counter() - begun, messages))
            forth(count, peer)
            chunk = int(count.item())
            if chunk == 0:
                break
            for _ in range(chunk):
                forth(buffer, peer)
            self._sync()
            messages += chunk
        back(ack, peer)
        self._sync()
        return messages, time.perf_counter() - begun

    def _sweep(self) -> None:
        for op in self.config.sweep_ops:
            slowest: list[float] = []  # busbw of the slowest rank per size, the same on every rank
            for size in self.config.sweep_sizes:
                moved = sweep_bytes(op, size, self.world_size)
                if moved == 0:
                    continue
                seconds = self._time_op(op, moved)
                # "bytes" is the size asked for (the key every rank and the report share); the rates use the bytes moved.
                self.sweep.append({"op": op, "bytes": size, "time_us": round(seconds * 1e6, 3),
                                   "algbw_GBps": round(algbw_gbps(moved, seconds), 6),
                                   "busbw_GBps": round(busbw_gbps(op, moved, seconds, self.world_size), 6)})
                if self.config.time_per_size_s is None:
                    continue
                # Every rank must stop at the same size: the decision uses the slowest rank's time, agreed on by all.
                agreed = self._agreed_max(seconds)
                slowest.append(busbw_gbps(op, moved, agreed, self.world_size))
                if plateaued(slowest) or agreed >= LONGEST_STEP_BUDGETS * self.config.time_per_size_s:
                    break

    def _agreed_max(self, value: float) -> float:
        """The largest of every rank's value, known to every rank (one tiny all_reduce)."""
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([value], dtype=torch.float64, device=self._device())
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return float(tensor.item())

    def _warm_up(self, step: Callable[[], None]) -> tuple[int, float]:
        """Warm up one size: the timed iterations still to run, and this rank's seconds for an iteration already timed (0.0
        when none was). Fixed: warmup untimed iterations, then iters. With a time budget: one untimed iteration (the first
        of a size sets up buffers and connections), then one timed on every rank and agreed on as the slowest's (so every
        rank runs the same counts). When at most one iteration fits the budget, that timed one is the measurement: at the
        largest sizes a third iteration would cost a third more for no better figure. Otherwise warm-ups filling half the
        budget and timed iterations filling the budget, at most warmup and iters."""
        budget = self.config.time_per_size_s
        if budget is None:
            for _ in range(self.config.warmup):
                step()
            return self.config.iters, 0.0
        import torch.distributed as dist

        step()
        self._sync()
        dist.barrier()
        begun = time.perf_counter()
        step()
        self._sync()
        mine = time.perf_counter() - begun
        one = max(self._agreed_max(mine), 1e-9)
        timed = min(self.config.iters, int(budget / one))
        if timed <= 1:
            return 0, mine
        for _ in range(max(0, min(self.config.warmup - 2, int(budget / 2 / one)))):
            step()
        return timed, 0.0

    def _time_op(self, op: str, total_bytes: int) -> float:
        """Seconds per iteration of op over total_bytes, timed as nccl-tests does: warm up, line up, time the loop."""
        import torch
        import torch.distributed as dist

        device = self._device()
        # Zeros stay zeros under a sum, so no iteration slows down on denormals or overflows.
        if op == "all_gather":
            all_gather = _all_gather_single()
            output = torch.zeros(total_bytes // 4, dtype=torch.float32, device=device)
            shard = torch.zeros(total_bytes // 4 // self.world_size, dtype=torch.float32, device=device)

            def step() -> None:
                all_gather(output, shard)
        else:
            buffer = torch.zeros(total_bytes // 4, dtype=torch.float32, device=device)

            def step() -> None:
                dist.all_reduce(buffer)

        iters, already = self._warm_up(step)
        if iters == 0:
            return already
        self._sync()
        dist.barrier()
        self._sync()
        begun = time.perf_counter()
        for _ in range(iters):
            step()
        self._sync()
        return (time.perf_counter() - begun) / iters

    def _finish(self) -> None:
        import torch.distributed as dist

        # The host of the c10d store must not leave before the others: their torchrun would then log
        # "RendezvousConnectionError ... failed to shutdown the rendezvous", which reads like a failure and is none.
        dist.barrier()
        dist.destroy_process_group()

    def _result(self) -> ResultEvent:
        return {"event": "result", "rank": self.rank, "local_rank": self.local_rank, "world_size": self.world_size,
                "host": self.config.host, "hostname": self.hostname, "gpu_uuid": self.gpu_uuid, "torch": self.torch_version,
                "nccl": self.nccl_version, "identity": self.identity if self.rank == 0 else None, "problems": self.problems,
                "verify": self.verify, "sweep": self.sweep, "phases_s": self.phases_s, "import_s": self.import_s,
                "compute": self.compute, "links": self.links, "pair_links": self.pair_links}


def _all_gather_single() -> Callable[[torch.Tensor, torch.Tensor], object]:
    import torch.distributed as dist

    # Newer torch names it all_gather_single and warns on every call of the old name, inside the timed loop too.
    gather: Callable[[torch.Tensor, torch.Tensor], object] = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather


def _destroy_if_initialized() -> None:
    """Best effort: a process group left behind after an error must not keep the store or the GPU busy."""
    if "torch.distributed" not in sys.modules:
        return
    import torch.distributed as dist

    try:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        traceback.print_exc()


def _one_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:500]


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None or not value.isdigit():
        raise ValueError(f"{name} must be set by torchrun to a number, not {value!r}")
    return int(value)


# ---------------------------------------------------------------------------------------------------------------------
# The host's supervisor: what a rank cannot enforce on itself


# Beyond a phase's deadline: the rank's own watchdog has had its chance by then.
SUPERVISOR_GRACE_S = 5.0
_SUPERVISOR_POLL_S = 0.2


@dataclass
class _LocalRank:
    rank: int | None = None
    pid: int | None = None
    pin: int | str | None = None  # a hold on the pid's process as it was seen (_pin): the pid alone may be reused once it exits
    phase: str | None = None
    since: float = 0.0
    ended: bool = False


class Supervisor:
    """Runs torchrun in its own session on one host, relays its output, and cuts it when a rank overruns its phase's
    deadline by SUPERVISOR_GRACE_S (a stopped or stuck process: its watchdog thread cannot run), when torchrun
    lingers past the finish deadline after every local rank has ended (an agent waiting on a store that is gone), when
    it is told to stop (stop(), its signal handler) or when nobody reads its output any more (the SSH channel or the
    pipe to preflight is gone: sshd does not signal a command without a pty when its channel closes).
    Whatever happens, it kills torchrun's session and the ranks it saw before returning.

    With status_path, it keeps the phase its ranks are in there (removed at the end), for an interrupt's cleanup to
    read before it kills them."""

    def __init__(self, config: WorkerConfig, nproc: int, argv: Sequence[str], grace_s: float = SUPERVISOR_GRACE_S,
                 status_path: str | None = None) -> None:
        self.config = config
        self.nproc = nproc
        self.grace_s = grace_s
        self.argv = list(argv)
        self.status_path = status_path
        self.ranks: dict[int, _LocalRank] = {}
        self.cut: str | None = None
        self.stopped_by: int | None = None
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()

    def stop(self, signum: int, frame: object) -> None:
        """A signal handler: run() ends torchrun and its ranks and returns."""
        self.stopped_by = signum

    def _set_status(self, phase: str) -> None:
        if self.status_path is None:
            return
        temporary = f"{self.status_path}.tmp"
        with contextlib.suppress(OSError):
            with open(temporary, "w", encoding="utf-8") as f:
                f.write(phase + "\n")
            os.replace(temporary, self.status_path)

    def _write(self, data: bytes) -> None:
        with self._write_lock, contextlib.suppress(OSError):
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()

    def _relay(self, stream: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            self._write(raw)
            for event in parse_lines(raw.decode(errors="replace")):
                self._track(event)

    def _track(self, event: Mapping[str, object]) -> None:
        """Keep what a rank's event says of it: its rank and pid, the phase it entered, whether it has ended."""
        local_rank, kind, phase = event.get("local_rank"), event.get("event"), event.get("phase")
        if not isinstance(local_rank, int):
            return
        # Only phases with a deadline are tracked: the worker enters no other.
        entered = phase if kind == "phase" and isinstance(phase, str) and phase in self.config.deadlines_s else None
        with self._lock:
            state = self.ranks.setdefault(local_rank, _LocalRank())
            if "rank" in event:
                state.rank = _int(event["rank"])
            if "pid" in event and _int(event["pid"]) != state.pid:
                if isinstance(state.pin, int):
                    os.close(state.pin)
                state.pid = _int(event["pid"])
                state.pin = _pin(state.pid) if state.pid else None
            if entered is not None:
                state.phase, state.since = entered, time.monotonic()
            elif kind in ("result", "error", "timeout"):
                state.ended = True
        if entered is not None:
            self._set_status(entered)

    def _overdue(self, now: float, all_ended_at: float | None) -> str | None:
        with self._lock:
            for local_rank, state in sorted(self.ranks.items()):
                if state.ended or state.phase is None:
                    continue
                deadline = self.config.deadlines_s[state.phase]
                if now - state.since > deadline + self.grace_s:
                    event: TimeoutEvent = {"event": "timeout", "phase": state.phase, "rank": state.rank, "local_rank": local_rank,
                                           "host": self.config.host, "pid": state.pid, "deadline_s": deadline, "stuck": True}
                    self._write(event_line(event))
                    state.ended = True
                    return f"rank {state.rank} did not end {self.grace_s:g} s after its {state.phase} deadline"
        if all_ended_at is not None and now - all_ended_at > self.config.deadlines_s["finish"]:
            return "torchrun did not exit after every local rank had ended"
        return None

    def _why_stop(self, reader_gone: Callable[[], bool]) -> str | None:
        if self.stopped_by is not None:
            return f"stopped by {signal.Signals(self.stopped_by).name}"
        if reader_gone():
            return "nobody reads the output any more: preflight's connection is gone"
        return None

    def run(self) -> int:
        """torchrun's exit code, or EXIT_TIMEOUT when it had to be cut."""
        process = subprocess.Popen(self.argv, stdout=subprocess.PIPE, start_new_session=True)
        relay = threading.Thread(target=self._relay, args=(process.stdout,), name="preflight-relay", daemon=True)
        relay.start()
        reader_gone = _reader_gone_check()
        all_ended_at: float | None = None
        try:
            while process.poll() is None:
                now = time.monotonic()
                with self._lock:
                    everyone_ended = len(self.ranks) >= self.nproc and all(r.ended for r in self.ranks.values())
                all_ended_at = (all_ended_at or now) if everyone_ended else None
                self.cut = self._why_stop(reader_gone) or self._overdue(now, all_ended_at)
                if self.cut is not None:
                    break
                time.sleep(_SUPERVISOR_POLL_S)
        finally:
            self._kill(process)
            relay.join(timeout=5)
            if self.status_path is not None:
                with contextlib.suppress(OSError):
                    os.unlink(self.status_path)
        if self.cut is not None:
            self._write(event_line({"event": "cut", "host": self.config.host, "reason": self.cut}))
            return EXIT_TIMEOUT
        return process.returncode if process.returncode is not None else EXIT_TIMEOUT

    def _kill(self, process: subprocess.Popen[bytes]) -> None:
        # torch elastic starts the ranks in sessions of their own: the group kill does not reach them, their pids do
        # (and their parent-death signal, once the agent is gone).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with self._lock:
            seen = [(r.pid, r.pin) for r in self.ranks.values() if r.pid]
            for state in self.ranks.values():
                state.pin = None  # handed to _kill_pinned, which closes a pidfd
        for pid, pin in seen:
            _kill_pinned(pid, pin)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) else None


def _pin(pid: int) -> int | str | None:
    """A hold on the process pid is now, so that a later kill reaches it and never a process that took its pid after it
    exited: a pidfd (Linux 5.3, python 3.9), else its start time; None when it is gone already."""
    with contextlib.suppress(AttributeError, OSError):
        return os.pidfd_open(pid)
    return _process_started(pid)


def _kill_pinned(pid: int, pin: int | str | None) -> None:
    """SIGKILL the process pinned as pin, if it still runs (a pidfd is closed after)."""
    if isinstance(pin, int):
        with contextlib.suppress(OSError):  # ProcessLookupError: it has exited
            signal.pidfd_send_signal(pin, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.close(pin)
    elif pin is not None and _process_started(pid) == pin:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _process_started(pid: int) -> str | None:
    """When the process pid started (/proc/PID/stat's 22nd field, clock ticks since boot): with the pid, which process
    it is. None when there is none, or it is a zombie (it has exited)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: the fields from the state (field 3) on follow its last ")".
    fields = stat[stat.rfind(b")") + 2:].split()
    return fields[19].decode() if len(fields) > 19 and fields[0] != b"Z" else None


def _reader_gone_check() -> Callable[[], bool]:
    """A test of whether stdout's reader is gone: a pipe or socket whose other end closed polls as an error or a hangup
    without writing to it (a quiet sweep writes nothing for minutes)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), 0)  # errors and hangups are always reported
    except (OSError, ValueError):
        return lambda: False
    return lambda: any(mask & (select.POLLERR | select.POLLHUP) for _fd, mask in poller.poll(0))


def supervise_main(args: Sequence[str]) -> int:
    """``worker.py supervise NPROC '<config json>' -- torchrun argv...``: run torchrun under a Supervisor."""
    if len(args) < 4 or args[2] != "--" or not args[0].isdigit():
        print("usage: worker.py supervise NPROC '<config json>' -- COMMAND...", file=sys.stderr)
        return EXIT_ERROR
    try:
        config = WorkerConfig.from_json(args[1])
    except ValueError as e:
        print(f"worker.py supervise: {e}", file=sys.stderr)
        return EXIT_ERROR
    # The cleanup of an interrupted check finds the status beside the worker, in the run's folder.
    supervisor = Supervisor(config, int(args[0]), args[3:], status_path=os.path.join(os.path.dirname(os.path.abspath(__file__)), "status"))
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, supervisor.stop)
    return supervisor.run()


def ranks_main(args: Sequence[str]) -> int:
    """``worker.py ranks '<config json>'``: start this host's ranks of a launch whose hosts are already ranks of one
    (``preflight agent``), as torchrun would start them: LOCAL_WORLD_SIZE ranks, rank GROUP_RANK * LOCAL_WORLD_SIZE +
    LOCAL_RANK of WORLD_SIZE, the store at MASTER_ADDR:MASTER_PORT served by rank 0 itself. As torchrun does, the first
    rank to fail ends its siblings. The supervisor above bounds the whole (it kills this session)."""
    try:
        nproc, group_rank = _env_int("LOCAL_WORLD_SIZE"), _env_int("GROUP_RANK")
        if len(args) != 1:
            raise ValueError(f"usage: worker.py ranks '<config json>', not {len(args)} argument(s)")
    except ValueError as e:
        print(f"worker.py ranks: {e}", file=sys.stderr)
        return EXIT_ERROR
    # On rails each rank goes through the wrapper staged beside the worker, as torchrun runs it (collective/run.py).
    wrapper = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rail_env.py")
    through = [wrapper] if any(k.startswith("PREFLIGHT_RAIL_") for k in os.environ) and os.path.exists(wrapper) else []
    children = [subprocess.Popen([sys.executable, *through, os.path.abspath(__file__), args[0]],
                                 env={**os.environ, "LOCAL_RANK": str(i), "RANK": str(group_rank * nproc + i)}) for i in range(nproc)]
    failed: int | None = None
    while failed is None and any(child.poll() is None for child in children):
        failed = next((child.returncode for child in children if child.returncode not in (None, EXIT_OK)), None)
        time.sleep(_SUPERVISOR_POLL_S)
    for child in children:
        if child.poll() is None:
            child.kill()
        child.wait()
    codes = [child.returncode for child in children]
    return failed if failed is not None else max(codes, default=EXIT_OK)


def main(argv: Sequence[str] | None = None) -> int:
    """Run this rank; the exit code (0 result, 1 error, 3 timeout)."""
    started = time.monotonic()
    # Read before prctl: a parent that dies in between shows up to the watchdog as a changed parent pid.
    parent_pid = os.getppid()
    die_with_parent()
    args = sys.argv[1:] if argv is None else list(argv)
    output = Output(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".output.lock"))
    rank: int | None = None
    local_rank: int | None = None
    try:
        rank, local_rank, world_size = _env_int("RANK"), _env_int("LOCAL_RANK"), _env_int("WORLD_SIZE")
        if len(args) != 1:
            raise ValueError(f"usage: worker.py '<config json>', not {len(args)} argument(s)")
        config = WorkerConfig.from_json(args[0])
    except ValueError as e:
        output.emit({"event": "error", "phase": PHASES[0], "rank": rank, "local_rank": local_rank, "host": None, "error": _one_line(e),
                     "t": round(time.monotonic() - started, 3)})
        return EXIT_ERROR
    return Worker(config, rank, local_rank, world_size, started=started, parent_pid=parent_pid, output=output).run()


def _exit_now(code: int) -> None:
    """End a rank without the interpreter's shutdown: the peer watch may still be blocked in the store, and the
    backends' destructors can hang; every event already stands."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    if sys.argv[1:2] == ["supervise"]:
        sys.exit(supervise_main(sys.argv[2:]))
    if sys.argv[1:2] == ["ranks"]:
        sys.exit(ranks_main(sys.argv[2:]))
    _exit_now(main())
