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
import os
import sys
import time
from collections.abc import Sequence

from preflight.collective.host.config import WorkerConfig
from preflight.collective.host.events import EXIT_ERROR, PHASES, env_int, one_line
from preflight.collective.host.output import Output, die_with_parent
from preflight.collective.host.rank import Worker
from preflight.collective.host.ranks import ranks_main
from preflight.collective.host.supervisor import supervise_main


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
        rank, local_rank, world_size = env_int("RANK"), env_int("LOCAL_RANK"), env_int("WORLD_SIZE")
        if len(args) != 1:
            raise ValueError(f"usage: worker.py '<config json>', not {len(args)} argument(s)")
        config = WorkerConfig.from_json(args[0])
    except ValueError as e:
        output.emit({"event": "error", "phase": PHASES[0], "rank": rank, "local_rank": local_rank, "host": None, "error": one_line(e),
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
