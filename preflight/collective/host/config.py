"""The worker's config, argv[1], validated: every key required, none unknown."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from preflight.collective.host.events import PHASES, SWEEP_OPS

if TYPE_CHECKING:
    from preflight.collective.wire import (
        WorkerConfigJson,
    )


# Every key of the config and of its sweep, each required (preflight/collective/wire.py's WorkerConfigJson and
# SweepConfig, which a test holds these to): a key that is missing or unknown is refused, as a misspelt one would
# otherwise leave a default in its place and a test silently out.
CONFIG_KEYS = ("run_id", "backend", "seed", "host", "deadlines_s", "verify_bytes", "sweep", "compute_s", "neighbour_s",
               "neighbour_bytes", "suspect_fraction", "repeats", "starved_repeats", "starved_fraction", "neighbour_ring", "pair_rounds",
               "rails")
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
    starved_repeats: int  # then at most this many more while a suspect is slow only in starved repeats (plans.unresolved)
    starved_fraction: float  # a slow sample whose ranks waited for a CPU this share of it or more is starved: no evidence
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
        starved_repeats = data["starved_repeats"]
        if isinstance(starved_repeats, bool) or not isinstance(starved_repeats, int) or not 0 <= starved_repeats <= 20:
            raise ValueError(f"starved_repeats must be an integer from 0 to 20, not {starved_repeats!r}")
        starved_fraction = data["starved_fraction"]
        if isinstance(starved_fraction, bool) or not isinstance(starved_fraction, (int, float)) or not 0 <= starved_fraction <= 1:
            raise ValueError(f"starved_fraction must be a number from 0 to 1, not {starved_fraction!r}")
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
                   starved_repeats=starved_repeats, starved_fraction=float(starved_fraction),
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
