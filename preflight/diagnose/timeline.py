"""When each error of a folder's logs was printed, from the times the lines carry, so that the first failure across ranks
is the earliest error, as torch elastic picks its "Root Cause (first observed failure)" by the error's timestamp.

Read: torch's glog prefix ("[I1127 03:33:57.981000 ..." or "E1127 03:33:57.324000 ..."; its C++ logging's own prints
January 17 as "[E117 08:28:16.358824199 ..."), vLLM's logger's ("ERROR 01-17 08:28:16 worker.py:..."), NCCL's and Python
logging's dates ("[2026-11-27 03:33:57]", "2026-11-27 03:33:57,068"), elastic's failure summary ("time :
2026-11-27_03:34:06"), ISO times, the kernel's lines as syslog, journalctl and dmesg -T print them ("Nov 27 03:33:57",
"[Fri Nov 27 03:33:57 2026]") and rich's logging handler's ("[11/27/26 03:33:57]"). glog's prefix has no year, so times
are compared by month, day and time of day: one job's logs do not span years. A line without a time of its own takes the
last time printed before it in its file (a traceback's error line follows the lines that led to it): such a time says
"after", not "at".
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

# glog's month and day (MMDD, zero-padded) or torch's c10 logging's month * 100 + day (MDD up to September), as groups.
GLOG_MONTH_DAY = r"(?P<{month}>1[0-2]|0?[1-9])(?P<{day}>[0-3]\d)"

# Near a line's start only: after a rank prefix ("[rank0]:"), a host or a level, never in a message's text. The glog-style
# date is glog's MMDD or torch's own: c10/util/Logging.cpp prints ``(tm_mon + 1) * 100 + tm_mday``, a number, so January
# 17 is "[E117 08:28:16.358824199 socket.cpp:...]" (GLOG_MONTH_DAY; twelve train-split corpus logs print it).
# Ray's prefix on a worker's or actor's line comes before those characters: "(pid=45601) task", "(MyActor pid=480956) ...",
# with ", ip=..." for another node's (Ray's logging docs), as "(RayWorkerWrapper pid=4242, ip=10.0.0.12)" under vLLM.
_RAY_PREFIX = r"(?:\((?:\w+ )?pid=\d+(?:, ip=[^\s()]+)?\) )?"
_TIME = re.compile(
    r"^" + _RAY_PREFIX + r"[^\n]{0,40}?(?:"
    r"(?<![\w.])[IWEF]" + GLOG_MONTH_DAY.format(month="g_month", day="g_day") + r" (?P<g_time>\d\d:\d\d:\d\d)(?:\.(?P<g_frac>\d+))?"
    r"|(?<![\w.])(?P<year>(?:19|20)\d\d)-(?P<month>[01]\d)-(?P<day>[0-3]\d)[ T_](?P<time>\d\d:\d\d:\d\d)(?:[.,](?P<frac>\d+))?"
    # vLLM's logger: "%(levelname)s %(asctime)s" with the date format "%m-%d %H:%M:%S" (vllm/logger.py), no year.
    r"|(?<![\w.])(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<v_month>[01]\d)-(?P<v_day>[0-3]\d) (?P<v_time>\d\d:\d\d:\d\d)(?![\d.:])"
    # The month by name: syslog's and journalctl's short format ("Nov 28 21:38:37 gpu07 kernel: ...", RFC 3164's day
    # padded with a space, journald's with a zero) and dmesg -T's ctime ("[Sat Nov 28 21:38:37 2026]", util-linux).
    r"|(?<![\w.])(?:(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) )?(?P<n_month>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) {1,2}"
    r"(?P<n_day>[0-3]?\d) (?P<n_time>\d\d:\d\d:\d\d)(?:\.(?P<n_frac>\d+))?(?: (?P<n_year>(?:19|20)\d\d)\])?"
    # rich's RichHandler, its default log_time_format "[%x %X]" in the C locale ("[11/28/26 21:38:37]"; ColossalAI's).
    r"|\[(?P<r_month>[01]\d)/(?P<r_day>[0-3]\d)/(?P<r_year>\d\d) (?P<r_time>\d\d:\d\d:\d\d)\])",
    re.MULTILINE)
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # February's 29th in any year: most formats print none
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
# Every time above holds a clock (HH:MM:SS), so a stretch of text without this holds no time: the regex engine finds it by
# its leading literal thirty times faster than _TIME is tried at every line (a log without times, NCCL's INFO lines).
_CLOCK_HINT = re.compile(r":\d\d:")
_LAST_WINDOW = 4096  # characters at a block's end searched first for its last time


@dataclass(frozen=True)
class Stamp:
    """A line's time: month, day, time of day, and whether the line printed it (exact) or follows it."""

    month: int
    day: int
    time: str  # HH:MM:SS
    fraction: float  # of the second
    year: str = ""  # "" where the format has none (glog)
    exact: bool = True

    @property
    def key(self) -> tuple[int, int, str, float]:
        return self.month, self.day, self.time, self.fraction

    def shown(self) -> str:
        """'at 03:33:57', or 'after 03:33:57' for a line that printed no time of its own."""
        return f"{'at' if self.exact else 'after'} {self.time}"

    def to_json(self) -> str:
        date = f"{self.year}-{self.month:02d}-{self.day:02d}" if self.year else f"{self.month:02d}-{self.day:02d}"
        return f"{date} {self.time}" + (f".{round(self.fraction * 1e6):06d}" if self.fraction else "")


