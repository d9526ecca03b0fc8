"""Run commands on this machine, without SSH, under the same contract as every transport."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from preflight.transport.base import CommandResult, RemoteCommand


def _kill_group(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def run_local(command: RemoteCommand) -> CommandResult:
    """Run one command here, its whole process group killed at its deadline."""
    name = command.host.name
    sent = time.time()
    try:
        # A session of its own, so a deadline kills the command and everything it started.
        process = subprocess.Popen(
            list(command.argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True,
        )
    except OSError as e:
        return CommandResult(host=name, reached=False, reason=f"cannot run {command.argv[0]}: {e.strerror}",
                             sent_unix_s=sent, received_unix_s=time.time())
    try:
        stdout, stderr = process.communicate(command.stdin, timeout=command.timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        stdout, stderr = process.communicate()  # what it printed before the deadline tells where it hung
        return CommandResult(host=name, reached=False, stdout=stdout, stderr=stderr,
                             reason=f"command timed out after {command.timeout_s:g} s", sent_unix_s=sent, received_unix_s=time.time())
    finally:
        _kill_group(process)  # children the command left behind go with it
    return CommandResult(host=name, reached=True, exit_code=process.returncode, stdout=stdout, stderr=stderr,
                         sent_unix_s=sent, received_unix_s=time.time(),
                         timings={"command_s": time.time() - sent})


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
