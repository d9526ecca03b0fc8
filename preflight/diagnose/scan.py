"""Known failure signatures in a log, as finding codes with the catalogue's cause and fix, root cause first.

The signature table is data (playbooks/signatures.yaml). Scanning is streaming: the log is fed in blocks of whole
lines, the lines any pattern of the table could match are found by the words those patterns require (lines.py), and only
those lines are matched against each signature, so a log of any size costs one pass and bounded memory. The other
readers of a log (progress.py, versions.py) find their lines the same way, by the literal words those lines hold.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any

import yaml

from preflight.catalogue import load_catalogue
from preflight.diagnose.cut import CutStart, parse_cut_starts, read_cut
from preflight.diagnose.lines import LineFinder, lines_with, literal_finder, pattern_finder
from preflight.errors import EnvironmentProblem, one_line
from preflight.resources import shipped_dir

TIERS = ("hardware", "cause", "consequence")  # root cause first
HANG_CODE = "PF713"  # a log that stops without an error line (progress.py)
DIVERGED_CODE = "PF714"  # a collective not every rank entered, from flight recorder dumps (flight_recorder.py)
EXCERPT_CHARS = 240
KEPT_LINES = 3  # matching lines kept per diagnosis; the rest are counted
KEPT_VALUES = 16  # distinct values kept per captured group
KEPT_RANKS = 1 << 16
CUT_WINDOW = 4096  # the end of a last line that a cut message's start is looked for in (a start and its values fit)
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NAMED_GROUP = re.compile(r"\(\?P<\w+>")


@dataclass(frozen=True)
class Signature:
    """One known failure: the patterns that recognize it and the codes it maps to, most likely first."""

    id: str
    tier: str
    codes: tuple[str, ...]
    patterns: tuple[re.Pattern[str], ...]
    details: tuple[re.Pattern[str], ...] = ()
    refine: tuple[tuple[tuple[tuple[str, re.Pattern[str]], ...], tuple[str, ...]], ...] = ()
    requires: tuple[str, ...] = ()  # groups that must have captured something for a match to count
    unless: tuple[re.Pattern[str], ...] = ()  # lines that show the failure did not happen
    check: str = ""  # the check that finds the cause before a job, and how to run it
    after_error: str = ""  # the tier it takes when another recognized failure comes first in the log ("" keeps its own)
    after: tuple[re.Pattern[str], ...] = ()  # lines that show an earlier failure no signature names, for after_error

    def satisfied(self, values: Mapping[str, list[str]], ranks: set[int]) -> bool:
        """Whether every required group captured something (rank groups count as ranks)."""
        return all(ranks if group == "rank" or group.startswith("rank_") else values.get(group) for group in self.requires)

    def codes_for(self, values: Mapping[str, list[str]]) -> tuple[str, ...]:
        """The codes, after the first refine rule that the captured values satisfy."""
        for conditions, codes in self.refine:
            if all(any(pattern.search(v) for v in values.get(group, ())) for group, pattern in conditions):
                return codes
        return self.codes


@dataclass(frozen=True)
class SignatureTable:
    """Every signature, the rank prefixes, and the expressions that find every line worth a closer look."""

    signatures: tuple[Signature, ...]
    rank_patterns: tuple[re.Pattern[str], ...]
    # Every line any signature's pattern could match: each pattern's required word, found with str.find, where one
    # alternation of them all would be tried at every position of the log (lines.py; bench/diagnose_speed.py).
    line_finder: LineFinder
    screens: tuple[re.Pattern[str], ...] = ()  # per signature, one expression of all its lines: most signatures skip a line at once
    host_patterns: tuple[re.Pattern[str], ...] = ()  # where a line names its host (NCCL's host:pid:tid prefix)
    cut_starts: tuple[CutStart, ...] = ()  # what a log's last line, cut mid-message, is read by (cut.py)


@cache
def load_signatures() -> SignatureTable:
    """The shipped table in playbooks/signatures.yaml, compiled, with the starts of playbooks/cut-starts.yaml."""
    path = shipped_dir("playbooks") / "signatures.yaml"
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    table = parse_signatures(data, str(path))
    cut_path = shipped_dir("playbooks") / "cut-starts.yaml"
    with open(cut_path, encoding="utf-8") as f:
        starts = parse_cut_starts(yaml.safe_load(f), (s.id for s in table.signatures), str(cut_path))
    return replace(table, cut_starts=starts)


def parse_signatures(data: Any, where: str = "signatures") -> SignatureTable:
    """Compile a signature table from its YAML form; a malformed one is an EnvironmentProblem naming the entry."""
    if not isinstance(data, dict) or not isinstance(data.get("signatures"), list):
        raise EnvironmentProblem(f"{where}: expected a mapping with a list `signatures`")
    signatures = []
    sources: list[str] = []
    screens = []
    for index, entry in enumerate(data["signatures"]):
        name = entry.get("id") if isinstance(entry, dict) else None
        label = f"{where}: signature {name or index}"
        if not isinstance(entry, dict) or not isinstance(name, str):
            raise EnvironmentProblem(f"{label}: needs an `id`")
        tier = entry.get("tier")
        if tier not in TIERS:
            raise EnvironmentProblem(f"{label}: tier must be one of {', '.join(TIERS)}, not {tier!r}")
        codes = _codes(entry.get("codes"), label)
        patterns = [_compile(p, 0, label) for p in _strings(entry.get("patterns"), f"{label}: patterns")]
        if not patterns:
            raise EnvironmentProblem(f"{label}: needs at least one pattern")
        details = [_compile(p, 0, label) for p in _strings(entry.get("details", []), f"{label}: details")]
        refine = []
        for rule in entry.get("refine", []):
            if not isinstance(rule, dict) or not isinstance(rule.get("when"), dict):
                raise EnvironmentProblem(f"{label}: each refine rule needs `when` and `codes`")
            conditions = tuple((str(group), _compile(str(p), re.IGNORECASE, label)) for group, p in rule["when"].items())
            refine.append((conditions, _codes(rule.get("codes"), label)))
        check = entry.get("check")
        if not isinstance(check, str) or not check.strip():
            raise EnvironmentProblem(f"{label}: needs a `check` (what finds the cause before a job, or `none: ...`)")
        requires = tuple(_strings(entry.get("requires", []), f"{label}: requires"))
        unless = tuple(_compile(p, 0, label) for p in _strings(entry.get("unless", []), f"{label}: unless"))
        after_error = entry.get("after_error", "")
        if after_error and after_error not in TIERS:
            raise EnvironmentProblem(f"{label}: after_error must be one of {', '.join(TIERS)}, not {after_error!r}")
        after = tuple(_compile(p, 0, label) for p in _strings(entry.get("after", []), f"{label}: after"))
        if after and not after_error:
            raise EnvironmentProblem(f"{label}: `after` lines need after_error (the tier they give)")
        signatures.append(Signature(id=name, tier=tier, codes=codes, patterns=tuple(patterns), details=tuple(details),
                                    refine=tuple(refine), requires=requires, unless=unless, check=one_line(check),
                                    after_error=after_error, after=after))
        # One alternation of every pattern; group names repeat across signatures, so they go.
        own = [f"(?:{_NAMED_GROUP.sub('(?:', p.pattern)})" for p in (*patterns, *details, *unless, *after)]
        screens.append(re.compile("|".join(own)))
        sources += own
    ranks = tuple(_compile(p, 0, f"{where}: rank_patterns") for p in _strings(data.get("rank_patterns", []), f"{where}: rank_patterns"))
    hosts = tuple(_compile(p, 0, f"{where}: host_patterns") for p in _strings(data.get("host_patterns", []), f"{where}: host_patterns"))
    return SignatureTable(signatures=tuple(signatures), rank_patterns=ranks, line_finder=pattern_finder(sources),
                          screens=tuple(screens), host_patterns=hosts)


def _strings(value: Any, label: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise EnvironmentProblem(f"{label}: expected a list of strings")
    return value


def _codes(value: Any, label: str) -> tuple[str, ...]:
    codes = _strings(value, f"{label}: codes")
    if not codes or not all(re.fullmatch(r"PF\d{3}", c) for c in codes):
        raise EnvironmentProblem(f"{label}: codes must be a non-empty list of PFnnn codes")
    return tuple(codes)


def _compile(source: str, flags: int, label: str) -> re.Pattern[str]:
    try:
        return re.compile(source, flags)
    except re.error as e:
        raise EnvironmentProblem(f"{label}: bad pattern {source!r}: {e}") from None


def signature_codes() -> set[str]:
    """Every code that diagnose can report: the signatures' (refine rules included), and the hang's and the flight
    recorder's (a denylisted version in a log is PF102, which `preflight check` emits too)."""
    table = load_signatures()
    codes = {code for s in table.signatures for code in (*s.codes, *(c for _, codes in s.refine for c in codes))}
    return codes | {HANG_CODE, DIVERGED_CODE}