def _stamp(match: re.Match[str]) -> Stamp | None:
    if match["g_month"]:
        month, day, clock, frac, year = int(match["g_month"]), int(match["g_day"]), match["g_time"], match["g_frac"], ""
    elif match["v_month"]:
        month, day, clock, frac, year = int(match["v_month"]), int(match["v_day"]), match["v_time"], None, ""
    elif match["n_month"]:
        month, day, clock = _MONTHS.index(match["n_month"]) + 1, int(match["n_day"]), match["n_time"]
        frac, year = match["n_frac"], match["n_year"] or ""
    elif match["r_month"]:
        month, day, clock, frac, year = int(match["r_month"]), int(match["r_day"]), match["r_time"], None, f"20{match['r_year']}"
    else:
        month, day, clock, frac, year = int(match["month"]), int(match["day"]), match["time"], match["frac"], match["year"]
    if not (1 <= month <= 12 and 1 <= day <= _MONTH_DAYS[month - 1]) or clock > "23:59:60":
        return None
    return Stamp(month, day, clock, float(f"0.{frac}") if frac else 0.0, year)


class Timeline:
    """Fed a log's blocks with the lines wanted in each (the scanner's first matches), it keeps each wanted line's time,
    and only the last time seen besides: any size of log costs one pass and bounded memory."""

    def __init__(self) -> None:
        self._last: Stamp | None = None
        self._at: dict[int, Stamp] = {}
        self.stamped = False  # whether any line carried a time

    def feed(self, block: str, first_line: int, wanted: set[int]) -> None:
        """Read the times in block (whose first line is first_line); wanted lines in it get theirs."""
        last_line = first_line + block.count("\n")
        wants = sorted(w for w in wanted if first_line <= w <= last_line and w not in self._at)
        if not wants:  # most blocks: only their last time counts, for a wanted line in a later block
            if (last := _last_stamp(block)) is not None:
                self._last, self.stamped = last, True
            return
        lines: list[int] = []
        stamps: list[Stamp] = []
        line, counted = first_line, 0
        for at, stamp in _stamps(block, 0, len(block)):
            line += block.count("\n", counted, at)
            counted = at
            lines.append(line)
            stamps.append(stamp)
        for want in wants:
            index = bisect.bisect_right(lines, want) - 1
            if index >= 0:
                stamp = stamps[index]
                self._at[want] = stamp if lines[index] == want else replace(stamp, exact=False)
            elif self._last is not None:
                self._at[want] = replace(self._last, exact=False)
        if stamps:
            self._last = stamps[-1]
            self.stamped = True

    def at(self, line: int) -> Stamp | None:
        """The time of a wanted line: its own, or the last one before it; None where the log printed none before it."""
        return self._at.get(line)


