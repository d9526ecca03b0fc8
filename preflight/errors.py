"""The one exception base. Only the CLI turns these into exit codes (see DESIGN.md's table)."""

from __future__ import annotations


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
