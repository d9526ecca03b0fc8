"""Stack dumps in a log: which ranks wait inside a collective, and which are elsewhere, the ones the others wait for.

A job that stops moving prints no error, so people take its ranks' Python stacks and paste them: py-spy's `dump` (what
torch's distributed docs and most hang reports use), or CPython's faulthandler (`faulthandler.dump_traceback_later`, a
watchdog many trainers set; `faulthandler.register(SIGUSR1)`; `dump_traceback`). A rank whose thread waits inside
torch.distributed's distributed_c10d.py is waiting for its peers; a rank whose stack is elsewhere (its data loader, its
forward, a lock) is the one they wait for. A faulthandler dump written because the process crashed ("Fatal Python
error: ...") shows where it crashed, not a wait, and is not read.

The dumps are found by the literal words of their headers (`lines_with`); from each header the lines that follow are
read one by one until every dump begun there has ended (a line that is none of its parts), at most WINDOW_LINES.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from preflight.diagnose.lines import lines_with, literal_finder
from preflight.diagnose.progress import CHECKS, HANG_CODES, RANK_PREFIX
from preflight.diagnose.scan import DIVERGED_CODE, HANG_CODE, KEPT_RANKS, Diagnosis, Excerpt, line_excerpt

# Lines read on from a dump's header: a dump of many threads with deep stacks, and other ranks' lines between.
WINDOW_LINES = 4000
KEPT_FRAMES = 256  # frames read per thread: the innermost ones say where it waits
SHOWN = 8  # processes named per group in the details

# py-spy's `dump` (benfred/py-spy, src/dump.rs, v0.2.0 to v0.4.x, read at those tags): "Process PID: COMMAND LINE",
# "Python vVERSION (EXE)", then each thread, 'Thread TID (idle|active|active+gil): "NAME"' (v0.1: "Thread 0xID/0xOSID
# (STATUS)", src/main.rs), then its frames innermost first, "    FUNCTION (FILE:LINE)" or "    FUNCTION (FILE)" for a
# native frame (--native), the file shortened to its path under site-packages (v0.1: "\t FUNCTION (FILE:LINE)", and
# no "Process" line). --locals adds deeper-indented lines.
_SPY_PROCESS = re.compile(r"^Process (?P<pid>\d+): ")
_SPY_THREAD = re.compile(r'^Thread (?:0x[0-9A-Fa-f]+|\d+)(?:/0x[0-9A-Fa-f]+)? \((?:idle|active|active\+gil|gil)\)(?:: "(?P<name>.*)")?\s*$')
_SPY_FRAME = re.compile(r"^(?: {4}|\t )(?P<function>\S.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)\s*$")
_SPY_MORE = re.compile(r"^(?:Python v\d|Parent Process \d+: | {8}\S)")
# faulthandler (CPython's Python/traceback.c and Modules/faulthandler.c; the same in 3.6.15, 3.8.18, 3.11.7, 3.12.1 and
# 3.13.0, each run here): "Timeout (H:MM:SS)!" before a dump_traceback_later's, "Fatal Python error: NAME" before a
# crash's; each thread as "Thread 0xID (most recent call first):" ("Current thread" for the one that crashed or asked,
# "Stack" for dump_traceback(all_threads=False)), then '  File "FILE", line N in FUNCTION', innermost first. A crash
# adds "Python runtime state: ..." and "Extension modules: ..." lines.
_FAULT_THREAD = re.compile(r"^(?:(?:Current thread|Thread) 0x[0-9a-fA-F]+|Stack) \(most recent call first\):\s*$")
_FAULT_FRAME = re.compile(r'^ {2}File "(?P<file>.*)", line (?P<line>\d+|\?\?\?) in (?P<function>.*?)\s*$')
_FAULT_MORE = re.compile(r"^(?: {2}\S|Python runtime state: |Extension modules: )")
_TIMEOUT = re.compile(r"^Timeout \((?P<after>\d+:\d{2}:\d{2})\)!\s*$")
_FATAL = re.compile(r"^Fatal Python error: ")
_HEADERS = literal_finder("Process ", "(idle)", "(active", "(gil)", "(most recent call first):", "Timeout (", "Fatal Python error: ")

C10D = "torch/distributed/distributed_c10d.py"
# Calls of distributed_c10d.py that tear a group down: a rank stuck there waits for no other rank's call.
_LEAVING = frozenset({"destroy_process_group", "_shutdown_backend", "_abort_process_group"})
# Processes that are no rank, by a frame only they have: torchrun's agent (not elastic's @record, which wraps a rank's
# main too), torch.distributed.launch and DeepSpeed's launcher, torch.multiprocessing.spawn's parent (its ranks run
# spawn's _wrap), a DataLoader's worker, multiprocessing's own helper processes.
_NOT_RANK_FILES = ("torch/distributed/elastic/agent/", "torch/distributed/run.py", "torch/distributed/launcher/",
                   "torch/distributed/launch.py", "deepspeed/launcher/", "torch/utils/data/_utils/worker.py",
                   "multiprocessing/resource_tracker.py", "multiprocessing/semaphore_tracker.py", "multiprocessing/forkserver.py")
_SPAWN = "torch/multiprocessing/spawn.py"
_SPAWN_PARENT = frozenset({"join", "start_processes", "spawn"})


class _Frame(NamedTuple):
    function: str
    file: str
    number: str  # the line in file ("" for py-spy's native frames, "???" where faulthandler knows none)
    line: int  # the log's line
    text: str  # the log's line, as shown

    def where(self) -> str:
        return f"{self.function} ({_short(self.file)}{':' + self.number if self.number else ''})"


@dataclass
class _Thread:
    main: bool = False  # py-spy's "MainThread"; for faulthandler, a stack whose outermost frame is <module>
    frames: list[_Frame] = field(default_factory=list)  # innermost first


@dataclass
class _Dump:
    """One process's stacks, as one dump printed them."""

    label: str  # the rank its lines name, py-spy's process, or the dump's number
    kind: str  # "py-spy", "timeout" (faulthandler's, after H:MM:SS), "asked" (faulthandler's), "crash"
    detail: str = ""  # faulthandler's timeout
    threads: list[_Thread] = field(default_factory=list)


