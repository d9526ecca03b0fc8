"""Finding a log's candidate lines fast (preflight/diagnose/lines.py, timeline.py's last time): what is skipped must be
what no pattern could match. Each signature's required word is proved against strings made from its pattern; a hit that
runs past its line must not hide the next line; a log split into blocks anywhere keeps every time it had in one."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from conftest import FUZZ_SEED_ENV
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from preflight.diagnose.lines import LineFinder, lines_with, literal_finder, pattern_finder, required_word
from preflight.diagnose.scan import load_signatures
from preflight.diagnose.timeline import Timeline

LOGS = Path(__file__).parent / "data" / "logs"
# A new seed each run unless PREFLIGHT_FUZZ_SEED gives one (conftest.py prints it in pytest's header to replay).
FUZZ_SEED = int(os.environ[FUZZ_SEED_ENV])
SOURCES = list(dict.fromkeys(p.pattern for s in load_signatures().signatures for p in (*s.patterns, *s.details, *s.unless)))


@pytest.mark.parametrize(("source", "word"), [
    ("NCCL WARN (?P<what>.+) failed", "NCCL WARN "),  # the longest run
    ("x (?P<what>.+) failed", " failed"),  # after a group
    ("(?i:unhandled) cuda error", " cuda error"),  # a case-insensitive word is no word as written
    ("(?i:unhandled cuda error) x", " x"),
    ("(?i)unhandled cuda error", ""),
    ("(?:connect|accept) failed: (?:reset|refused)", " failed: re"),  # alternatives hold only what they share
    ("(?:connect|accept)", ""),
    ("(?:timed out after )?(?P<s>\\d+) ms", " ms"),  # an optional group holds nothing required
    ("(?:Watchdog caught){1,2} x", "Watchdog caught"),  # a repeat at least once holds its word
    ("ab\\ncdefg", "cdefg"),  # a word never spans a newline: lines are matched one at a time
    ("ab[cd]e", "ab"),  # a class is no letter of a word
    ("(unbalanced", ""),  # not a pattern: nothing to find by, the caller searches for it (and reports it)
])
def test_the_required_word_is_what_every_match_must_hold(source: str, word: str) -> None:
    assert required_word(source) == word


def test_every_signature_pattern_is_found_by_a_word() -> None:
    """Every pattern of the shipped table has a word to be found by; a new one without is searched for on its own, which
    costs a regex pass over the whole log: this names it."""
    finder = pattern_finder(SOURCES)
    assert not finder.patterns, [p.pattern for p in finder.patterns]
    assert len(finder.words) >= 150


@seed(FUZZ_SEED)
@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.data())
def test_every_match_of_a_signature_pattern_holds_its_word(data: st.DataObject) -> None:
    source = data.draw(st.sampled_from(SOURCES))
    pattern, word = re.compile(source), required_word(source)
    text = data.draw(st.from_regex(pattern))
    for match in pattern.finditer(text):
        if "\n" not in match.group(0):  # a match within one line: the only kind a candidate line is matched for
            assert word in match.group(0), (source, word, match.group(0))


def test_a_hit_that_runs_past_its_line_does_not_hide_the_next_line() -> None:
    # "foo\s+\w+" matches "foo\nfoo" across the newline; a scan resuming after that match would miss line 2's "foo bar".
    finder = LineFinder(patterns=(re.compile(r"foo\s+\w+", re.MULTILINE),))
    assert list(lines_with(finder, "foo\nfoo bar\nbaz\n", 10)) == [(10, "foo"), (11, "foo bar")]


def test_a_word_found_twice_in_a_line_gives_the_line_once_and_lines_come_in_order() -> None:
    finder = literal_finder("NCCL WARN", "failed", "NCCL WARN")
    block = "ok\nx failed NCCL WARN failed\nok\nNCCL WARN y\nlast failed"
    assert list(lines_with(finder, block, 1)) == [(2, "x failed NCCL WARN failed"), (4, "NCCL WARN y"), (5, "last failed")]


def test_every_line_a_signature_matches_in_the_built_logs_is_found() -> None:
    """The table's words find every line of the built logs (tests/data/logs/*.log) that a signature's pattern matches."""
    patterns = [re.compile(source) for source in SOURCES]
    checked = 0
    for path in sorted(LOGS.glob("*.log")):
        block = path.read_text(encoding="utf-8", errors="replace")
        found = {number for number, _ in lines_with(load_signatures().line_finder, block, 1)}
        for number, text in enumerate(block.split("\n"), 1):
            if any(p.search(text) for p in patterns):
                checked += 1
                assert number in found, (path.name, number, text)
    assert checked >= 20


def test_a_block_without_wanted_lines_hands_on_its_last_time_however_far_from_its_end() -> None:
    timeline = Timeline()
    timeline.feed("[E1127 03:33:50 x.py:1] a\n[E1127 03:33:51 x.py:1] b\n" + "NCCL INFO no time\n" * 2000, 1, set())
    timeline.feed("RuntimeError: boom\n", 2003, {2003})
    stamp = timeline.at(2003)
    assert stamp is not None and stamp.shown() == "after 03:33:51" and timeline.stamped


def _times(timeline: Timeline, count: int) -> list[str | None]:
    return [(s.to_json() + ("" if s.exact else " after")) if (s := timeline.at(n)) else None for n in range(1, count + 1)]


@seed(FUZZ_SEED)
@settings(max_examples=150, deadline=None, database=None)
@given(st.lists(st.sampled_from(["", "2026-11-27 03:34:0{} INFO step", "[E1127 03:33:5{} x.py:1] failed", "x" * 3000 + " {}",
                                 "13-99 no time {}", "[I1327 03:33:57 bad month {}]"]), min_size=1, max_size=40),
       st.data())
def test_a_log_split_into_blocks_anywhere_keeps_every_time_it_had_in_one(kinds: list[str], data: st.DataObject) -> None:
    """Blocks without wanted lines keep only their last time (searched for from their end); a block with wanted lines
    reads them all. However the log is cut, every wanted line gets the time it gets read as one block."""
    lines = [kind.format(n % 10) for n, kind in enumerate(kinds)]
    wanted = set(data.draw(st.lists(st.integers(1, len(lines)), max_size=6)))
    whole = Timeline()
    whole.feed("".join(line + "\n" for line in lines), 1, wanted)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(lines) - 1), max_size=8)))) if len(lines) > 1 else []
    split, first = Timeline(), 1
    for start, end in zip([0, *cuts], [*cuts, len(lines)], strict=True):
        split.feed("".join(line + "\n" for line in lines[start:end]), first, {w for w in wanted if start < w <= end})
        first += end - start
    assert _times(split, len(lines)) == _times(whole, len(lines))
    assert split.stamped == whole.stamped
