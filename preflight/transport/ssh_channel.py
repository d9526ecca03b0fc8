"""One SSH session's command line and streams: the quoted line under the host's own ``timeout``, stdin sent then
closed, and stdout and stderr read together until both end or a deadline passes."""

from __future__ import annotations

import select
import shlex
import time
from collections.abc import Callable, Sequence

import paramiko

# `timeout -k`: how long a command that ignores SIGTERM gets before SIGKILL on the host.
REMOTE_KILL_AFTER_S = 2
READ_CHUNK = 1 << 16


# The line the host's shell prints just before the command. What its startup files print first is cut off there: an
# `echo` in ~/.bashrc, which bash reads even for sshd's sessions without a terminal, or a module system's notice would
# otherwise stand before a probe's JSON and lose the host's facts.
OUTPUT_BEGINS = "preflight: command output begins"
_PRINT_BEGINS = shlex.join(["printf", "%s\\n", OUTPUT_BEGINS])
_BEGINS_LINE = f"{OUTPUT_BEGINS}\n".encode()


def remote_command_line(argv: Sequence[str], timeout_s: float) -> str:
    """The line the host's login shell runs: OUTPUT_BEGINS, then every argv element quoted, under ``timeout`` (exec'd,
    as a shell runs a lone command: the process tree is the same)."""
    seconds = f"{timeout_s:.3f}".rstrip("0").rstrip(".")
    return f"{_PRINT_BEGINS}; exec {shlex.join(['timeout', '-k', str(REMOTE_KILL_AFTER_S), seconds, *argv])}"


def command_output(stdout: bytes) -> bytes:
    """The command's own stdout: what follows OUTPUT_BEGINS's line (all of it where the shell failed before printing it)."""
    at = stdout.find(_BEGINS_LINE)
    return stdout if at < 0 else stdout[at + len(_BEGINS_LINE):]


def send_stdin(channel: paramiko.Channel, text: str, timeout_s: float) -> None:
    """Send the command's stdin, then EOF, so a command reading to the end (``python3 -``) starts."""
    try:
        if text:
            channel.settimeout(timeout_s)
            channel.sendall(text.encode())
        channel.shutdown_write()
    except OSError:
        pass  # the command may end without reading all its stdin; its output and status still count


def _drain(read: Callable[[int], bytes], into: bytearray) -> bool:
    """Move whatever a non-blocking channel stream holds into ``into``; True once it has ended."""
    while True:
        try:
            data = read(READ_CHUNK)
        except TimeoutError:
            return False
        if not data:
            return True
        into += data


def collect(channel: paramiko.Channel, deadline: float) -> tuple[bytes, bytes, bool]:
    """Read stdout and stderr together until both end or ``deadline``; then wait for the status.

    Both streams share the channel's window, so reading only one could stall a command that
    writes much to the other; poll() on the channel's fd wakes on either.
    """
    stdout, stderr = bytearray(), bytearray()
    channel.setblocking(False)
    poller = select.poll()
    poller.register(channel.fileno(), select.POLLIN)
    while True:
        stdout_ended = _drain(channel.recv, stdout)
        stderr_ended = _drain(channel.recv_stderr, stderr)
        if stdout_ended and stderr_ended:
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return bytes(stdout), bytes(stderr), False
        poller.poll(remaining * 1000)
    finished = channel.status_event.wait(max(0.0, deadline - time.monotonic()))
    return bytes(stdout), bytes(stderr), finished
