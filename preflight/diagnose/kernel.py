"""Xid and SXid events in a pasted kernel log (`dmesg`, `journalctl -k`), named with their severity and what to do.

The lines are read by the probe's own reader (probe.xid_events: one event per kind, device and code, SXid detail
lines folded into their headline, R570's multi-line "fallen off the bus") and judged by checks/xid.py's catalogue
(judge_event), so `diagnose` and `preflight check` say the same about the same line.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from preflight import probe
from preflight.checks.xid import judge_event
from preflight.diagnose.scan import KEPT_LINES, Diagnosis, Excerpt
from preflight.facts import XidEvent

KEPT_KERNEL_LINES = 20_000  # a pasted excerpt is small; a whole journal is bounded all the same
_CODES = {"Xid": "PF801", "SXid": "PF802"}
_XID_LINE = {"Xid": "Xid (", "SXid": "SXid ("}


@dataclass
class KernelReader:
    """Collects the kernel log lines of a log (those naming NVRM or an Xid) with their numbers, in one pass."""

    lines: list[str] = field(default_factory=list)
    places: list[tuple[str, int]] = field(default_factory=list)  # each kept line's file (a folder's) and number
    source: str = ""
    seen: int = 0

    def start(self, source: str) -> None:
        """The lines fed from now on are the file source's (one of a folder's logs), numbered from 1."""
        self.source, self.seen = source, 0

    def feed(self, block: str) -> None:
        for offset, line in enumerate(block.splitlines()):
            if ("Xid" in line or "NVRM" in line) and len(self.lines) < KEPT_KERNEL_LINES:
                self.lines.append(line)
                self.places.append((self.source, self.seen + offset + 1))
        self.seen += block.count("\n")

    def diagnoses(self) -> tuple[Diagnosis, ...]:
        """One diagnosis per code (PF801 for the GPUs' Xids, PF802 for the NVSwitches' SXids): every event with its
        count, severity and action; tier hardware when any is fatal."""
        if not self.lines:
            return ()
        events, _ = probe.xid_events(self.lines, None, time.time())
        found = []
        for kind, code in _CODES.items():
            mine: list[XidEvent] = [e for e in events if e["kind"] == kind]  # type: ignore[misc]
            if not mine:
                continue
            judged = [(event, *judge_event(event)) for event in mine]
            said = [f"{kind} {e['code']} on {e['pci']} ({e['count']}x): {'fatal' if fatal else 'not fatal'}, {meaning}; "
                    f"{action}" for e, fatal, meaning, action in judged]
            excerpts = [Excerpt(line=n, text=text.strip()[:240], source=source)
                        for (source, n), text in zip(self.places, self.lines, strict=True)
                        if (_XID_LINE[kind] in text and not (kind == "Xid" and "SXid (" in text))
                        or (kind == "Xid" and "fallen off the bus" in text)][:KEPT_LINES]
            first = excerpts[0].line if excerpts else self.places[0][1]
            found.append(Diagnosis(code=code, codes=(code,), tier="hardware" if any(j[1] for j in judged) else "cause",
                                   signatures=(f"kernel-{kind.lower()}",), first_line=first,
                                   matches=sum(e["count"] for e in mine), excerpts=tuple(excerpts),
                                   details={"event": said}, ranks=()))
        return tuple(found)
