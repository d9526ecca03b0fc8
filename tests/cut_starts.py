"""playbooks/cut-starts.yaml, made from the signatures and the message catalogue: which starts of the signatures'
patterns a cut line may be read by, and how much of each it must hold (preflight/diagnose/cut.py).

A start is each pattern's literal beginning (preflight.diagnose.lines.literal_start), for signatures whose code does
not hang on what follows it (no `refine` rules, no `requires` groups). It must be held past the longest piece of it
that any text of another cause holds: every line the catalogue prints for a message its signature does not read
(tests/data/messages, every wording with its sample values behind its prefix), and the other signatures' starts. A start
that such a text holds whole is never read from a cut line.

Usage: ``python3 tests/cut_starts.py`` writes the file; tests/test_diagnose_cut.py fails while it is out of date.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from messages_catalogue import catalogue, holes, printed_lines  # the tests' reader of the catalogue

from preflight.diagnose.cut import FLOOR_CHARS
from preflight.diagnose.lines import literal_start
from preflight.diagnose.scan import parse_signatures

PATH = Path(__file__).resolve().parent.parent / "playbooks" / "cut-starts.yaml"
HOLE = "\ufffe"  # a noncharacter: no value a placeholder prints
HEADER = """\
# Made by tests/cut_starts.py from signatures.yaml and the message catalogue (tests/data/messages): do not edit, run it.
# What a log's last line, cut mid-message, is read by (preflight/diagnose/cut.py): the literal start of a signature's
# pattern; `least`, the fewest of its characters a cut line must hold: one more than any text of another cause holds
# (a message the catalogue records that the signature does not read, or another signature's start), and never fewer
# than cut.py's FLOOR_CHARS; `upto`, how far the start is the source's own text in the messages it reads (past it, a
# placeholder's value, an errno's text, which other values share): a cut must end by then or hold the whole start.
# Starts that a text of another cause holds past `upto`, and signatures whose code hangs on what follows the start
# (refine rules, required groups), are not here.
"""


def _held(start: str, text: str) -> int:
    """The longest beginning of start that text holds anywhere (a beginning held means every shorter one is)."""
    low, high = 0, len(start)
    while low < high:
        middle = (low + high + 1) // 2
        if start[:middle] in text:
            low = middle
        else:
            high = middle - 1
    return low


def _literal_lines(data: dict[str, Any], message: dict[str, Any], wording: dict[str, Any]) -> list[str]:
    """A wording's printed lines with every placeholder of its format holding a character no log prints: the text the
    source itself writes, whatever the values."""
    style = wording.get("style", message.get("style", data["style"]))
    blank = {**wording, "args": [HOLE] * len(holes(wording["format"], style))}
    return printed_lines(data, message, blank)


def cut_starts() -> list[dict[str, object]]:
    """The entries of cut-starts.yaml, in signature order."""
    # signatures.yaml alone: the shipped cut-starts.yaml is what this makes, and may be out of date
    with open(PATH.parent / "signatures.yaml", encoding="utf-8") as f:
        table = parse_signatures(yaml.safe_load(f))
    starts = [(s.id, literal_start(p.pattern)) for s in table.signatures for p in s.patterns]
    printed: list[tuple[set[str], str]] = []  # each recorded line as printed, with the signatures its message names
    literal: list[tuple[set[str], str]] = []  # the same with its placeholders blank
    for data in catalogue().values():
        for message in data["messages"]:
            names = set(message["signatures"] or [])
            for wording in message["wordings"]:
                printed += [(names, line) for line in printed_lines(data, message, wording)]
                literal += [(names, line) for line in _literal_lines(data, message, wording)]
    entries: list[dict[str, object]] = []
    for signature in table.signatures:
        if signature.refine or signature.requires:
            continue
        foreign = [line for names, line in printed if signature.id not in names]
        foreign += [other for name, other in starts if name != signature.id]
        for start in dict.fromkeys(literal_start(p.pattern) for p in signature.patterns):
            if len(start) < FLOOR_CHARS:
                continue
            least = max(FLOOR_CHARS, 1 + max(_held(start, text) for text in foreign))
            # Where the start runs into a placeholder's value (an errno's text), a cut there could be another value:
            # a cut must stop within what the source writes itself, or hold the whole start.
            upto = max((_held(start, text) for names, text in literal if signature.id in names), default=0)
            if least <= upto:
                entries.append({"signature": signature.id, "start": start, "least": least, "upto": upto})
    return entries


def render(entries: list[dict[str, object]]) -> str:
    lines = [yaml.safe_dump(entry, default_flow_style=True, sort_keys=False, width=1 << 16).strip() for entry in entries]
    return HEADER + "starts:\n" + "".join(f"  - {line}\n" for line in lines)


if __name__ == "__main__":
    made = cut_starts()
    PATH.write_text(render(made), encoding="utf-8")
    print(f"{PATH}: {len(made)} starts")
