"""One interface over every way of running a command on a host.

Every stage above this module is transport-blind: it hands over ``RemoteCommand``s and gets
one ``CommandResult`` per host back, always, whatever happened on that host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from preflight.spec import HostSpec


@dataclass(frozen=True)
class RemoteCommand:
    """A command for one host: argv (quoted by the transport), text for its stdin, a deadline."""

    host: HostSpec
    argv: Sequence[str]
    stdin: str = ""
    timeout_s: float = 60.0
    # Commands of one group stand or fall together (a launch's hosts): when one's host is lost, the transport ends the
    # others, which would only wait for it until their own deadlines. None: on its own.
    group: str | None = None


@dataclass(frozen=True)
class CommandResult:
    """What became of one RemoteCommand.

    ``reached`` is False when the command could not be run or did not finish in time (host
    unreachable, auth refused, host key refused, deadline passed); ``reason`` then says why in
    one line. When ``reached`` is True the command ran to its end and ``exit_code`` is its
    status. ``lost``: the host went away under the running command (it stopped answering SSH's
    keepalives, or its connection dropped), so nobody knows how the command ended.
    """

    host: str
    reached: bool
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    reason: str | None = None
    lost: bool = False
    # Local wall-clock instants around the command, to correct the host's clock reading
    # by the round trip.
    sent_unix_s: float = 0.0
    received_unix_s: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.reached and self.exit_code == 0


class Transport(Protocol):
    """Runs commands on hosts; never raises for a host's failure, reports it instead."""

    def run(self, commands: Sequence[RemoteCommand], *, all_at_once: bool = False) -> list[CommandResult]:
        """Run every command (in parallel where the transport can) and return one result each,
        in the order given, within each command's deadline. ``all_at_once`` starts every command
        together whatever the parallelism bound: the ranks of a collective wait for each other."""
        ...

    def close(self) -> None:
        """Release connections; leave nothing running on any host."""
        ...
