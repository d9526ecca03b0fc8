"""Run commands on this machine, without SSH, under the same contract as every transport."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

from preflight.transport.base import CommandResult, RemoteCommand

# After its process group is killed, a command's output is read until this long: a process that left the group (a new
# session) and still holds the pipes must not hold the reader.
READ_AFTER_KILL_S = 5.0


def _kill_group(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


@dataclass
class StartedCommand:
    """A local command under way: its process (None if it could not start) and when it was sent."""

    process: subprocess.Popen[str] | None
    sent_unix_s: float
    failed_to_start: str = ""


def start_local(argv: Sequence[str], stdin: str = "", env: Mapping[str, str] | None = None) -> StartedCommand:
    """Start a command here without waiting for it, so that other work can overlap it; env: instead of ours."""
    sent = time.time()
    try:
        # A session of its own, so a deadline kills the command and everything it started.
        process = subprocess.Popen(
            list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True, env=None if env is None else dict(env),
        )
    except OSError as e:
        return StartedCommand(None, sent, f"cannot run {argv[0]}: {e.strerror}")
    # Its input is fed now, on a thread of its own, not when someone waits for it: a command started early so that other
    # work overlaps it (`python -` reads its whole program before it runs) must run meanwhile, and its deadline counts
    # from here. A command that never reads holds the thread only until its process group is killed (a broken pipe).
    pipe, process.stdin = process.stdin, None
    if pipe is not None:  # always, with stdin=PIPE; the type says Optional
        threading.Thread(target=_feed, args=(pipe, stdin), name="preflight-local-stdin", daemon=True).start()
    return StartedCommand(process, sent)


def _feed(pipe: IO[str], text: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # the command ended, or was killed, before it read it all
        try:
            pipe.write(text)
        finally:
            pipe.close()


def finish_local(started: StartedCommand, host: str, timeout_s: float) -> CommandResult:
    """Wait for a started command until timeout_s after it was sent; kill its process group then, or when it is done."""
    process = started.process
    if process is None:
        return CommandResult(host=host, reached=False, reason=started.failed_to_start,
                             sent_unix_s=started.sent_unix_s, received_unix_s=time.time())
    left = max(0.0, started.sent_unix_s + timeout_s - time.time())
    if process.poll() is not None:
        # It ended while its caller worked, perhaps past its deadline by the time anyone looks: it is done, and its
        # output is read whole (within the bound for reading a killed command's).
        left = max(left, READ_AFTER_KILL_S)
    try:
        stdout, stderr = process.communicate(timeout=left)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        stdout, stderr = _read_rest(process)  # what it printed before the deadline tells where it hung
        return CommandResult(host=host, reached=False, stdout=stdout, stderr=stderr,
                             reason=f"command timed out after {timeout_s:g} s", sent_unix_s=started.sent_unix_s,
                             received_unix_s=time.time())
    finally:
        _kill_group(process)  # children the command left behind go with it
    return CommandResult(host=host, reached=True, exit_code=process.returncode, stdout=stdout, stderr=stderr,
                         sent_unix_s=started.sent_unix_s, received_unix_s=time.time(),
                         timings={"command_s": time.time() - started.sent_unix_s})


def _read_rest(process: subprocess.Popen[str]) -> tuple[str, str]:
    """What a killed command printed; nothing when a process outside its group keeps the pipes open past READ_AFTER_KILL_S."""
    try:
        return process.communicate(timeout=READ_AFTER_KILL_S)
    except subprocess.TimeoutExpired:
        for pipe in (process.stdin, process.stdout, process.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        return "", ""


def stop_local(started: StartedCommand) -> None:
    """Kill a started command that is no longer wanted, and reap it."""
    if started.process is not None:
        _kill_group(started.process)
        started.process.kill()
        _read_rest(started.process)


def run_local(command: RemoteCommand, env: Mapping[str, str] | None = None) -> CommandResult:
    """Run one command here, its whole process group killed at its deadline; env: instead of ours."""
    return finish_local(start_local(command.argv, command.stdin, env), command.host.name, command.timeout_s)


class LocalRun:
    """Commands under way here, each on a thread of its own (a daemon: an interrupted run must not hold the exit)."""

    def __init__(self, commands: Sequence[RemoteCommand], workers: int) -> None:
        self._commands = list(commands)
        self._lock = threading.Lock()
        self._started: list[tuple[str | None, StartedCommand]] = []  # with each command's group
        self._stopped = False
        self._stopped_groups: set[str] = set()
        self._done: queue.SimpleQueue[tuple[int, CommandResult]] = queue.SimpleQueue()
        todo: queue.SimpleQueue[int] = queue.SimpleQueue()
        for index in range(len(self._commands)):
            todo.put(index)
        for _ in range(min(workers, len(self._commands))):
            threading.Thread(target=self._work, args=(todo,), name="preflight-local", daemon=True).start()

    def _work(self, todo: queue.SimpleQueue[int]) -> None:
        while True:
            try:
                index = todo.get_nowait()
            except queue.Empty:
                return
            command = self._commands[index]
            with self._lock:
                stopped = self._stopped or command.group in self._stopped_groups
                started = None if stopped else start_local(command.argv, command.stdin)
                if started is not None:
                    self._started.append((command.group, started))
            if started is None:
                why = "the run was interrupted" if self._stopped else "a host of its group was lost"
                result = CommandResult(host=command.host.name, reached=False, reason=f"not started: {why}")
            else:
                result = finish_local(started, command.host.name, command.timeout_s)
            self._done.put((index, result))

    def results(self) -> list[CommandResult]:
        """Every command's result, in the order given; an interrupt while waiting stops them all before it goes on."""
        results: dict[int, CommandResult] = {}
        try:
            while len(results) < len(self._commands):
                # Each command ends by its own deadline (finish_local kills it there), so this wait is bounded.
                index, result = self._done.get()
                results[index] = result
        except BaseException:
            self.stop()
            raise
        return [results[index] for index in range(len(self._commands))]

    def stop(self, groups: Collection[str] | None = None) -> None:
        """Kill every command under way, its whole process group, and start no more; groups: only the commands of these
        groups (RemoteCommand.group)."""
        with self._lock:
            if groups is None:
                self._stopped = True
            else:
                self._stopped_groups.update(groups)
            started = [command for group, command in self._started if groups is None or group in groups]
        for command in started:
            if command.process is not None:
                _kill_group(command.process)


class LocalTransport:
    """Commands run as child processes of preflight, in parallel."""

    def begin(self, commands: Sequence[RemoteCommand], *, all_at_once: bool = False) -> LocalRun:
        """Start the commands (every one together if all_at_once, else 32 at a time) and return without waiting."""
        return LocalRun(commands, len(commands) if all_at_once else 32)

    def run(self, commands: Sequence[RemoteCommand], *, all_at_once: bool = False) -> list[CommandResult]:
        """Run the commands in parallel (every one together if all_at_once) and return their results in order."""
        return self.begin(commands, all_at_once=all_at_once).results()

    def close(self) -> None:
        """Nothing is held between runs."""