def _stamps(block: str, start: int, end: int) -> Iterator[tuple[int, Stamp]]:
    """Each line's time between start and end (whole lines), with where its match starts; a date no calendar has is none."""
    for match in _TIME.finditer(block, start, end):
        if (stamp := _stamp(match)) is not None:
            yield match.start(), stamp


def _last_stamp(block: str) -> Stamp | None:
    """The last time block holds, searched for from its end in growing windows of whole lines."""
    end, size = len(block), _LAST_WINDOW
    while end > 0:
        start = 0 if size >= end else block.rfind("\n", 0, end - size) + 1
        if _CLOCK_HINT.search(block, start, end) is not None:
            stamps = [stamp for _, stamp in _stamps(block, start, end)]
            if stamps:
                return stamps[-1]
        end, size = start, size * 4
    return None


@dataclass(frozen=True)
class Seen:
    """Where and when a diagnosis was first seen in a folder: the file, its line, the rank and host, the time. Where no
    signature names the first failure, the launcher's report of it: code "" and the exit code it gives."""

    code: str
    file: str
    line: int
    rank: str  # "" unknown; "0-3" where the line's file holds several ranks' lines
    host: str
    stamp: Stamp | None
    kernel: bool = False  # the host's kernel log said it (an Xid), not a rank
    exitcode: str = ""  # a launcher's report's exit code or signal, where that report is the first failure (code "")
    pid: str = ""  # the process torchrun's report names
    reporter: str = "torchrun's root cause"  # whose report exitcode is
    unread: bool = True  # no signature read the reported rank's error (else the log's cause has no rank to join it to)
    process: str = ""  # torch.multiprocessing.spawn's process index, which is the rank only where the job makes it so

    def who(self) -> str:
        """'rank 3 on host h2', as far as known; 'the kernel on host h2' for a kernel log's line; 'process 1' for spawn's."""
        if self.process:
            return f"process {self.process}"
        rank = "the kernel" if self.kernel else f"rank {self.rank}" if self.rank else "a rank"
        return f"{rank} on host {self.host}" if self.host else (rank if self.rank or self.kernel else f"{self.file}")

    def what(self) -> str:
        """The code, or what the launcher's report says: 'exit code 1 (torchrun's root cause; no known signature)'."""
        return self.code or f"{self.ended()} ({self.reporter}{'; no known signature' if self.unread else ''})"

    def ended(self) -> str:
        """'exit code 3', or the signal a launcher names ('Segmentation fault (core dumped)')."""
        return f"exit code {self.exitcode}" if self.exitcode.lstrip("-").isdigit() else self.exitcode

    def echo(self) -> str:
        """What a consequence echoes: "rank 3 on host h2's PF701 at 03:33:57"."""
        failure = self.code or self.ended()
        return f"{self.who()}'s {failure}" + (f" {self.stamp.shown()}" if self.stamp else "")

    def describe(self) -> str:
        when = f" {self.stamp.shown()}" if self.stamp else ""
        return f"{self.who()}: {self.what()}{when} ({self.file}:{self.line})"

    def to_json(self) -> dict[str, str | int | bool | None]:
        return {"code": self.code or None, "file": self.file, "line": self.line, "rank": self.rank or None,
                "host": self.host or None, "time": self.stamp.to_json() if self.stamp else None,
                "time_exact": self.stamp.exact if self.stamp else None, "kernel": self.kernel,
                "exitcode": self.exitcode or None, "process": self.process or None}


