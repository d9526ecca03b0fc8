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
from preflight.diagnose.scan import KEPT_VALUES, TIERS, Diagnosis, Excerpt, Scanner, rank_ranges
from preflight.diagnose.timeline import Seen, Timeline, launcher_first_failure, launcher_reports
from preflight.errors import InputError

MAX_FILES = 4096
MAX_ENTRIES = 1 << 17  # files and folders looked at under the folder
LOG_SUFFIXES = {".log", ".out", ".err", ".txt"}
_ATTEMPT = re.compile(r"^attempt_\d+$")
_NAMED_RANK = re.compile(r"(?i:rank|task|proc)[-_.]?(?P<rank>\d+)")
_TRAILING_NUMBER = re.compile(r"^(?P<stem>.*?[-_.])(?P<rank>\d+)$")
# Where a log names its host: NCCL's "host:pid:tid [dev] NCCL", torchrun's failure summary "host : NAME".
_HOST_IN_LINE = re.compile(r"^(?:\[\w+\]:)?(?P<host>[A-Za-z][\w.-]*):\d+:\d+ \[\d+\] NCCL |^\s+host\s+: (?P<summary>\S+)", re.MULTILINE)
# torchrun's failure summary names each failed rank ("rank : 1 (local_rank: 0)"); its root cause is listed last.
_RANK_IN_SUMMARY = re.compile(r"^\s+rank\s+: (?P<rank>\d+) \(local_rank: \d+\)", re.MULTILINE)


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
                     details=details, ranks=tuple(sorted(ranks)), before_job=first.before_job,
                     cut_line=first.cut_line if all(d.cut_line for _, d in found) else 0)


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


def _seen(code: str, log: LogFile, diagnosis: Diagnosis, timeline: Timeline, summary_rank: str) -> Seen:
    """Where a file first showed a code: the rank its lines name (else the file's, else its failure summary's)."""
    rank = rank_ranges(diagnosis.ranks) if diagnosis.ranks else log.rank or summary_rank
    return Seen(code, log.name, diagnosis.first_line, rank, log.host, timeline.at(diagnosis.first_line))


def _first_seen(seen: list[Seen]) -> Seen:
    """The earliest by time; where none has a time, the first file's."""
    timed = [s for s in seen if s.stamp is not None]
    return min(timed, key=lambda s: s.stamp.key if s.stamp else ()) if timed else seen[0]


def _in_time_order(merged: list[Diagnosis], first: dict[str, Seen]) -> tuple[list[Diagnosis], bool]:
    """Root cause first: by tier (a hardware fault explains the errors it causes; a consequence never leads a cause),
    then within a tier the earliest error by time, torch elastic's rule. A tier with an error no time is known for falls
    back to the code seen on the fewest ranks (the rank that failed, not the ones that waited); the flag says so."""
    fallback = False
    keys: dict[str, tuple[object, ...]] = {}
    for tier in TIERS:
        members = [d for d in merged if d.tier == tier]
        timed = all(first[d.code].stamp is not None for d in members)
        fallback = fallback or (len(members) > 1 and not timed)
        for d in members:
            stamp = first[d.code].stamp
            keys[d.code] = (stamp.key,) if timed and stamp else (len(d.ranks) or len(d.details.get("files", ())),)
    return sorted(merged, key=lambda d: (TIERS.index(d.tier), keys[d.code])), fallback


def _with_echoes(ordered: list[Diagnosis], first: dict[str, Seen], root: Seen) -> list[Diagnosis]:
    """Each diagnosis says where it was first seen; each consequence, whose failure it echoes (the root's)."""
    result = []
    for d in ordered:
        details = {**d.details, "first seen": [first[d.code].describe()]}
        if d.tier == "consequence" and d.code != root.code:
            details["echoes"] = [root.echo()]
        result.append(replace(d, details=details))
    return result


def _kernel_seen(kernel: Diagnosis, logs: dict[str, LogFile], timelines: dict[str, Timeline]) -> Seen | None:
    """Where a kernel log's fault that leads the job was first seen: the earliest of its lines by the time each carries
    (the first of them where none carries one), on the host of its file."""
    places = [(e, timelines[e.source].at(e.line)) for e in kernel.excerpts if e.source in timelines]
    if not places:
        return None
    timed = [(e, stamp) for e, stamp in places if stamp is not None]
    excerpt, stamp = min(timed, key=lambda place: place[1].key) if timed else places[0]
    return Seen(kernel.code, excerpt.source, excerpt.line, "", logs[excerpt.source].host, stamp, kernel=True)


