"""The message catalogue in tests/data/messages: each source's messages per version, and a wording printed as its
library prints it (README there)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import yaml

MESSAGES = Path(__file__).resolve().parent / "data" / "messages"
# printf's conversions (C, CUDA, NCCL, the driver) and Python's %-format; {} and {name} of fmt, c10::str and
# str.format (torch, gloo).
PRINTF = re.compile(r"%(?P<flags>[-+ #0]*)(?P<width>\d+|\*)?(?:\.(?P<prec>\d+|\*))?(?:hh|h|ll|l|z|j|t|L|q)?(?P<conv>[diouxXeEfgGcspn%])")
BRACE = re.compile(r"\{\{|\}\}|\{[^{}]*\}")
TEMPLATE = re.compile(r"\$\$|\$\{\w+\}|\$\w+")  # string.Template's ${name} (torch elastic's failure report)
# What a placeholder holds when the entry gives no sample: a number, a hex number, a word.
DEFAULTS = {"d": "3", "i": "3", "u": "3", "o": "7", "x": "1a", "X": "1A", "e": "1.5e+00", "E": "1.5E+00", "f": "1.500000",
            "g": "1.5", "G": "1.5", "c": "c", "s": "x", "p": "0x7f3a2c000000", "n": "", "{}": "x"}
STYLES = ("printf", "brace", "template")
LEVELS_WITHOUT_PREFIX = ("error-string", "exception", "log", "print", "kernel")


@cache
def catalogue() -> dict[str, dict[str, Any]]:
    """Every catalogue file by name."""
    files = {}
    for path in sorted(MESSAGES.glob("*.yaml")):
        with open(path, encoding="utf-8") as f:
            files[path.stem] = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return files


def expand(tags: list[str], checked: list[str]) -> list[str]:
    """The checked tags a wording's tags name: each entry a tag, or A..B for every checked tag from A to B."""
    found = []
    for entry in tags:
        first, _, last = entry.partition("..")
        start, end = checked.index(first), checked.index(last or first)
        assert start <= end, entry
        found += checked[start:end + 1]
    return found


def holes(fmt: str, style: str) -> list[re.Match[str]]:
    """The placeholders of a format string, in order (an escaped % or brace is none)."""
    pattern = {"printf": PRINTF, "brace": BRACE, "template": TEMPLATE}[style]
    return [m for m in pattern.finditer(fmt) if m.group(0) not in ("%%", "{{", "}}", "$$")]


def fill(fmt: str, style: str, args: list[str] | None) -> str:
    """The format string printed with args in its placeholders, in order; the defaults where args run out."""
    values = [str(a) for a in args or []]
    out, at = [], 0
    for hole in holes(fmt, style):
        out.append(fmt[at:hole.start()])
        out.append(values.pop(0) if values else DEFAULTS[hole.group("conv") if style == "printf" else "{}"])
        at = hole.end()
    out.append(fmt[at:])
    text = "".join(out)
    escapes = {"printf": (("%%", "%"),), "brace": (("{{", "{"), ("}}", "}")), "template": (("$$", "$"),)}[style]
    for escaped, plain in escapes:
        text = text.replace(escaped, plain)
    return text


def printed_lines(data: dict[str, Any], message: dict[str, Any], wording: dict[str, Any]) -> list[str]:
    """A wording's lines as printed: its format filled in, behind each prefix its library used in the wording's tags."""
    level = wording.get("level", message.get("level"))
    style = wording.get("style", message.get("style", data["style"]))
    args = wording.get("args", message.get("args"))
    text = fill(wording["format"], style, args)
    prefixes = [fill(p["format"], "printf", p.get("args")) for p in data.get("line_formats", {}).get(level, [])
                if set(expand(p["tags"], data["tags_checked"])) & set(expand(wording["tags"], data["tags_checked"]))]
    return [prefix + text for prefix in prefixes] or [text]


def all_printed_lines() -> list[str]:
    """Every wording of every message, printed: the lines the sources print."""
    return [line for data in catalogue().values() for message in data["messages"] for wording in message["wordings"]
            for line in printed_lines(data, message, wording)]
