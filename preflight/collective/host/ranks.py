"""The ranks starter: a host's ranks started as torchrun would, under ``preflight agent``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence

from preflight.collective.host.events import EXIT_ERROR, EXIT_OK, env_int
from preflight.collective.host.supervisor import SUPERVISOR_POLL_S


def ranks_main(args: Sequence[str]) -> int:
    """``worker.py ranks SCRIPT... '<config json>'``: start this host's ranks of a launch whose hosts are already ranks
    of one (``preflight agent``), as torchrun would start them: each ``python SCRIPT... '<config json>'`` (the worker, on
    rails through rail_env.py: what torchrun is given, collective/run.py), LOCAL_WORLD_SIZE ranks, rank GROUP_RANK * LOCAL_WORLD_SIZE +
    LOCAL_RANK of WORLD_SIZE, the store at MASTER_ADDR:MASTER_PORT served by rank 0 itself. As torchrun does, the first
    rank to fail ends its siblings. The supervisor above bounds the whole (it kills this session)."""
    try:
        nproc, group_rank = env_int("LOCAL_WORLD_SIZE"), env_int("GROUP_RANK")
        if len(args) < 2:
            raise ValueError(f"usage: worker.py ranks SCRIPT... '<config json>', not {len(args)} argument(s)")
    except ValueError as e:
        print(f"worker.py ranks: {e}", file=sys.stderr)
        return EXIT_ERROR
    if nproc == 1:
        # One rank: this process becomes it, as a second python beside it would hold memory for nothing (13 MB a host,
        # of every host) and there are no siblings to end. Its pid, output and session are this one's.
        try:
            os.execve(sys.executable, [sys.executable, *args], {**os.environ, "LOCAL_RANK": "0", "RANK": str(group_rank)})  # noqa: S606
        except OSError as e:
            print(f"worker.py ranks: cannot start the rank: {e}", file=sys.stderr)
            return EXIT_ERROR
    children = [subprocess.Popen([sys.executable, *args],
                                 env={**os.environ, "LOCAL_RANK": str(i), "RANK": str(group_rank * nproc + i)}) for i in range(nproc)]
    failed: int | None = None
    while failed is None and any(child.poll() is None for child in children):
        failed = next((child.returncode for child in children if child.returncode not in (None, EXIT_OK)), None)
        time.sleep(SUPERVISOR_POLL_S)
    for child in children:
        if child.poll() is None:
            child.kill()
        child.wait()
    codes = [child.returncode for child in children]
    return failed if failed is not None else max(codes, default=EXIT_OK)
