"""The one exception base. Only the CLI turns these into exit codes (see DESIGN.md's table)."""

from __future__ import annotations

import signal


class PreflightError(Exception):
    """An error the user can act on; its message is one line, its exit code is DESIGN.md's."""

    exit_code = 1


def one_line(text: object, limit: int | None = None) -> str:
    """text with every run of whitespace (newlines included) made one space, cut at limit characters: the form of
    every message that ends up on one line (errors, drain reasons, diagnoses)."""
    flat = " ".join(str(text).split())
    return flat if limit is None else flat[:limit]


class InputError(PreflightError):
    """Bad input: config, override, argument or file."""

    exit_code = 2


class EnvironmentProblem(PreflightError):
    """This machine lacks what the command needs (root, a tool, a package)."""

    exit_code = 2


class Incomplete(PreflightError):
    """The run could not check what it was asked to (the agents' store unreachable, say) and nothing failed."""

    exit_code = 3


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
