"""One diagnosis of a log, a folder of logs or a folder of flight recorder dumps: what the terminal and --json show."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from preflight.diagnose.kernel import KernelReader
from preflight.diagnose.progress import ProgressTracker
from preflight.diagnose.reading import log_blocks
from preflight.diagnose.scan import KEPT_VALUES, TIERS, Diagnosis, Excerpt, Scanner, SignatureTable, rank_ranges
from preflight.diagnose.stacks import StackReader
from preflight.diagnose.timeline import Seen, Timeline, launcher_first_failure, launcher_reports
from preflight.diagnose.versions import VersionReader
from preflight.errors import ExitCode

ENDED_FROM_OUTSIDE = "PF726"  # the job ended by a signal or the scheduler (signatures.yaml's job-ended-from-outside)


@dataclass(frozen=True)
class LogDiagnosis:
    """Everything diagnose found in one log, or in one job's folder of them."""

    source: str
    lines: int
    diagnoses: tuple[Diagnosis, ...]
    named: dict[str, list[str]] = field(default_factory=dict)  # versions and settings the log names
    notes: tuple[str, ...] = ()  # worth knowing, not failures: versions outside the shipped pins, files skipped
    files: tuple[str, ...] = ()  # a folder's logs, each with the rank and host it was read as
    first_error: Excerpt | None = None  # the first error-looking line, shown when no signature recognized the failure
    first_failure: Seen | None = None  # a folder's: where and when the root cause was first seen (rank, host, time)

    @property
    def exit_code(self) -> int:
        """FAILED (1) when a known failure was recognized, else PASSED (0)."""
        return ExitCode.FAILED if self.diagnoses else ExitCode.PASSED

    def to_json(self) -> dict[str, Any]:  # diagnose's --json output, read by no other stage
        """The document `preflight diagnose --json` prints."""
        return {"source": self.source, "lines": self.lines, "status": "recognized" if self.diagnoses else "none",
                "exit_code": self.exit_code, "diagnoses": [d.to_json() for d in self.diagnoses],
                "named": dict(self.named), "notes": list(self.notes), "files": list(self.files),
                "first_error": _excerpt_json(self.first_error) if self.first_error and not self.diagnoses else None,
                "first_failure": self.first_failure.to_json() if self.first_failure else None}

    def render(self) -> str:
        """The terminal form: one block per diagnosis, root cause first, then what the log named."""
        counts = ([f"{len(self.files)} files"] if self.files else []) + ([f"{self.lines} lines"] if self.lines or not self.files else [])
        size = ", ".join(counts)
        if not self.diagnoses:
            out = [f"preflight diagnose: {self.source} ({size}): no known failure signature found"]
            if self.first_error is not None:
                where = ":".join(part for part in (self.first_error.source, str(self.first_error.line)) if part)
                out.append(f"the first error-looking line was: {where}: {self.first_error.text}")
            if self.first_failure is not None:
                out.append(f"first failure: {self.first_failure.describe()}")
        else:
            count = len(self.diagnoses)
            out = [f"preflight diagnose: {self.source} ({size}): {count} known failure{'s' if count > 1 else ''}, root cause first"]
            if self.first_failure is not None:
                out.append(f"first failure: {self.first_failure.describe()}")
        for number, d in enumerate(self.diagnoses, 1):
            item = d.to_json()
            where = f"line {d.first_line}" + (f", {d.matches} matching lines" if d.matches > 1 else "") if d.first_line else ""
            out += ["", f"{number}. {d.code}  {item['title']}  ({where + '; ' if where else ''}{d.tier}; {', '.join(d.signatures)})"]
            for e in d.excerpts:
                at = ":".join(part for part in (e.source, str(e.line or "")) if part)
                out.append(f"   {at}: {e.text}" if at else f"   {e.text}")
            if d.cut_line:
                out.append(f"   line {d.cut_line} stops mid-message (a paste cut off?): read by its start, which names this failure alone")
            shown = {k: v for k, v in d.details.items() if k != "echoes"}  # the echo has its own line
            captured = ([f"ranks {rank_ranges(d.ranks)}"] if d.ranks else []) + [f"{k} {_values(v)}" for k, v in shown.items()]
            if captured:
                out.append(f"   seen: {'; '.join(captured)}")
            if d.details.get("echoes"):
                out.append(f"   echoes {d.details['echoes'][0]}")
            out.append(f"   cause: {item['cause']}")
            out.append(f"   fix: {item['fix']}")
            if item["workaround"]:
                out.append(f"   workaround: {item['workaround']}")
            if d.before_job:
                out.append(f"   before the job: {d.before_job}")
            if item["also_likely"]:
                also = "; ".join(f"{a['code']} {a['title']}" for a in item["also_likely"])
                out.append(f"   also likely: {also}")
        if self.named:
            out += ["", "named in the log: " + "; ".join(f"{k} {_values(v)}" for k, v in self.named.items())]
        out += [f"note: {note}" for note in self.notes]
        return "\n".join(out)