# torch elastic's failure summary (torch/distributed/elastic/multiprocessing/errors/__init__.py, read in the PyPI wheels
# 1.9.0, 1.13.1, 2.6.0 and 2.15.0): its root cause is the failure with the earliest timestamp among the agent's own
# workers, "Root Cause:" (1.9) or "Root Cause (first observed failure):" (1.13 on), then "[0]:", "time", "host" (1.13
# on), "rank : N (local_rank: M)" and "exitcode : E (pid: P)". A collector's prefix (srun --label's "0: ") is on each line.
_ROOT_CAUSE = re.compile(
    r"^(?P<p>[^\n]{0,40}?)Root Cause(?: \(first observed failure\))?:\n(?P=p)\[\d+\]:\n"
    r"(?P=p)\s+time\s*: (?P<year>\d{4})-(?P<month>\d\d)-(?P<day>\d\d)_(?P<time>\d\d:\d\d:\d\d)\n"
    r"(?:(?P=p)\s+host\s*: (?P<host>\S+)\n)?"
    r"(?P=p)\s+rank\s*: (?P<rank>\d+) \(local_rank: \d+\)\n(?P=p)\s+exitcode\s*: (?P<exitcode>-?\d+) \(pid: (?P<pid>\d+)\)",
    re.MULTILINE)


def _line_of(block: str, first_line: int, at: int) -> int:
    """The number of the line holding block[at] (block's first line is first_line)."""
    return first_line + block.count("\n", 0, at)


def root_cause_reports(block: str, first_line: int, file: str, host: str = "") -> list[Seen]:
    """torchrun's root cause reports in block (whose first line is first_line): each as a Seen of code "" at its rank
    line, on the host its report names unless host (a folder's) is given."""
    if "Root Cause" not in block:
        return []
    found = []
    for m in _ROOT_CAUSE.finditer(block):
        stamp = Stamp(int(m["month"]), int(m["day"]), m["time"], 0.0, m["year"])
        found.append(Seen("", file, _line_of(block, first_line, m.start("rank")), m["rank"], host or m["host"] or "", stamp,
                          exitcode=m["exitcode"], pid=m["pid"]))
    return found


# srun's report of a task that ended badly (SchedMD/slurm src/plugins/launch/slurm/launch_slurm.c, src/srun/launch.c from
# 23.02; slurm-17-11 to slurm-26-05): error("%s: %s %s: Exited with exit code %d", hosts, "task", tasks, rc), or with
# strsignal's text; printed as srun learns of each, so the first names the first task it saw fail. A task is a rank
# where srun starts the ranks itself; one report of several tasks ("tasks 0-7") names none of them.
_SRUN_TASK = re.compile(r"^(?:\d+: )?srun: error: (?P<host>\S+): task (?P<task>\d+): "
                        r"(?:Exited with exit code (?P<exitcode>\d+)|(?P<signal>(?!Out Of Memory)[A-Z][^\n]*?))[ \t]*$", re.MULTILINE)


def srun_task_reports(block: str, first_line: int, file: str) -> list[Seen]:
    """srun's reports of a failed task in block, each as a Seen of code "" at its line."""
    if "srun: error: " not in block:
        return []
    return [Seen("", file, _line_of(block, first_line, m.start()), m["task"], m["host"], None,
                 exitcode=m["exitcode"] or m["signal"], reporter="srun's first failed task") for m in _SRUN_TASK.finditer(block)]


# Open MPI's mpirun (help-orterun.txt [orterun:non-zero-exit], v4.1) and PRRTE's, Open MPI 5's launcher (help-prun.txt
# [prun:non-zero-exit], openpmix/prrte v2.0.2 to v4.1.0): "%s detected that one or more processes exited with non-zero
# status, thus causing the job to be terminated. The first process to do so was:", then "Process name: %s" ([[JOB,1],RANK]
# under ORTE, [NSPACE,RANK] under PRRTE) and "Exit code: %d".
_MPIRUN_FIRST = re.compile(r"The first process to do so was:[ \t]*\n(?:[ \t]*\n)*[ \t]*Process name: \[(?:\[[^\]\n]*\]|[^,\]\n]*),"
                           r"(?P<rank>\d+)\][ \t]*\n[ \t]*Exit code: +(?P<exitcode>-?\d+)")


