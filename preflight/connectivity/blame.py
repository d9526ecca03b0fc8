"""Blame by majority: which hosts explain a set of failed paths. Pure.

Hosts are blamed one at a time, the worst first: a host most of whose remaining paths one way fail (two at least) is
set apart with its paths, and the next is judged on the paths left. The hosts set apart are blamed when most of the
paths among the others pass: a host with a smaller MTU than the others fails every path into it while the others'
paths among themselves pass, so that host is the fault and the hosts that tested it are not. When nothing is left to
compare with (two hosts alone can never tell which end a path's fault is at) the failed paths are named as paths; when
every path fails, the fault is the fabric's, not a host's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

Direction = Literal["to", "from", "both"]


class Tested(NamedTuple):
    """One path tested, and whether it passed."""

    source: str
    destination: str
    ok: bool


@dataclass(frozen=True)
class Blame:
    """The hosts the failed paths point at, the failed paths none of them explains, and whether every path failed."""

    hosts: dict[str, Direction]  # host -> the direction of its paths that fail ("both" for a path test with no direction)
    unexplained: list[int]  # indices into the tested paths
    everywhere: bool  # every path among three hosts or more failed: a fault of the whole fabric (or of every host alike)


def _failing_share(failed: int, total: int) -> float:
    """The share of paths that failed, 0 unless most did, two at least."""
    return failed / total if failed >= 2 and failed * 2 > total else 0.0


class _Tally:
    """Per host and direction, how many of its paths still in play failed and how many there are: a host set apart
    takes its paths out of play in one pass over them, so blaming stays linear in the paths."""

    def __init__(self, tested: Sequence[Tested], directed: bool) -> None:
        self.tested = tested
        self.directed = directed
        self.counts: dict[tuple[str, Direction], list[int]] = {}
        self.paths: dict[str, list[int]] = {}
        for index, path in enumerate(tested):
            for key in self._keys(path):
                count = self.counts.setdefault(key, [0, 0])
                count[0] += not path.ok
                count[1] += 1
            for host in {path.source, path.destination}:
                self.paths.setdefault(host, []).append(index)
        self.out_of_play: set[int] = set()

    def _keys(self, path: Tested) -> list[tuple[str, Direction]]:
        if self.directed:
            return [(path.destination, "to"), (path.source, "from")]
        return [(path.source, "both"), (path.destination, "both")]

    def worst(self, hosts: Sequence[str]) -> tuple[str, Direction] | None:
        """The host whose paths fail the most, one way or the other, and which way; None when no host's mostly fail."""
        ranked: list[tuple[float, str, Direction]] = []
        for host in hosts:
            directions: tuple[Direction, ...] = ("to", "from") if self.directed else ("both",)
            shares = {d: _failing_share(*self.counts.get((host, d), [0, 0])) for d in directions}
            failing = [d for d, share in shares.items() if share]
            if failing:
                ranked.append((max(shares.values()), host, failing[0] if len(failing) == 1 else "both"))
        if not ranked:
            return None
        _, host, direction = min(ranked, key=lambda r: (-r[0], r[1]))
        return host, direction

    def set_apart(self, host: str) -> None:
        for index in self.paths.get(host, []):
            if index in self.out_of_play:
                continue
            self.out_of_play.add(index)
            path = self.tested[index]
            for key in self._keys(path):
                self.counts[key][0] -= not path.ok
                self.counts[key][1] -= 1

    def in_play(self) -> list[Tested]:
        return [p for i, p in enumerate(self.tested) if i not in self.out_of_play]


def blame(tested: Sequence[Tested], *, directed: bool = True) -> Blame:
    """Blame by majority over the tested paths. directed: a path's failure is its source's or its destination's way
    (a TCP connect, a datagram one way); otherwise a failed path says nothing of its direction (an echo lost either
    way), and a host is blamed on every path that touches it."""
    hosts = sorted({p.source for p in tested} | {p.destination for p in tested})
    tally = _Tally(tested, directed)
    apart: dict[str, Direction] = {}
    some_pass = any(p.ok for p in tested)  # none: nothing to compare with, the fault is everywhere
    while some_pass and (worst := tally.worst([h for h in hosts if h not in apart])) is not None:
        apart[worst[0]] = worst[1]
        tally.set_apart(worst[0])
    # The others' paths among themselves are the reference: without a majority of them passing, no host stands apart.
    rest = tally.in_play()
    blamed = apart if rest and sum(1 for p in rest if p.ok) * 2 > len(rest) else {}
    unexplained = [i for i, p in enumerate(tested) if not p.ok and not _explains(blamed, p, directed)]
    everywhere = len(hosts) >= 3 and not any(p.ok for p in tested)
    return Blame(hosts=blamed, unexplained=unexplained, everywhere=everywhere)


def _explains(blamed: dict[str, Direction], path: Tested, directed: bool) -> bool:
    if not directed:
        return path.source in blamed or path.destination in blamed
    return blamed.get(path.destination) in ("to", "both") or blamed.get(path.source) in ("from", "both")