def _launcher_root(merged: list[Diagnosis], seen: dict[str, list[Seen]], reports: list[Seen], task_reports: list[Seen]) -> Seen | None:
    """Where nothing, or only consequences, were recognized, the rank that saw another's exit is not the first failure: a launcher's
    report names it (torchrun's root cause, else srun's or mpirun's first failed rank), leaving out every rank that
    showed a consequence (none where one's rank is unknown). A rank's own error line that no signature reads is not
    taken instead: ProcessGroupNCCL's watchdog prints more lines than the timeout's signature reads, so a rank that
    only echoed could be named."""
    consequences = [d for d in merged if d.tier == "consequence"]
    files = {s.rank for d in consequences for s in seen[d.code]}  # a file's rank, or the ranks its lines name (as runs)
    if "" in files:
        return None  # a file whose rank is unknown may be the one a report names
    return launcher_first_failure(reports, task_reports, files | {str(rank) for d in consequences for rank in d.ranks})


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
    seen: dict[str, list[Seen]] = {}
    timelines: dict[str, Timeline] = {}  # each file's, for the times of its kernel lines
    read: dict[str, LogFile] = {}
    lines, notes, described, untimed = 0, [], [], []
    reports: list[Seen] = []  # torchrun's root cause reports, each host's agent's
    task_reports: list[Seen] = []  # srun's and mpirun's reports of failed ranks (a batch script's output)
    first_error: Excerpt | None = None
    for log in logs:
        scanner = Scanner(shared.scanner.table)
        timeline = Timeline()
        shared.progress.start(log.name)
        shared.versions.start(log.name)
        shared.kernel.start(log.name)
        shared.stacks.start(log.name)
        host, summary_rank = log.host, ""
        try:
            for block in log_blocks(str(log.path)):
                start = scanner.lines + 1
                scanner.feed(block)
                found, tasks = launcher_reports(block, start, log.name, log.host)
                reports += found
                task_reports += tasks
                kept = len(shared.kernel.places)
                shared.kernel.feed(block)
                # The times of the first error lines, and of the kernel's lines: an Xid can be the job's first failure.
                timeline.feed(block, start, scanner.first_lines() | {line for _, line in shared.kernel.places[kept:]})
                rank = log.rank if not log.host or not log.rank else f"{log.host}/{log.rank}"
                shared.progress.feed(block, rank)
                shared.stacks.feed(block, rank)
                shared.versions.feed(block)
                if not host and (named := _HOST_IN_LINE.search(block)) is not None:
                    host = named["host"] or named["summary"]
                summary_rank = next((m["rank"] for m in reversed(list(_RANK_IN_SUMMARY.finditer(block)))), summary_rank)
        except InputError as e:  # a binary file or a broken gzip among the logs: skipped, and said so
            notes.append(f"skipped {log.name}: {e}")
            continue
        lines += scanner.lines
        if first_error is None and scanner.first_error is not None:
            first_error = replace(scanner.first_error, source=log.name)
        log = replace(log, host=host)
        timelines[log.name], read[log.name] = timeline, log
        described.append(f"{log.name} (rank {log.rank or '?'}, host {log.host or '?'})")
        diagnoses = scanner.diagnoses()
        if diagnoses and not timeline.stamped:
            untimed.append(log.name)
        for diagnosis in diagnoses:
            per_code.setdefault(diagnosis.code, []).append((log, diagnosis))
            seen.setdefault(diagnosis.code, []).append(_seen(diagnosis.code, log, diagnosis, timeline, summary_rank))
    merged = _after_causes([_merge(code, found) for code, found in per_code.items()], shared.scanner)
    first = {code: _first_seen(found) for code, found in seen.items()}
    merged, fallback = _in_time_order(merged, first)
    if fallback:
        notes.append("the first failure is chosen by tier and by the fewest ranks, not by time: "
                     + (f"{', '.join(untimed[:KEPT_VALUES])} print no times" if untimed else "some errors follow no printed time"))
    # The dumps' diverging collective is an error like the logs' (no hang is added beside it), and leads its tier; a
    # kernel's hardware fault leads all (LogReader.diagnoses). Whichever leads is the root the consequences echo.
    diagnoses = shared.diagnoses(errors=([diverged] if diverged else []) + merged)
    lead = diagnoses[0] if diagnoses else None
    if lead is not None and lead.signatures[0].startswith("kernel-"):
        root = _kernel_seen(lead, read, timelines)
    elif not diagnoses or (merged and lead is merged[0] and lead.tier == "consequence"):
        root = _launcher_root(merged, seen, reports, task_reports)
    else:
        root = first[merged[0].code] if merged and lead is merged[0] else None
    if merged:  # the merged errors, in their places, say where each was first seen and whose failure it echoes
        echoed = {id(d): e for d, e in zip(merged, _with_echoes(merged, first, root or first[merged[0].code]), strict=True)}
        diagnoses = tuple(echoed.get(id(d), d) for d in diagnoses)
    return LogDiagnosis(source=str(folder), lines=lines, diagnoses=diagnoses, named=shared.versions.named(),
                        notes=(*shared.versions.outside_pins(), *shared.denylist_notes(diagnoses), *notes), files=(*dump_files, *described),
                        first_error=first_error, first_failure=root)


def diagnose_path(path: str) -> LogDiagnosis:
    """A log file, stdin (``-``), or a folder (of logs, or of flight recorder dumps)."""
    from preflight.diagnose.log import diagnose_file

    if not path:  # Path("") is the working directory: an empty argument (an unset shell variable) names no log
        raise InputError("diagnose: the path is empty: name a log, a folder of logs, or - for stdin")
    if path != "-" and Path(path).is_dir():
        return diagnose_folder(Path(path))
    return diagnose_file(path)
