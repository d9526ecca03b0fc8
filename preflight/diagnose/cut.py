"""A log whose last line stops mid-message: a paste cut off at the thread's or the terminal's edge, a process killed
while it wrote. The line's end is read against the starts of messages that name one failure alone.

A signature's pattern begins with literal text (``lines.literal_start``) that every line it matches begins with. A cut
line that holds enough of such a start is that signature's line, cut short, provided no message the catalogue records
for another cause (or for none) holds as much of it: "Watchdog caught collective operati" can only be the watchdog's
timeout, while "The client socket has failed to connect to " begins two messages of different causes. How much is
enough is measured per start against every recorded message (tests/data/messages, 1,200 of them across the sources'
versions) by tests/cut_starts.py, which writes playbooks/cut-starts.yaml; a test fails when it is out of date.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from preflight.errors import EnvironmentProblem

# The fewest characters of a start a cut line must hold, whatever the catalogue says: the catalogue records what the
# sources print, not every program's output, and a few words are shared by many. "CUDA error: " (12) begins every CUDA
# error's message and "NCCL WARN Cuda failure " (23) every CUDA failure NCCL reports, their cause after them.
FLOOR_CHARS = 24
ELLIPSES = ("...", "\u2026")  # a cut the paste marks: "operati..." or "operati…"


@dataclass(frozen=True)
class CutStart:
    """The start of a signature's pattern, and how much of it a cut line must hold to be read as that signature."""

    signature: str
    start: str
    least: int  # >= FLOOR_CHARS
    upto: int  # >= least and <= len(start): past it the start is a placeholder's value in the source's message

    def held(self, tail: str) -> bool:
        """Whether tail (a line's end, from some position) agrees with the start for at least `least` characters,
        stopping by `upto` (while the text is the source's own) or running past the whole start."""
        agreed = min(len(tail), len(self.start))
        fits = agreed <= self.upto or agreed == len(self.start)
        return self.least <= agreed and fits and tail[:agreed] == self.start[:agreed]


@dataclass(frozen=True)
class CutReading:
    """A cut line read as a signature's: where in the line its start begins."""

    start: CutStart
    at: int


def parse_cut_starts(data: Any, signatures: Iterable[str], where: str = "cut-starts") -> tuple[CutStart, ...]:
    """The starts of the YAML form, each naming a signature of the table; a malformed one is an EnvironmentProblem."""
    known = set(signatures)
    if not isinstance(data, dict) or not isinstance(data.get("starts"), list):
        raise EnvironmentProblem(f"{where}: expected a mapping with a list `starts`")
    starts = []
    for index, entry in enumerate(data["starts"]):
        label = f"{where}: start {index}"
        if not isinstance(entry, dict) or entry.get("signature") not in known:
            raise EnvironmentProblem(f"{label}: needs a `signature` of signatures.yaml")
        start, least, upto = entry.get("start"), entry.get("least"), entry.get("upto")
        if not isinstance(start, str) or not isinstance(least, int) or not isinstance(upto, int) \
                or not FLOOR_CHARS <= least <= upto <= len(start):
            raise EnvironmentProblem(f"{label}: needs a `start`, and `least` and `upto` from {FLOOR_CHARS} to the start's length")
        starts.append(CutStart(signature=entry["signature"], start=start, least=least, upto=upto))
    return tuple(starts)


def read_cut(text: str, starts: Iterable[CutStart]) -> CutReading | None:
    """The start the end of text holds (the earliest in the line, the longest there), or None."""
    by_head: dict[str, list[CutStart]] = {}
    for start in starts:
        by_head.setdefault(start.start[:FLOOR_CHARS], []).append(start)
    text = text.rstrip()
    for mark in ELLIPSES:  # where the one who pasted it marked the cut
        if text.endswith(mark):
            text = text[:-len(mark)].rstrip()
            break
    for at in range(len(text) - FLOOR_CHARS + 1):
        candidates = by_head.get(text[at:at + FLOOR_CHARS])
        if not candidates:
            continue
        tail = text[at:]
        held = [start for start in candidates if start.held(tail)]
        if held:
            return CutReading(start=max(held, key=lambda s: len(s.start)), at=at)
    return None
