"""Bind a rank to its rail, then run the training script: ``torchrun ... rail_env.py train.py ARGS``.

A rail-optimized host pairs GPU r with NIC r, and NIC r of every host meets the others on rail switch r. torchrun
gives every local rank one environment, so the launch carries each rail-bound variable as a list in rail order,
``PREFLIGHT_RAIL_<NAME>=rail0,rail1,...`` (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, NCCL_IB_HCA), and this script sets
``<NAME>`` to the entry of this rank's rail before it execs the script. Local rank r of n is on rail r * rails // n:
rank r on rail r where there is one rank per rail, and ranks spread evenly over the rails where there are more.

It needs nothing but python's standard library: emit-launch writes it beside the launch, and the check runs its worker
through it, so the launch that was checked is the one that is emitted.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

PREFIX = "PREFLIGHT_RAIL_"
USAGE = "usage: rail_env.py SCRIPT [ARGS...] (under torchrun, which sets LOCAL_RANK and LOCAL_WORLD_SIZE)"


def rail_of(local_rank: int, local_world_size: int, rails: int) -> int:
    """The rail of a local rank: rank r on rail r with one rank per rail, ranks spread evenly over the rails otherwise."""
    return local_rank * rails // max(local_world_size, 1)


def rank_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables this rank sets from the launch's per-rail lists; ValueError when the rank or a list is unusable."""
    try:
        local_rank = int(environ["LOCAL_RANK"])
        size = int(environ.get("LOCAL_WORLD_SIZE", str(local_rank + 1)))
    except (KeyError, ValueError):
        raise ValueError("LOCAL_RANK and LOCAL_WORLD_SIZE must be whole numbers (torchrun sets them)") from None
    if not 0 <= local_rank < size:
        raise ValueError(f"LOCAL_RANK {local_rank} is not a rank of LOCAL_WORLD_SIZE {size}")
    out: dict[str, str] = {}
    for key, value in sorted(environ.items()):
        if not key.startswith(PREFIX) or len(key) == len(PREFIX):
            continue
        per_rail = value.split(",")
        if not all(per_rail):
            raise ValueError(f"{key}={value!r} has an empty entry: one value per rail, comma-separated")
        out[key[len(PREFIX):]] = per_rail[rail_of(local_rank, size, len(per_rail))]
    return out


def main(argv: Sequence[str]) -> int:
    """Set this rank's rail variables and exec python on the script (no return), or print why not and return 2."""
    if not argv:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        os.environ.update(rank_env(os.environ))
    except ValueError as e:
        print(f"rail_env.py: {e}", file=sys.stderr)
        return 2
    os.execv(sys.executable, [sys.executable, *argv])  # noqa: S606  # the script torchrun was asked to run, as it would
    return 0  # not reached: execv replaces this process or raises


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
