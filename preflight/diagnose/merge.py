"""A folder of one job's logs, diagnosed as one job: Slurm's per-task output files, torchrun's --log-dir
(RUN_ID/attempt_N/LOCAL_RANK/stdout.log and stderr.log), or per-host folders of either. Each file is read as one rank on
one host; the error signatures are merged by code (with the files, ranks and hosts that showed them), and progress and
versions are read across all files, so that one rank that fell silent among others that went on is seen as a hang.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, replace
from pathlib import Path

from preflight.diagnose.flight_recorder import analyse, find_dumps
from preflight.diagnose.log import LogDiagnosis, LogReader
from preflight.diagnose.reading import log_blocks
from preflight.diagnose.scan import KEPT_VALUES, TIERS, Diagnosis, Excerpt, Scanner
from preflight.errors import InputError

MAX_FILES = 4096
MAX_ENTRIES = 1 << 17  # files and folders looked at under the folder
LOG_SUFFIXES = {".log", ".out", ".err", ".txt"}
_ATTEMPT = re.compile(r"^attempt_\d+$")
_NAMED_RANK = re.compile(r"(?i:rank|task|proc)[-_.]?(?P<rank>\d+)")
_TRAILING_NUMBER = re.compile(r"^(?P<stem>.*?[-_.])(?P<rank>\d+)$")
# Where a log names its host: NCCL's "host:pid:tid [dev] NCCL", torchrun's failure summary "host : NAME".
_HOST_IN_LINE = re.compile(r"^(?:\[\w+\]:)?(?P<host>[A-Za-z][\w.-]*):\d+:\d+ \[\d+\] NCCL |^\s+host\s+: (?P<summary>\S+)", re.MULTILINE)


@dataclass(frozen=True)
class LogFile:
    """One log of the job: its path (shown relative to the folder), the rank and host it is read as ('' unknown)."""

    path: Path
    name: str
    rank: str
    host: str


def find_logs(folder: Path) -> list[LogFile]:
    """The folder's logs, each with a rank and a host where its path says them."""
    entries = itertools.islice(folder.rglob("*"), MAX_ENTRIES)  # a folder given by mistake (/) ends the walk, not the machine
    paths = sorted(p for p in entries if p.suffix in LOG_SUFFIXES and p.is_file())[:MAX_FILES]
    # Slurm's --output=job-%j-%t.out: names that differ only in a trailing number are ranks.
    trailing = [_TRAILING_NUMBER.match(p.stem) for p in paths]
    numbered = len(paths) > 1 and all(trailing) and len({m["stem"] for m in trailing if m}) == 1
    logs = []
    for path, match in zip(paths, trailing, strict=True):
        parts = path.relative_to(folder).parts
        rank, host = "", ""
        attempt = next((i for i, part in enumerate(parts) if _ATTEMPT.match(part)), None)
        if attempt is not None and attempt + 1 < len(parts) - 1 and parts[attempt + 1].isdigit():
            rank = parts[attempt + 1]  # torchrun's local rank
            host = parts[0] if attempt >= 2 else ""  # HOST/RUN_ID/attempt_N/...
        elif (named := _NAMED_RANK.search(path.stem)) is not None:
            rank = named["rank"]
            host = parts[0] if len(parts) > 1 else ""
        elif numbered and match is not None:
            rank = match["rank"]
            host = parts[0] if len(parts) > 1 else ""
        elif len(parts) > 1:
            host = parts[0]
        logs.append(LogFile(path, "/".join(parts), str(int(rank)) if rank else "", host))
    return logs


def _merge(code: str, found: list[tuple[LogFile, Diagnosis]]) -> Diagnosis:
    """One code's diagnoses from several files as one: the most basic tier, every file's ranks and hosts."""
    first = min(found, key=lambda item: TIERS.index(item[1].tier))[1]
    ranks = {r for _, d in found for r in d.ranks} | {int(f.rank) for f, d in found if not d.ranks and f.rank}
    details: dict[str, list[str]] = {}
    for _, d in found:
        for group, values in d.details.items():
            kept = details.setdefault(group, [])
            kept += [v for v in values if v not in kept][: max(0, KEPT_VALUES - len(kept))]
    hosts = sorted({f.host for f, _ in found if f.host})
    if hosts:
        details["hosts"] = hosts[:KEPT_VALUES]
    details["files"] = [f.name for f, _ in found][:KEPT_VALUES]
    excerpts = [replace(e, source=f.name) for f, d in found for e in d.excerpts][:3]
    signatures = tuple(dict.fromkeys(s for _, d in found for s in d.signatures))
    return Diagnosis(code=code, codes=first.codes, tier=first.tier, signatures=signatures,
                     first_line=first.first_line, matches=sum(d.matches for _, d in found), excerpts=tuple(excerpts),
                     details=details, ranks=tuple(sorted(ranks)), before_job=first.before_job)


