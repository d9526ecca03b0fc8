"""The host's supervisor: what a rank cannot enforce on itself."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

from preflight.collective.host.config import WorkerConfig
from preflight.collective.host.events import EXIT_ERROR, EXIT_TIMEOUT, event_line, parse_lines

if TYPE_CHECKING:
    from preflight.collective.wire import (
        TimeoutEvent,
    )


# Beyond a phase's deadline: the rank's own watchdog has had its chance by then.
SUPERVISOR_GRACE_S = 5.0
SUPERVISOR_POLL_S = 0.2


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
                time.sleep(SUPERVISOR_POLL_S)
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
    pidfd_open = getattr(os, "pidfd_open", None)  # python 3.9 and later; the worker runs on 3.8 too
    if pidfd_open is not None:
        with contextlib.suppress(OSError):
            fd: int = pidfd_open(pid)
            return fd
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
