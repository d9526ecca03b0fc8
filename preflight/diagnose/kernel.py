"""Xid and SXid events in a pasted kernel log (`dmesg`, `journalctl -k`), named with their severity and what to do.

The lines are read by the probe's own reader (xid_events: one event per kind, device and code, SXid detail
lines folded into their headline, R570's multi-line "fallen off the bus") and judged by checks/xid.py's catalogue
(judge_event), so `diagnose` and `preflight check` say the same about the same line. This is the one reading of Xid
lines: the error signatures (playbooks/signatures.yaml) have none, so each line is diagnosed once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import cast

from preflight.checks.xid import ORIGINS, device_of, finding_of, judge_event, origin_of
from preflight.diagnose.scan import KEPT_LINES, Diagnosis, Excerpt
from preflight.facts import XidEvent
from preflight.probe.readings import FALLEN_OFF_XID, INIT_FAILED_LINE, INIT_FAILED_XID, XID_LINE, xid_address, xid_events

KEPT_KERNEL_LINES = 20_000  # a pasted excerpt is small; a whole journal is bounded all the same
# Per finding: the other likely codes (a GPU fallen off the bus is also a GPU missing from the count), and the check
# that finds it before a job.
_ALSO_LIKELY = {"PF401": ("PF402", "PF801"), "PF402": ("PF401", "PF801"), "PF802": ("PF811",)}
_FELL_OFF_ALSO = ("PF201",)
_BEFORE_JOB = {
    "PF802": "PF802, PF811: preflight check cluster=NAME playbook=facts reads each host's SXid history and the GPUs' "
             "fabric state",
    "PF801": "PF801, PF201: preflight check cluster=NAME playbook=facts reads each host's Xid history and counts its GPUs",
    "PF401": "PF401, PF402, PF801: preflight check cluster=NAME playbook=facts reads ECC counts, row remapping and the "
             "Xid history",
}
_BEFORE_JOB["PF402"] = _BEFORE_JOB["PF401"]
_FALLEN = ("fallen off the bus", "", 0)  # where() key of the messages of a GPU fallen off the bus


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
        """One diagnosis per finding the events point to (checks/xid.py's finding_of: PF802 for the NVSwitches' SXids,
        PF401/PF402 for ECC Xids, PF801 for the GPUs' other Xids), each event with its count, severity and action.

        Root cause first, by where each fault starts (checks/xid.py's ORIGINS): an NVSwitch's SXid before the GPUs'
        NVLink Xids it brings about, a GPU's own hardware (firmware, the bus, memory) next, an application-level Xid
        last, since it is what a job sees of any fault beneath it. A finding ranks by its most basic event, and its
        events are listed in the same order. Tier hardware, except a finding of application-level Xids only that none
        says is fatal: the job's own fault is likely, a cause like the error lines'."""
        if not self.lines:
            return ()
        events = cast(list[XidEvent], xid_events(self.lines, None, time.time())[0])  # the probe's dicts are XidEvents
        rank = {id(e): (ORIGINS.index(origin_of(e)), n) for n, e in enumerate(events)}  # xid_events keeps line order
        groups: dict[str, list[XidEvent]] = {}
        where = self._where()
        for event in sorted(events, key=lambda e: rank[id(e)]):
            groups.setdefault(finding_of(event), []).append(event)
        found = []
        for code, mine in groups.items():
            judged = [(event, *judge_event(event)) for event in mine]
            said = [f"{e['kind']} {e['code']} on {device_of(e)} ({e['count']}x): {_severity(fatal, meaning)}, {meaning}; {action}"
                    for e, fatal, meaning, action in judged]
            first_line, excerpts = self._excerpts(mine, where)
            application = all(origin_of(e) == "application" for e in mine) and not any(j[1] for j in judged)
            also = _ALSO_LIKELY.get(code, ()) + (_FELL_OFF_ALSO if any(_fell_off(e) for e in mine) else ())
            diagnosis = Diagnosis(code=code, codes=(code, *also), tier="cause" if application else "hardware",
                                  signatures=("kernel-sxid" if code == "PF802" else "kernel-xid",),
                                  first_line=first_line,
                                  matches=sum(e["count"] for e in mine), excerpts=tuple(excerpts),
                                  details={"event": said}, ranks=(), before_job=_BEFORE_JOB[code])
            found.append((rank[id(mine[0])], diagnosis))
        return tuple(d for _, d in sorted(found, key=lambda item: item[0]))

    def _excerpts(self, events: list[XidEvent], where: dict[tuple[str, str, int], list[int]]) -> tuple[int, list[Excerpt]]:
        """The number of the events' first line, and their lines in the events' order: each event's first line, then
        their further lines, KEPT_LINES in all."""
        per_event = [where.get((e["kind"], e["pci"], e["code"]), []) + (where.get(_FALLEN, []) if _fell_off(e) else [])
                     for e in events]
        ordered = [lines[0] for lines in per_event if lines] + [n for lines in per_event for n in lines[1:]]
        first = min(ordered, default=0)
        return self.places[first][1], [Excerpt(line=self.places[i][1], text=self.lines[i].strip()[:240], source=self.places[i][0])
                                       for i in list(dict.fromkeys(ordered))[:KEPT_LINES]]

    def _where(self) -> dict[tuple[str, str, int], list[int]]:
        """Each event's kept lines (their indices), by kind, device and code, read once: an Xid or SXid line is its own
        event's, a "fallen off the bus" line (R570 prints no Xid) belongs to _FALLEN."""
        where: dict[tuple[str, str, int], list[int]] = {}
        for index, text in enumerate(self.lines):
            match = XID_LINE.search(text)
            init = INIT_FAILED_LINE.search(text)
            if match is not None:
                where.setdefault((match.group(1), xid_address(match), int(match.group(3))), []).append(index)
            elif init is not None:
                pci = f"{(init.group(1) or '0000').lower()}:{init.group(2).lower()}"
                where.setdefault(("Xid", pci, INIT_FAILED_XID), []).append(index)
            elif "fallen off the bus" in text:
                where.setdefault(_FALLEN, []).append(index)
        return where


def _fell_off(event: XidEvent) -> bool:
    return event["kind"] == "Xid" and event["code"] == FALLEN_OFF_XID


def _severity(fatal: bool, meaning: str) -> str:
    """fatal, not fatal, or (an SXid none of whose lines says its severity, of a code NVIDIA's catalogue lacks) unknown."""
    if fatal:
        return "fatal"
    return "severity unknown" if meaning.endswith("its severity not in the log: unknown") else "not fatal"