def _excerpt_json(excerpt: Excerpt) -> dict[str, int | str]:
    return {"line": excerpt.line, "text": excerpt.text, **({"source": excerpt.source} if excerpt.source else {})}


def _values(values: list[str]) -> str:
    return ", ".join(values) + (" (and more)" if len(values) >= KEPT_VALUES else "")


@dataclass
class LogReader:
    """Everything read from a log in one pass: error signatures, progress (for hangs), versions and settings."""

    scanner: Scanner
    progress: ProgressTracker = field(default_factory=ProgressTracker)
    versions: VersionReader = field(default_factory=VersionReader)
    kernel: KernelReader = field(default_factory=KernelReader)  # Xid/SXid lines of a pasted kernel log
    stacks: StackReader = field(default_factory=StackReader)  # py-spy's and faulthandler's stack dumps
    timeline: Timeline = field(default_factory=Timeline)  # the times of the signatures' first lines
    reports: list[Seen] = field(default_factory=list)  # torchrun's root cause reports
    task_reports: list[Seen] = field(default_factory=list)  # srun's and mpirun's reports of failed ranks, in the order printed

    def feed(self, block: str, rank: str = "") -> None:
        start = self.scanner.lines + 1
        self.scanner.feed(block)
        reports, tasks = launcher_reports(block, start, "")
        self.reports += reports
        self.task_reports += tasks
        self.timeline.feed(block, start, self.scanner.first_lines())
        self.kernel.feed(block)
        self.progress.feed(block, rank)
        self.stacks.feed(block, rank)
        self.versions.feed(block)

    def diagnoses(self, errors: Iterable[Diagnosis] | None = None) -> tuple[Diagnosis, ...]:
        """The error signatures' diagnoses (or errors, a folder's merged ones), a denylisted version, and a hang when no
        error line explains the stop; root cause first."""
        found = list(self.scanner.diagnoses() if errors is None else errors) + list(self.kernel.diagnoses())
        denied = self.versions.denylisted()
        hang = None if found else self.progress.hang(explained=denied is not None)
        # Ranks a stack dump shows waiting in a collective: a hang, also where the job was then ended from outside (a
        # hung job is what people kill, and what runs into its time limit): the hang is what stopped it first.
        stuck = None if self.progress.finished else self.stacks.diagnosis()  # a job that says it finished did not hang
        ended = bool(found) and all(d.code == ENDED_FROM_OUTSIDE for d in found)
        if stuck is not None and (not found or ended):
            hang = _joined(hang, stuck) if hang else stuck
        if not found and hang is None:
            denied = None  # a version known to break others, in a log that shows no failure: a note (denylist_notes)
        # A denylisted version follows the errors of its tier: an error line that names a cause explains this failure
        # better than a version known to break others; with none (a hang), the version leads.
        ordered = found + ([denied] if denied else []) + ([hang] if hang else [])
        ordered = sorted(ordered, key=lambda d: TIERS.index(d.tier))  # stable: each reader's own order stays
        if ended and hang is not None:
            ordered = [hang, *(d for d in ordered if d is not hang)]
        return tuple(ordered)

    def denylist_notes(self, diagnoses: tuple[Diagnosis, ...]) -> list[str]:
        """A denylisted version the diagnoses leave out (the log shows no failure), as a note."""
        denied = self.versions.denylisted()
        if denied is None or any(d.code == denied.code for d in diagnoses):
            return []
        named = "; ".join(v for values in denied.details.values() for v in values)
        return [f"the log names a denylisted version, though it shows no failure: {named} ({denied.before_job})"]

    def first_failure(self, diagnoses: tuple[Diagnosis, ...], source: str) -> Seen | None:
        """In one merged log with rank prefixes (a collector's, torchrun --tee's, srun --label's): the rank, host and time
        of the root cause's first line. Its lines are in the order they were printed, so the root leads its tier by line.
        A root no prefix or pid places, and a root that is a consequence, is a launcher's report's to name."""
        root = diagnoses[0] if diagnoses else None  # none: no signature knows the error, the launcher's report still may
        if root is not None and root.tier != "consequence":
            if root.first_rank:
                return Seen(root.code, source, root.first_line, root.first_rank, (root.details.get("host") or [""])[0],
                            self.timeline.at(root.first_line))
            # torchrun's own lines name a process, not a rank: its root cause report names both
            report = next((r for r in self.reports if r.pid and r.pid in root.details.get("pid", ())), None)
            if report is not None:
                return Seen(root.code, source, root.first_line, report.rank, report.host,
                            self.timeline.at(root.first_line) or report.stamp)
        # The rank that saw another's exit is not the first failure, and a cause no prefix names (the C++ runtime's
        # "what():" of an abort) is not placed by guess: a launcher's report of the first failed rank names it, where
        # every consequence's rank is known (a rank no prefix names may be the one the report names).
        consequences = [d for d in diagnoses if d.tier == "consequence"]
        if not all(d.ranks for d in consequences):
            return None
        found = launcher_first_failure(self.reports, self.task_reports, {str(rank) for d in consequences for rank in d.ranks})
        return replace(found, file=source, unread=root is None or root.tier == "consequence") if found else None

    def result(self, source: str, lines: int) -> LogDiagnosis:
        diagnoses = self.diagnoses()
        root = self.first_failure(diagnoses, source)
        if root is not None:  # each consequence says whose failure it echoes
            diagnoses = tuple(replace(d, details={**d.details, "echoes": [root.echo()]})
                              if d.tier == "consequence" and d.code != root.code else d for d in diagnoses)
        return LogDiagnosis(source=source, lines=lines, diagnoses=diagnoses, named=self.versions.named(),
                            notes=(*self.versions.outside_pins(), *self.denylist_notes(diagnoses)), first_error=self.scanner.first_error,
                            first_failure=root)


def _joined(hang: Diagnosis, stuck: Diagnosis) -> Diagnosis:
    """The hang the progress lines show, with what the stack dumps add: who waits where, and who is elsewhere."""
    return replace(hang, signatures=(*hang.signatures, *stuck.signatures), details={**hang.details, **stuck.details},
                   excerpts=tuple(sorted({*hang.excerpts, *stuck.excerpts}, key=lambda e: (e.source, e.line)))[-3:])


def diagnose_text(text: str, table: SignatureTable | None = None) -> tuple[Diagnosis, ...]:
    """The diagnoses of a log held in memory, root cause first."""
    reader = LogReader(Scanner(table))
    reader.feed(text)
    return reader.diagnoses()


def diagnose_file(path: str) -> LogDiagnosis:
    """Read the log at path (``-`` for stdin) in blocks and diagnose it."""
    reader = LogReader(Scanner())
    for block in log_blocks(path):
        reader.feed(block)
    scanner = reader.scanner
    lines = scanner.lines + (1 if scanner.ends_midline else 0)
    return reader.result("stdin" if path == "-" else path, lines)
