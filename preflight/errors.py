"""The exit codes, and the one exception base. Only the CLI turns exceptions into exit codes
(docs/architecture.md has the table)."""

from __future__ import annotations

import signal
from enum import IntEnum


class ExitCode(IntEnum):
    """What every command's exit status means; a scheduler acts on it."""

    PASSED = 0  # every check passed (warnings allowed)
    FAILED = 1  # a check failed
    BAD_INPUT = 2  # config, override, argument or file: one line naming the key, before any host is touched
    INCOMPLETE = 3  # a host could not be checked (unreachable, timed out) and nothing failed


class PreflightError(Exception):
    """An error the user can act on; its message is one line, its exit code one of ExitCode."""

    exit_code: int = ExitCode.FAILED


def last_line(text: str, limit: int = 300) -> str:
    """The last line of a command's output that says anything, cut at limit characters: the reason it gave."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:limit] if lines else ""


def one_line(text: object, limit: int | None = None) -> str:
    """text with every run of whitespace (newlines included) made one space, cut at limit characters: the form of
    every message that ends up on one line (errors, drain reasons, diagnoses)."""
    flat = " ".join(str(text).split())
    return flat if limit is None else flat[:limit]


def brief(value: object, limit: int = 80) -> str:
    """value as a message quotes it: a list or a mapping by its size, anything else by its repr cut at limit characters."""
    if isinstance(value, list | dict):
        size, what = len(value), "item" if isinstance(value, list) else "key"
        return f"a {'list' if isinstance(value, list) else 'mapping'} of {size:,} {what}{'s' * (size != 1)}"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


class InputError(PreflightError):
    """Bad input: config, override, argument or file."""

    exit_code = ExitCode.BAD_INPUT


class EnvironmentProblem(PreflightError):
    """This machine lacks what the command needs (root, a tool, a package)."""

    exit_code = ExitCode.BAD_INPUT


class Incomplete(PreflightError):
    """The run could not check what it was asked to (the agents' store unreachable, say) and nothing failed."""

    exit_code = ExitCode.INCOMPLETE


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised in the main thread. Not a PreflightError: like Ctrl-C's KeyboardInterrupt it must pass
    every ``except Exception`` so that the run stops where it is. Whoever cleans up on the way out replaces ``message``
    with what was interrupted and what became of the hosts; the CLI prints it and exits 128 + the signal's number."""

    def __init__(self, signum: int, message: str = "") -> None:
        self.signum = signum
        self.message = message or f"interrupted by {signal_name(signum)}"
        super().__init__(self.message)

    @property
    def exit_code(self) -> int:
        """130 for SIGINT, 143 for SIGTERM: the shell's convention for a command ended by a signal."""
        return 128 + self.signum


def signal_name(signum: int) -> str:
    """SIGINT, SIGTERM, ... for a signal's number."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
