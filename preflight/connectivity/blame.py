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


def _failing_share(paths: Sequence[Tested]) -> float:
    """The share of paths that failed, 0 unless most did, two at least."""
    failed = sum(1 for p in paths if not p.ok)
    return failed / len(paths) if failed >= 2 and failed * 2 > len(paths) else 0.0


def _worst(tested: Sequence[Tested], hosts: Sequence[str], directed: bool) -> tuple[str, Direction] | None:
    """The host whose paths fail the most, one way or the other, and which way; None when no host's mostly fail."""
    ranked: list[tuple[float, str, Direction]] = []
    for host in hosts:
        if not directed:
            share = _failing_share([p for p in tested if host in (p.source, p.destination)])
            ranked += [(share, host, "both")] if share else []
            continue
        into = _failing_share([p for p in tested if p.destination == host])
        out = _failing_share([p for p in tested if p.source == host])
        if into or out:
            ranked.append((max(into, out), host, "both" if into and out else "to" if into else "from"))
    if not ranked:
        return None
    _, host, direction = min(ranked, key=lambda r: (-r[0], r[1]))
    return host, direction


def blame(tested: Sequence[Tested], *, directed: bool = True) -> Blame:
    """Blame by majority over the tested paths. directed: a path's failure is its source's or its destination's way
    (a TCP connect, a datagram one way); otherwise a failed path says nothing of its direction (an echo lost either
    way), and a host is blamed on every path that touches it."""
    hosts = sorted({p.source for p in tested} | {p.destination for p in tested})
    apart: dict[str, Direction] = {}
    rest = list(tested)
    while (worst := _worst(rest, [h for h in hosts if h not in apart], directed)) is not None:
        apart[worst[0]] = worst[1]
        rest = [p for p in rest if worst[0] not in (p.source, p.destination)]
    # The others' paths among themselves are the reference: without a majority of them passing, no host stands apart.
    blamed = apart if rest and sum(1 for p in rest if p.ok) * 2 > len(rest) else {}
    unexplained = [i for i, p in enumerate(tested) if not p.ok and not _explains(blamed, p, directed)]
    everywhere = len(hosts) >= 3 and not any(p.ok for p in tested)
    return Blame(hosts=blamed, unexplained=unexplained, everywhere=everywhere)


def _explains(blamed: dict[str, Direction], path: Tested, directed: bool) -> bool:
    if not directed:
        return path.source in blamed or path.destination in blamed
    return blamed.get(path.destination) in ("to", "both") or blamed.get(path.source) in ("from", "both")