def mpirun_first_process_reports(block: str, first_line: int, file: str) -> list[Seen]:
    """mpirun's (Open MPI's, PRRTE's) report of the first process that exited with an error, at its Process name line."""
    if "The first process to do so was:" not in block:
        return []
    return [Seen("", file, _line_of(block, first_line, m.start("rank")), m["rank"], "", None, exitcode=m["exitcode"],
                 reporter="mpirun's first failed process") for m in _MPIRUN_FIRST.finditer(block)]


# torch.multiprocessing.spawn's report of the process whose failure ended the job (torch/multiprocessing/spawn.py, the
# catalogue's spawn-process-* entries): join() raises for the first process it finds failed and terminates the others.
# "process %d terminated with signal %s" or "with exit code %d" (ProcessExitedException from 1.8, a plain Exception
# before), or "-- Process %d terminated with the following error:" over the process's own traceback. The index is
# spawn's, which the job may or may not take for its rank.
_SPAWN_FAILED = re.compile(r"(?:ProcessExitedException|\bException): process (?P<index>\d+) terminated with "
                           r"(?:signal (?P<signal>\w+)|exit code (?P<exitcode>-?\d+))"
                           r"|^-- Process (?P<raised>\d+) terminated with the following error:", re.MULTILINE)


def spawn_process_reports(block: str, first_line: int, file: str) -> list[Seen]:
    """torch.multiprocessing.spawn's reports of the failed process in block, each as a Seen of code "" at its line."""
    if "rocess " not in block:
        return []
    return [Seen("", file, _line_of(block, first_line, m.start()), "", "", None, process=m["index"] or m["raised"],
                 exitcode=(m["exitcode"] or f"signal {m['signal']}") if m["index"] else "an exception (its traceback follows)",
                 reporter="torch.multiprocessing.spawn's failed process") for m in _SPAWN_FAILED.finditer(block)]


def launcher_reports(block: str, first_line: int, file: str, host: str = "") -> tuple[list[Seen], list[Seen]]:
    """In block: torchrun's root cause reports, and srun's, mpirun's and spawn's reports of a failed rank or process
    (used where torchrun did not run: under it, srun's tasks are its agents, not ranks)."""
    tasks = sorted(srun_task_reports(block, first_line, file) + mpirun_first_process_reports(block, first_line, file)
                   + spawn_process_reports(block, first_line, file), key=lambda report: report.line)  # in the order printed
    return root_cause_reports(block, first_line, file, host), tasks


def launcher_first_failure(reports: list[Seen], task_reports: list[Seen], echoing: set[str]) -> Seen | None:
    """Where every error a signature names is a consequence (another rank exited), or the root cause's line names no
    rank, the first failure is a launcher's report of it whose rank did not itself show a consequence: torchrun's where
    it ran (srun's tasks are then its agents, not ranks), the earliest by its time (each host's agent reports its own
    workers' first failure, which on a host whose rank only saw another's exit is that echo, not the job's root); else
    srun's, mpirun's or spawn's, which carry no time, the first printed."""
    # spawn's process index is not a rank to match against those that echoed: its report counts only where none did
    own = [r for r in reports or task_reports if r.rank not in echoing and not (r.process and echoing)]
    timed = [r for r in own if r.stamp is not None]
    # torchrun's reports carry the time of the failure; srun's are in the order srun learned of them
    return min(timed, key=lambda r: r.stamp.key if r.stamp else ()) if timed else (own[0] if own else None)