@dataclass(frozen=True)
class Stuck:
    """A process a dump showed: the collective it waits in, or where its main thread is."""

    label: str
    call: str  # the collective a thread waits in; "" where none does
    said: str  # the call and where the rank's code made it, or the main thread's innermost Python frame
    excerpt: Excerpt


@dataclass
class StackReader:
    """Feed it a log's blocks; then `diagnosis()` says which processes its stack dumps show waiting in a collective."""

    source: str = ""
    lines: int = 0
    processes: dict[str, Stuck] = field(default_factory=dict)  # the last dump of each process
    kinds: dict[str, None] = field(default_factory=dict)  # how the dumps were taken, in order, each once
    _open: dict[str, _Dump] = field(default_factory=dict)  # dumps still being read, by the label of their lines
    _counted: int = 0  # faulthandler dumps numbered, where no rank or process names them
    _until: int = 0  # the line past which the dumps begun at the last header are no longer read

    def start(self, source: str) -> None:
        """A new file begins (a folder's next log): its line numbers start again at 1, and no dump runs on into it."""
        self._close_all()
        self.source, self.lines, self._until = source, 0, 0

    def feed(self, block: str, rank: str = "") -> None:
        """Read one block's stack dumps; rank: the file's rank when its lines do not name one."""
        first = self.lines + 1
        heads = deque(line for line, _ in lines_with(_HEADERS, block, first))
        count = block.count("\n")
        if heads or self._open:
            texts = block.split("\n")
            end = first + count + (0 if block.endswith("\n") else 1)
            at = first if self._open else heads[0]
            while at < end:
                while heads and heads[0] < at:
                    heads.popleft()
                if heads and heads[0] == at:
                    self._until = max(self._until, at + WINDOW_LINES)
                elif not self._open:
                    if not heads:
                        break
                    at = heads[0]  # nothing open: on to the next header
                    continue
                if at >= self._until:
                    self._close_all()  # a dump whose lines stopped coming (its rank went quiet among others' lines)
                    continue
                self._line(texts[at - first], at, rank)
                at += 1
        self.lines += count

    def _line(self, raw: str, line: int, rank: str) -> None:
        prefix = RANK_PREFIX.match(raw)  # torch's [rank3]:, torchrun --tee's [default3]:, srun's 3:
        label = (prefix and (prefix["a"] or prefix["b"])) or rank
        text = raw[prefix.end():] if prefix else raw
        dump = self._open.get(label)
        if (spy := _SPY_PROCESS.match(text)) is not None:
            self._begin(label, _Dump(f"rank {label} (process {spy['pid']})" if label else f"process {spy['pid']}", "py-spy"))
        elif (timeout := _TIMEOUT.match(text)) is not None:
            self._begin(label, _Dump(self._name(label), "timeout", timeout["after"]))
        elif _FATAL.match(text):
            self._begin(label, _Dump(self._name(label), "crash"))
        elif (thread := _SPY_THREAD.match(text)) is not None or _FAULT_THREAD.match(text):
            if dump is None:  # faulthandler's asked for (a registered signal, dump_traceback), or py-spy 0.1's: no header
                dump = self._begin(label, _Dump(self._name(label), "asked" if thread is None else "py-spy"))
            dump.threads.append(_Thread(main=thread is not None and thread["name"] == "MainThread"))
        elif dump is None:
            return
        elif (frame := (_SPY_FRAME if dump.kind == "py-spy" else _FAULT_FRAME).match(text)) is not None:
            if dump.threads and len(dump.threads[-1].frames) < KEPT_FRAMES:
                dump.threads[-1].frames.append(_Frame(frame["function"], frame["file"], frame["line"] or "", line,
                                                      line_excerpt(raw, prefix.end() if prefix else 0)))
        elif not text.strip() or (_SPY_MORE if dump.kind == "py-spy" else _FAULT_MORE).match(text):
            return
        else:
            self._close(label)

    def _name(self, label: str) -> str:
        if label:
            return f"rank {label}"
        self._counted += 1
        return f"dump {self._counted}"

    def _begin(self, label: str, dump: _Dump) -> _Dump:
        self._close(label)
        self._open[label] = dump
        return dump

    def _close_all(self) -> None:
        for label in list(self._open):
            self._close(label)

    def _close(self, label: str) -> None:
        dump = self._open.pop(label, None)
        if dump is None or dump.kind == "crash" or not dump.threads:
            return
        stuck = _stuck(dump, self.source)
        if stuck is None or (stuck.label not in self.processes and len(self.processes) >= KEPT_RANKS):
            return
        self.processes[stuck.label] = stuck
        how = {"py-spy": "py-spy dump", "asked": "faulthandler"}.get(dump.kind, f"faulthandler after {dump.detail} (a timeout)")
        self.kinds[how] = None

    def diagnosis(self) -> Diagnosis | None:
        """A hang, where a dump shows a process waiting in a collective (or to join the group): which wait where, and which
        are elsewhere."""
        self._close_all()
        waiting = [s for s in self.processes.values() if s.call]
        if not waiting:
            return None
        elsewhere = sorted((s for s in self.processes.values() if not s.call), key=lambda s: _label_key(s.label))
        by_call: dict[str, list[str]] = {}
        for s in sorted(waiting, key=lambda s: _label_key(s.label)):
            by_call.setdefault(s.said, []).append(s.label)
        details = {"waiting for the other ranks": [f"{_names(labels)}: {call}" for call, labels in by_call.items()]}
        if elsewhere:
            details["elsewhere (what the others wait for)"] = [f"{s.label}: {s.said}" for s in elsewhere[:SHOWN]]
        # Ranks blocked in different collectives parted ways: one entered a call the others never will (gloo's calls block
        # until every rank is in; an NCCL rank's Python may wait at another point than the kernel it is stuck in).
        diverged = len({s.call for s in waiting}) > 1
        if diverged:
            details["the ranks wait in different collectives"] = [f"a collective not every rank entered ({DIVERGED_CODE})"]
        details["stack dumps"] = list(self.kinds)
        excerpts = sorted({s.excerpt for s in (*elsewhere[:2], *waiting[:2])}, key=lambda e: (e.source, e.line))
        first = min(s.excerpt.line for s in waiting if s.excerpt.source == waiting[0].excerpt.source)
        codes = (HANG_CODE, DIVERGED_CODE, *HANG_CODES[1:]) if diverged else HANG_CODES  # the progress reader's hang's
        return Diagnosis(code=HANG_CODE, codes=codes, tier="consequence", signatures=("stack-dump-in-collective",),
                         first_line=first, matches=len(waiting), excerpts=tuple(excerpts[:3]), details=details, ranks=(),
                         before_job=CHECKS)