@dataclass(frozen=True)
class Excerpt:
    """One matching line: its number (1-based), the visible part of it, trimmed, and the file it is in (a folder's)."""

    line: int
    text: str
    source: str = ""


@dataclass
class _Found:
    """What one signature has seen so far."""

    first_line: int = 0
    matches: int = 0
    excerpts: list[Excerpt] = field(default_factory=list)
    values: dict[str, list[str]] = field(default_factory=dict)
    ranks: set[int] = field(default_factory=set)
    first_rank: str = ""  # the rank the first matching line's prefix names (a merged log's)
    cut_line: int = 0  # the line read from its cut start (cut.py), where that is how this signature was seen

    def keep(self, group: str, value: str | None) -> None:
        if value is None:
            return
        if group == "rank" or group.startswith("rank_"):
            if value.isdigit() and len(self.ranks) < KEPT_RANKS:
                self.ranks.add(int(value))
            return
        kept = self.values.setdefault(group, [])
        value = value.strip()
        if value and value not in kept and len(kept) < KEPT_VALUES:
            kept.append(value)


@dataclass(frozen=True)
class Diagnosis:
    """One recognized failure: its code and the other likely ones, where in the log, what was captured, and the remedy."""

    code: str
    codes: tuple[str, ...]  # most likely first; codes[0] == code
    tier: str
    signatures: tuple[str, ...]
    first_line: int
    matches: int
    excerpts: tuple[Excerpt, ...]
    details: dict[str, list[str]]
    ranks: tuple[int, ...]
    before_job: str = ""  # the check that finds the cause before a job (its code and command), or why none does
    first_rank: str = ""  # the rank the first matching line's prefix names, in a merged log ("" none)
    cut_line: int = 0  # a last line cut mid-message that only its start names (cut.py); 0 none

    def to_json(self) -> dict[str, Any]:  # part of diagnose's --json output, read by no other stage
        """The JSON form, with the catalogue's title, cause, fix and workaround."""
        catalogue = load_catalogue()
        entry = catalogue.get(self.code, {})
        return {
            "code": self.code, "title": entry.get("title", ""), "tier": self.tier, "signatures": list(self.signatures),
            "first_line": self.first_line, "matches": self.matches,
            "lines": [{"line": e.line, "text": e.text, **({"source": e.source} if e.source else {})} for e in self.excerpts],
            "details": dict(self.details), "ranks": list(self.ranks),
            "cause": one_line(entry.get("cause", "")), "fix": one_line(entry.get("fix", "")),
            "workaround": one_line(entry["workaround"]) if "workaround" in entry else None,
            "before_job": self.before_job or None, "cut_line": self.cut_line or None,
            "also_likely": [{"code": c, "title": catalogue.get(c, {}).get("title", "")} for c in self.codes[1:]],
        }


