"""SIGINT and SIGTERM: one exception in the main thread, a bounded cleanup, one line.

While the CLI runs, either signal raises ``Interrupted`` in the main thread (SIGINT as Ctrl-C always did, SIGTERM the
same way instead of killing the interpreter where it stands). Only the first one does: the ones after it are ignored,
so that the cleanup it starts, bounded by its own deadline, is never cut short with the hosts half cleaned. The run
keeps an Activity saying what it does on the hosts, for the one line that says what was interrupted.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING

from preflight.errors import Interrupted, signal_name

if TYPE_CHECKING:
    # Only its type: every command imports this module, and the transports bring Hydra's config store with them.
    from preflight.transport.reap import Cleanup

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_STAGE_NAMES = {"facts": "the facts stage", "collective": "the collective", "sweep": "the sweep"}


class _Handler:
    """Raises Interrupted for the first signal; remembers one that comes while deferred."""

    def __init__(self) -> None:
        self.raised = False
        self.deferring = 0
        self.pending: int | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.raised:
            return
        if self.deferring:
            self.pending = self.pending or signum
            return
        self.raised = True
        raise Interrupted(signum)


_active: _Handler | None = None


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """While inside, SIGINT and SIGTERM raise Interrupted in the main thread, once. A signal that this process was
    started with ignored stays ignored (a background job's SIGINT, nohup's), as Python itself does for SIGINT."""
    global _active
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = _Handler()
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    for signum, current in previous.items():
        if current is not signal.SIG_IGN:
            signal.signal(signum, handler)
    outer, _active = _active, handler
    try:
        yield
    finally:
        _active = outer
        for signum, current in previous.items():
            signal.signal(signum, current)


@contextlib.contextmanager
def interrupts_deferred(what: str) -> Iterator[None]:
    """No interrupt inside (a report is written whole or not at all): a signal waits for the end of the block, then
    raises Interrupted saying that it came `what` ("while saving the report")."""
    handler = _active
    if handler is None:
        yield
        return
    handler.deferring += 1
    try:
        yield
    finally:
        handler.deferring -= 1
    if not handler.deferring and handler.pending is not None and not handler.raised:
        handler.raised = True
        raise Interrupted(handler.pending, f"interrupted by {signal_name(handler.pending)} {what}")


@dataclass
class Activity:
    """What a run is doing on its hosts, for the line an interrupt prints."""

    stage: str  # the playbook's stage: facts or collective (the hosts tell the collective's sweep apart)
    detail: str  # what runs where, e.g. "torchrun on 3 hosts"
    sweep: bool = False  # the launch under way goes on to the sweep

    def now(self, stage: str, detail: str, *, sweep: bool = False) -> None:
        """The run has moved on to this."""
        self.stage, self.detail, self.sweep = stage, detail, sweep


def hosts_phrase(count: int) -> str:
    """'1 host', '3 hosts'."""
    return f"{count} host{'' if count == 1 else 's'}"


def interrupted_line(signum: int, activity: Activity, cleanup: Sequence[Cleanup]) -> str:
    """What was interrupted and what became of the hosts, in one line."""
    stage = activity.stage
    if activity.sweep and any(status == "sweep" for c in cleanup for status in c.status):
        stage = "sweep"  # the supervisors' word for where their ranks were: the sweep runs inside the collective's launch
    what = f"{_STAGE_NAMES.get(stage, stage)} ({activity.detail})" if activity.detail else _STAGE_NAMES.get(stage, stage)
    return f"interrupted by {signal_name(signum)} during {what}; {cleanup_phrase(cleanup)}"


def cleanup_phrase(cleanup: Sequence[Cleanup]) -> str:
    """What the reapers did, every host named that could not be cleaned and why."""
    if not cleanup:
        return "nothing had started on any host"
    clean = [c for c in cleanup if c.clean]
    killed, removed, files = sum(c.killed for c in clean), sum(c.removed for c in clean), sum(c.files for c in clean)
    done = ", ".join(part for part in (f"stopped {killed} process{'' if killed == 1 else 'es'}" if killed else "",
                                       f"removed {removed} temporary folder{'' if removed == 1 else 's'}" if removed else "",
                                       f"removed {files} storage test file{'' if files == 1 else 's'}" if files else "") if part)
    if len(clean) == len(cleanup):
        where = "the host" if len(cleanup) == 1 else f"all {len(cleanup)} hosts"
        return f"cleaned up {where}" + (f" ({done})" if done else "")
    problems = [f"could not reach {c.host} ({c.reason})" if not c.reached else f"{c.left} process(es) on {c.host} survived SIGKILL"
                for c in cleanup if not c.clean]
    cleaned = f"cleaned up {', '.join(c.host for c in clean)}" + (f" ({done})" if done else "") + "; " if clean else ""
    return cleaned + "; ".join(problems) + ": what runs there ends at its own deadline"