def _label_key(label: str) -> tuple[str, int]:
    """Labels in their first numbers' order: rank 2 before rank 10."""
    number = re.search(r"\d+", label)
    return (label[:number.start()], int(number.group())) if number else (label, -1)


def _names(labels: list[str]) -> str:
    return " and ".join(labels[:SHOWN]) + (f" and {len(labels) - SHOWN} more" if len(labels) > SHOWN else "")


def _stuck(dump: _Dump, source: str) -> Stuck | None:
    """What one dump shows: the collective a thread waits in (the main thread's first), else where the main thread is;
    None for a process that is no rank (torchrun's agent, spawn's parent, a loader's worker)."""
    if any(_no_rank(frame) for thread in dump.threads for frame in thread.frames):
        return None
    main = next((t for t in dump.threads if t.main), None) or next(
        (t for t in dump.threads if t.frames and t.frames[-1].function == "<module>"), dump.threads[-1])
    for thread in (main, *(t for t in dump.threads if t is not main)):
        if (found := _collective(thread)) is not None:
            call, caller = found
            said = call.function + (f" called from {caller.where()}" if caller else "")
            return Stuck(dump.label, call.function, said, Excerpt(call.line, call.text, source))
    python = next((f for f in main.frames if f.file.endswith(".py")), None)
    if python is None:
        return None
    return Stuck(dump.label, "", python.where(), Excerpt(python.line, python.text, source))


def _no_rank(frame: _Frame) -> bool:
    return (any(part in frame.file for part in _NOT_RANK_FILES)
            or (frame.file.endswith(_SPAWN) and frame.function in _SPAWN_PARENT))


def _collective(thread: _Thread) -> tuple[_Frame, _Frame | None] | None:
    """The outermost distributed_c10d.py call of the innermost run of torch.distributed frames, what the rank's code
    called (all_gather_object, not the all_gather inside it; init_process_group, where the ranks wait for each other to
    join), and the frame that called it; None where the thread waits in none, or in tearing its group down."""
    found, caller = None, None
    for frame in thread.frames:
        if frame.file.endswith(C10D):
            found = frame
        elif found is not None and "torch/distributed/" not in frame.file:
            caller = frame
            break
    if found is None or found.function in _LEAVING:
        return None
    return found, caller


def _short(file: str) -> str:
    """A frame's file from its package on (py-spy already shortens it; faulthandler gives the whole path)."""
    at = file.rfind("site-packages/")
    return file[at + len("site-packages/"):] if at >= 0 else file