def _values(values: list[str]) -> str:
    return ", ".join(values) + (" (and more)" if len(values) >= KEPT_VALUES else "")


def rank_ranges(ranks: Iterable[int]) -> str:
    """0-3, 5, 7-8: ranks as runs."""
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


class Scanner:
    """Feed it the log in blocks of text (whole lines, except inside a line too long to hold); then ask for the diagnoses."""

    def __init__(self, table: SignatureTable | None = None) -> None:
        self.table = table or load_signatures()
        self.lines = 0  # newlines seen: the next block starts on line lines + 1
        self.ends_midline = False
        self._found: dict[str, _Found] = {}
        self._details: dict[str, _Found] = {}  # detail captures, kept apart until their signature matches
        self.first_error: Excerpt | None = None  # the first line that looks like an error, recognized or not
        self._ruled_out: set[str] = set()  # signatures whose `unless` lines the log holds
        self._after: dict[str, int] = {}  # each signature's first `after` line
        self._last: tuple[int, str] = (0, "")  # the last line that is not blank, and its number
        self._last_matched = 0  # the last line a signature's pattern matched

    def feed(self, block: str) -> None:
        """Scan one block (colour codes removed first: they split a message a pattern would match)."""
        if "\x1b" in block:
            block = _ANSI_ESCAPE.sub("", block)
        for line, text in lines_with(self.table.line_finder, block, self.lines + 1):
            self._line(text, line)
        if self.first_error is None:
            self.first_error = first_error_line(block, self.lines + 1)
        if kept := block.rstrip():
            begins = kept.rfind("\n") + 1
            self._last = (self.lines + 1 + kept.count("\n", 0, begins), kept[begins:])
        self.lines += block.count("\n")
        self.ends_midline = not block.endswith("\n")

    def first_lines(self) -> set[int]:
        """The line of each signature's first match so far (a folder's merge reads the time printed there)."""
        return {found.first_line for found in self._found.values()}

    def _line(self, text: str, line: int) -> None:
        for signature, screen in zip(self.table.signatures, self.table.screens, strict=True):
            if screen.search(text) is None:
                continue
            for pattern in signature.patterns:
                match = pattern.search(text)
                if match is not None:
                    self._matched(signature, match, text, line)
                    break
            if any(pattern.search(text) for pattern in signature.unless):
                self._ruled_out.add(signature.id)
            if signature.id not in self._after and any(pattern.search(text) for pattern in signature.after):
                self._after[signature.id] = line
            for pattern in signature.details:
                match = pattern.search(text)
                if match is not None:
                    found = self._details.setdefault(signature.id, _Found())
                    for group, value in match.groupdict().items():
                        found.keep(group, value)

    def _matched(self, signature: Signature, match: re.Match[str], text: str, line: int) -> None:
        found = self._found.setdefault(signature.id, _Found(first_line=line))
        self._last_matched = line
        found.matches += 1
        if len(found.excerpts) < KEPT_LINES and all(e.line != line for e in found.excerpts):
            found.excerpts.append(Excerpt(line=line, text=line_excerpt(text, match.start())))
        for group, value in match.groupdict().items():
            found.keep(group, value)
        self._keep_place(found, text, match.start())

    def _keep_place(self, found: _Found, text: str, at: int) -> None:
        """The ranks and host the line's prefixes name, in its visible part around position `at` (a tqdm bar's updates
        come before its last carriage return); a signature's first line names its first rank."""
        visible = text[text.rfind("\r", 0, at) + 1:]
        for pattern in self.table.rank_patterns:
            for rank in pattern.finditer(visible):
                found.keep("rank", rank.group("rank"))
                if found.matches == 1 and not found.first_rank:
                    found.first_rank = str(int(rank.group("rank")))
        for pattern in self.table.host_patterns:
            if (host := pattern.search(visible)) is not None:
                found.keep("host", host.group("host"))

    def _cut(self) -> dict[str, _Found]:
        """The last line, where no pattern reads it whole but its end holds the start of one that names one failure
        (cut.py), as that signature's one match; {} where it is not such a line, or the signature matched already."""
        line, text = self._last
        if not line or line == self._last_matched or not self.table.cut_starts:
            return {}
        text = text[-CUT_WINDOW:]
        reading = read_cut(text, self.table.cut_starts)
        if reading is None or reading.start.signature in self._found:
            return {}
        found = _Found(first_line=line, matches=1, cut_line=line)
        found.excerpts.append(Excerpt(line=line, text=line_excerpt(text, reading.at)))
        self._keep_place(found, text, reading.at)
        return {reading.start.signature: found}

    def diagnoses(self) -> tuple[Diagnosis, ...]:
        """What was recognized: one diagnosis per code, root cause first (by tier, then by the line of its first match)."""
        seen = {**self._found, **self._cut()}
        matched: list[tuple[Signature, _Found, tuple[str, ...]]] = []
        for signature in self.table.signatures:
            found = seen.get(signature.id)
            if found is None or signature.id in self._ruled_out:
                continue
            found = _with_details(found, self._details.get(signature.id))
            if not signature.satisfied(found.values, found.ranks):
                continue
            matched.append((signature, found, signature.codes_for(found.values)))
        grouped: dict[str, list[tuple[Signature, _Found, tuple[str, ...], int]]] = {}
        for signature, found, codes in matched:
            # A signal or a cancellation after another failure is that failure's consequence (after_error). An earlier
            # match that names this code among its likely ones is the same failure read less precisely (a paste that
            # wraps gloo's error puts its first half on the line before), not another.
            earlier = any(f.first_line < found.first_line and c[0] != codes[0] and codes[0] not in c for _, f, c in matched)
            earlier = earlier or self._after.get(signature.id, found.first_line) < found.first_line
            tier = signature.after_error if signature.after_error and earlier else signature.tier
            grouped.setdefault(codes[0], []).append((signature, found, codes, TIERS.index(tier)))
        result = []
        for code, members in grouped.items():
            # Signatures that name the same code are one diagnosis. It ranks by its most basic tier and that tier's
            # earliest match; its other likely codes are those of that tier's signatures, the earliest's first.
            best = min(rank for _, _, _, rank in members)
            leading = sorted((m for m in members if m[3] == best), key=lambda m: m[1].first_line)
            codes = tuple(dict.fromkeys(c for _, _, cs, _ in leading for c in cs))
            details: dict[str, list[str]] = {}
            for _, found, _, _ in members:
                for group, values in found.values.items():
                    kept = details.setdefault(group, [])
                    kept += [v for v in values if v not in kept][: max(0, KEPT_VALUES - len(kept))]
            excerpts = sorted((e for _, f, _, _ in members for e in f.excerpts), key=lambda e: e.line)
            diagnosis = Diagnosis(
                code=code, codes=codes, tier=TIERS[best], signatures=tuple(s.id for s, _, _, _ in members),
                first_line=min(f.first_line for _, f, _, _ in members), matches=sum(f.matches for _, f, _, _ in members),
                excerpts=tuple(excerpts[:KEPT_LINES]), details=details, ranks=tuple(sorted({r for _, f, _, _ in members for r in f.ranks})),
                before_job=leading[0][0].check, first_rank=min(((f.first_line, f.first_rank) for _, f, _, _ in members))[1],
                cut_line=max(f.cut_line for _, f, _, _ in members),
            )
            result.append(((best, leading[0][1].first_line), diagnosis))
        return tuple(d for _, d in sorted(result, key=lambda item: item[0]))


