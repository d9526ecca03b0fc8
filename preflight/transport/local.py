"""Run commands on this machine, without SSH, under the same contract as every transport."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from preflight.transport.base import CommandResult, RemoteCommand


def _kill_group(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


@dataclass
class StartedCommand:
    """A local command under way: its process (None if it could not start) and when it was sent."""

    process: subprocess.Popen[str] | None
    sent_unix_s: float
    stdin: str
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
        return StartedCommand(None, sent, stdin, f"cannot run {argv[0]}: {e.strerror}")
    return StartedCommand(process, sent, stdin)


def finish_local(started: StartedCommand, host: str, timeout_s: float) -> CommandResult:
    """Wait for a started command until timeout_s after it was sent; kill its process group then, or when it is done."""
    process = started.process
    if process is None:
        return CommandResult(host=host, reached=False, reason=started.failed_to_start,
                             sent_unix_s=started.sent_unix_s, received_unix_s=time.time())
    left = max(0.0, started.sent_unix_s + timeout_s - time.time())
    try:
        stdout, stderr = process.communicate(started.stdin, timeout=left)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        stdout, stderr = process.communicate()  # what it printed before the deadline tells where it hung
        return CommandResult(host=host, reached=False, stdout=stdout, stderr=stderr,
                             reason=f"command timed out after {timeout_s:g} s", sent_unix_s=started.sent_unix_s,
                             received_unix_s=time.time())
    finally:
        _kill_group(process)  # children the command left behind go with it
    return CommandResult(host=host, reached=True, exit_code=process.returncode, stdout=stdout, stderr=stderr,
                         sent_unix_s=started.sent_unix_s, received_unix_s=time.time(),
                         timings={"command_s": time.time() - started.sent_unix_s})


def stop_local(started: StartedCommand) -> None:
    """Kill a started command that is no longer wanted, and reap it."""
    if started.process is not None:
        _kill_group(started.process)
        started.process.kill()
        started.process.communicate()


def run_local(command: RemoteCommand, env: Mapping[str, str] | None = None) -> CommandResult:
    """Run one command here, its whole process group killed at its deadline; env: instead of ours."""
    return finish_local(start_local(command.argv, command.stdin, env), command.host.name, command.timeout_s)


class LocalTransport:
    """Commands run as child processes of preflight, in parallel."""

    def run(self, commands: Sequence[RemoteCommand], *, all_at_once: bool = False) -> list[CommandResult]:
        """Run the commands in parallel (every one together if all_at_once) and return their results in order."""
        if not commands:
            return []
        with ThreadPoolExecutor(max_workers=len(commands) if all_at_once else min(len(commands), 32)) as pool:
            return list(pool.map(run_local, commands))

    def close(self) -> None:
        """Nothing is held between runs."""