def _after_causes(merged: list[Diagnosis], scanner: Scanner) -> list[Diagnosis]:
    """A folder's files have no order between them: a signal or a cancellation (only after_error signatures) where the
    job shows another cause takes its after_error tier, as it does after an earlier failure within one log."""
    after = {s.id: s.after_error for s in scanner.table.signatures if s.after_error}
    signalled = [d for d in merged if d.signatures and set(d.signatures) <= set(after)]
    causes = {d.code for d in merged if TIERS.index(d.tier) <= TIERS.index("cause") and d not in signalled}
    demoted = {}
    for d in signalled:
        tier = max((after[s] for s in d.signatures), key=TIERS.index)
        if causes - {d.code} and TIERS.index(tier) > TIERS.index(d.tier):
            demoted[d.code] = replace(d, tier=tier)
    return [demoted.get(d.code, d) for d in merged]


def diagnose_folder(folder: Path) -> LogDiagnosis:
    """One job's folder: its logs merged into one diagnosis, with its flight recorder dumps' diverging collective."""
    dumps = find_dumps(folder)
    diverged = analyse(folder) if dumps else None
    dump_files = tuple(f"{d.path.relative_to(folder)} (flight recorder dump, rank {d.rank}, host {d.host or '?'})" for d in dumps)
    logs = find_logs(folder)
    if not logs and not dumps:
        raise InputError(f"diagnose: {folder} holds no logs ({', '.join(sorted(LOG_SUFFIXES))}) and no flight recorder dumps")
    if not logs:
        return LogDiagnosis(source=str(folder), lines=0, diagnoses=(diverged,) if diverged else (), files=dump_files)
    shared = LogReader(Scanner())  # progress and versions across the job; each file's signatures on their own
    per_code: dict[str, list[tuple[LogFile, Diagnosis]]] = {}
    lines, notes, described = 0, [], []
    first_error: Excerpt | None = None
    for log in logs:
        scanner = Scanner(shared.scanner.table)
        shared.progress.start(log.name)
        shared.versions.start(log.name)
        shared.kernel.start(log.name)
        host = log.host
        try:
            for block in log_blocks(str(log.path)):
                scanner.feed(block)
                shared.progress.feed(block, log.rank if not log.host or not log.rank else f"{log.host}/{log.rank}")
                shared.versions.feed(block)
                shared.kernel.feed(block)
                if not host and (named := _HOST_IN_LINE.search(block)) is not None:
                    host = named["host"] or named["summary"]
        except InputError as e:  # a binary file or a broken gzip among the logs: skipped, and said so
            notes.append(f"skipped {log.name}: {e}")
            continue
        lines += scanner.lines
        if first_error is None and scanner.first_error is not None:
            first_error = replace(scanner.first_error, source=log.name)
        log = replace(log, host=host)
        described.append(f"{log.name} (rank {log.rank or '?'}, host {log.host or '?'})")
        for diagnosis in scanner.diagnoses():
            per_code.setdefault(diagnosis.code, []).append((log, diagnosis))
    merged = _after_causes([_merge(code, found) for code, found in per_code.items()], shared.scanner)
    # Root cause first: by tier, then the code seen on the fewest ranks (the rank that failed, not the ones that waited).
    merged.sort(key=lambda d: (TIERS.index(d.tier), len(d.ranks) or len(d.details.get("files", ()))))
    # The dumps' diverging collective is an error like the logs' (no hang is added beside it), and leads its tier.
    diagnoses = shared.diagnoses(errors=([diverged] if diverged else []) + merged)
    return LogDiagnosis(source=str(folder), lines=lines, diagnoses=diagnoses, named=shared.versions.named(),
                        notes=(*shared.versions.outside_pins(), *shared.denylist_notes(diagnoses), *notes), files=(*dump_files, *described),
                        first_error=first_error)


def diagnose_path(path: str) -> LogDiagnosis:
    """A log file, stdin (``-``), or a folder (of logs, or of flight recorder dumps)."""
    from preflight.diagnose.log import diagnose_file

    if path != "-" and Path(path).is_dir():
        return diagnose_folder(Path(path))
    return diagnose_file(path)