# What an error looks like to a reader, whatever raised it: a traceback, an exception class, an ERROR or a WARN level,
# glog's E prefix ([E1206 18:44:12 ...] or [E socket.cpp:...]), a killed or failed process.
_ERROR_LINE = re.compile(r"Traceback \(most recent call last\)|\w(?:Error|Exception)\b|\bERROR\b|NCCL WARN|\[E[\d ]"
                         r"|\bFAILED\b|\bKilled\b|\bfailed\b|exitcode\s*: -?[1-9]|\berror:")


# The literal words those lines hold: found by the fast literal scan, then the lines holding one are matched.
_ERROR_WORDS = literal_finder("Traceback", "Error", "Exception", "ERROR", "NCCL WARN", "[E", "FAILED", "Killed", "failed",
                              "exitcode", "error:")


def first_error_line(block: str, first_line: int) -> Excerpt | None:
    """The first line of block that looks like an error, with its number (block's first line is first_line)."""
    for line, text in lines_with(_ERROR_WORDS, block, first_line):
        if (hit := _ERROR_LINE.search(text)) is not None:
            return Excerpt(line=line, text=line_excerpt(text, hit.start()))
    return None


def _with_details(found: _Found, detail: _Found | None) -> _Found:
    """A signature's matches with what its detail patterns captured anywhere in the log."""
    if detail is None:
        return found
    merged = replace(found, excerpts=list(found.excerpts), values={k: list(v) for k, v in found.values.items()},
                     ranks=set(found.ranks))
    for group, values in detail.values.items():
        for value in values:
            merged.keep(group, value)
    for rank in sorted(detail.ranks):
        merged.keep("rank", str(rank))
    return merged


def line_excerpt(text: str, at: int) -> str:
    """The visible part of a line around position `at`: after the last carriage return before it, without color codes, trimmed."""
    start = text.rfind("\r", 0, at) + 1
    end = text.find("\r", at)
    visible = text[start:end if end >= 0 else len(text)]
    at -= start
    if len(visible) > EXCERPT_CHARS:
        begin = 0 if at < EXCERPT_CHARS // 2 else max(0, min(at - EXCERPT_CHARS // 4, len(visible) - EXCERPT_CHARS))
        visible = ("..." if begin else "") + visible[begin:begin + EXCERPT_CHARS] + ("..." if begin + EXCERPT_CHARS < len(visible) else "")
    return _ANSI_ESCAPE.sub("", visible).strip()


