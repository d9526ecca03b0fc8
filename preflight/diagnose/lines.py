"""Finding a log's lines worth a closer look, fast: a log can be gigabytes of NCCL INFO lines and training steps.

Python's regex engine tries an alternation of patterns at every position of the text, and a pattern starting with a
class, a case-insensitive word or a lookbehind likewise; a literal it finds with a fast scan, and ``str.find`` faster
still. So each reader names the literal words its lines hold (``literal_finder``), or the signature table's patterns are
each reduced to a word every match of it must hold (``required_word``); the lines holding one are found with
``str.find`` over a whole block, and only those lines are matched against the patterns. A pattern with no such word is
searched for on its own.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

# The regex module's own parser (re._parser; sre_parse before Python 3.11): what a pattern's every match must hold.
if sys.version_info >= (3, 11):
    from re import _parser as _SRE
else:  # Python 3.10: the same module under its old name
    import sre_parse as _SRE
_REPEATS = tuple(getattr(_SRE, name) for name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") if hasattr(_SRE, name))
# A shorter word is found on too many lines to be worth finding: its pattern is searched for on its own instead.
MIN_WORD = 4


@dataclass(frozen=True)
class LineFinder:
    """What finds a block's candidate lines: literal words (``str.find``) and, for what has no word, patterns."""

    words: tuple[str, ...] = ()
    patterns: tuple[re.Pattern[str], ...] = ()

    def line_starts(self, block: str) -> set[int]:
        """Where each line of block that holds a word or a pattern's match starts."""
        starts: set[int] = set()
        for word in self.words:
            starts.update(_word_line_starts(word, block))
        for pattern in self.patterns:
            starts.update(_hit_line_starts(pattern, block))
        return starts


def literal_finder(*literals: str) -> LineFinder:
    """The lines holding any of these words, as written."""
    return LineFinder(words=tuple(dict.fromkeys(literals)))


def pattern_finder(sources: Iterable[str]) -> LineFinder:
    """The lines in which any of these patterns (multi-line: ``^`` is a line's start) could match: each pattern's required
    word where it has one, else the pattern itself."""
    words: list[str] = []
    patterns: list[re.Pattern[str]] = []
    for source in dict.fromkeys(sources):
        word = required_word(source)
        if len(word) >= MIN_WORD:
            words.append(word)
        else:
            patterns.append(re.compile(source, re.MULTILINE))
    # A line holding a word holds every word inside it: the longer one finds nothing more.
    kept = [word for word in dict.fromkeys(words) if not any(other != word and other in word for other in words)]
    return LineFinder(words=tuple(kept), patterns=tuple(patterns))


def lines_with(finder: LineFinder, block: str, first_line: int) -> Iterator[tuple[int, str]]:
    """Each line of block that finder finds, once, in order, with its number (block's first line is first_line)."""
    line, counted = first_line, 0
    for start in sorted(finder.line_starts(block)):
        line += block.count("\n", counted, start)
        counted = start
        end = block.find("\n", start)
        yield line, block[start:len(block) if end < 0 else end]


def _word_line_starts(word: str, block: str) -> Iterator[int]:
    at = block.find(word)
    while at >= 0:
        yield block.rfind("\n", 0, at) + 1
        end = block.find("\n", at)
        if end < 0:
            return
        at = block.find(word, end + 1)


def _hit_line_starts(pattern: re.Pattern[str], block: str) -> Iterator[int]:
    # The search goes on at the line after each hit, not after the hit's end: a hit that runs on past its line's end (a
    # class such as \s takes the newline) must not hide the next line.
    position = 0
    while (hit := pattern.search(block, position)) is not None:
        yield block.rfind("\n", 0, hit.start()) + 1
        end = block.find("\n", hit.start())
        if end < 0:
            return
        position = end + 1


def required_word(source: str) -> str:
    """The longest literal text, as written (case counts), that every match of the pattern holds within one line; ""
    where the pattern guarantees none this can see (its words are all case-insensitive, in alternatives, or optional)."""
    try:
        parsed = _SRE.parse(source)
    except re.error:
        return ""
    return "" if parsed.state.flags & re.IGNORECASE else _longest(parsed.data, ignorecase=False)


def literal_start(source: str) -> str:
    """The literal text, as written, that every match of the pattern begins with; "" where it begins with anything else
    (a class, a group, an optional or case-insensitive word)."""
    try:
        parsed = _SRE.parse(source)
    except re.error:
        return ""
    if parsed.state.flags & re.IGNORECASE:
        return ""
    start = ""
    items: list[tuple[Any, Any]] = list(parsed.data)
    for op, argument in items:
        if op != _SRE.LITERAL or argument == ord("\n"):
            break
        start += chr(argument)
    return start


def _longest(items: Iterable[tuple[Any, Any]], ignorecase: bool) -> str:
    best, run = "", ""
    for op, argument in items:
        if op == _SRE.LITERAL and not ignorecase and argument != ord("\n"):
            run += chr(argument)
            continue
        best, run = max(best, run, key=len), ""
        if op == _SRE.SUBPATTERN:  # a group: (number, flags added, flags removed, its items)
            _, added, removed, inner = argument
            inner_ignorecase = (ignorecase or bool(added & re.IGNORECASE)) and not removed & re.IGNORECASE
            best = max(best, _longest(inner.data, inner_ignorecase), key=len)
        elif op in _REPEATS and argument[0] >= 1:  # (at least, at most, its items): held at least once
            best = max(best, _longest(argument[2].data, ignorecase), key=len)
    return max(best, run, key=len)
