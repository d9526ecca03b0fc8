"""Hangs: a log that stops without an error line. The last progress each rank showed (process group initialized,
epoch N, step N), which ranks reported it and which fell silent, and the timestamps around it.

A job that hangs prints nothing more: no error for the signature table to find. What is left is its progress lines,
found in each block by the literal words they hold (`lines_with`), kept per rank (bounded), and judged once the log ends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from preflight.diagnose.lines import lines_with, literal_finder
from preflight.diagnose.scan import HANG_CODE, KEPT_RANKS, Diagnosis, Excerpt, line_excerpt, rank_ranges
from preflight.diagnose.timeline import GLOG_MONTH_DAY

# Why a job stops without an error, most likely first; preflight check's codes that find each before the job.
HANG_CODES = (HANG_CODE, "PF102", "PF606", "PF601")
CHECKS = ("PF102, PF606, PF601: preflight check cluster=NAME (the denylist, the collective across each host's GPUs, "
          "the collective across hosts)")
# Stalled right after the process group or NCCL's communicators initialized: the first collective's GPU-to-GPU path
# never completes. Besides a denylisted driver's P2P, the host's PCI topology: ACS redirecting peer-to-peer traffic
# (PF822) and an IOMMU translating GPU DMA (PF823), which NCCL's troubleshooting guide names for hangs.
AFTER_INIT_CODES = (HANG_CODE, "PF102", "PF822", "PF823", "PF606", "PF601")
AFTER_INIT_CHECKS = ("PF102, PF822, PF823, PF606, PF601: preflight check cluster=NAME playbook=full (the denylist, ACS and "
                     "the IOMMU on every host, the collective across each host's GPUs and across hosts)")
STALL_S = 60  # a log that goes on this long after its last progress, without progress, has stopped
LEVELS = {"joining": 0, "init": 1, "epoch": 2, "step": 2}  # how far each stage is: training beats initialized
EVERYONE = "*"  # the label of a line that speaks for every rank (Lightning's "All distributed processes registered")

# Each pattern: a stage, and optionally the rank (rank), the world size (world), the count (number), and (everyone) a
# line that rank 0 prints for all ranks.
PROGRESS: tuple[tuple[str, re.Pattern[str]], ...] = tuple((stage, re.compile(source)) for stage, source in (
    # Lightning, per rank before init_process_group ("initializing ddp" before 1.6), then on rank 0 once all joined.
    ("joining", r"(?i:initializing (?:distributed|ddp)): GLOBAL_RANK: (?P<rank>\d+), MEMBER: \d+/(?P<world>\d+)"),
    ("init", r"(?P<everyone>All (?:distributed|DDP) processes registered)\. Starting (?:ddp )?with (?P<world>\d+) processes"),
    # torch's store-based barrier inside init_process_group (torch before 2.2 logged it at INFO).
    ("joining", r"Added key: store_based_barrier_key:\d+ to store for rank: (?P<rank>\d+)"),
    ("joining", r"Waiting in store based barrier to initialize process group for rank: (?P<rank>\d+), .*world_size=(?P<world>\d+)"),
    # NCCL's communicator, per rank, with NCCL_DEBUG=INFO.
    ("init", r"NCCL INFO comm 0x[0-9a-f]+ rank (?P<rank>\d+) nranks (?P<world>\d+) .*Init COMPLETE"),
    # torch's store-based barrier in init_process_group (torch before 2.2 printed it at INFO).
    ("init", r"Rank (?P<rank>\d+): Completed store-based barrier for key:\S+ with (?P<world>\d+) nodes"),
    ("init", r"(?i:process group (?:has been |was )?initiali[sz]ed)"),
    # A count, not a percentage: tqdm's "Training Epoch:   0%|" names no epoch.
    ("epoch", r"(?i:\bepoch)[\s:=\[#]*(?P<number>\d+)(?![\d%.])"),
    ("step", r"(?i:\b(?:global[_ ])?(?:step|iter(?:ation)?))[\s:=\[#]*(?P<number>\d+)(?![\d%.])"),
    # tqdm's bar (Lightning's, HF's): "45%|####5     | 9/20 [00:01<00:01": the step within the bar.
    ("step", r"\d%\|[^|\n]{0,200}\|\s*(?P<number>\d+)/(?:\d+|\?) \["),
))
# A job that says it finished did not hang.
FINISHED = re.compile(r"`Trainer\.fit` stopped|(?i:training (?:is )?(?:complete|completed|finished|done)\b)"
                      r"|worker group successfully finished|Local worker group finished \(WorkerState\.SUCCEEDED\)")
# Where a line names its rank: torch's [rank3]:, torchrun --tee's [default3]:, srun --label's "3: ".
RANK_PREFIX = re.compile(r"^\s*(?:\[(?:rank|default)(?P<a>\d+)\]:|(?P<b>\d{1,5}): )")
# Timestamps: ISO 8601 (Python logging, Lightning, most loggers) and glog's (torch's C++ and torchrun's W1123 13:32:27).
ISO_TIME = re.compile(r"(?P<date>\d{4}-\d{2}-\d{2})[ T](?P<time>\d{2}:\d{2}:\d{2})")
GLOG_TIME = re.compile(r"\b[IWEF]" + GLOG_MONTH_DAY.format(month="month", day="day") + r" (?P<time>\d{2}:\d{2}:\d{2})")
# A process that ended on an error no signature knows (a Python traceback, a signal): it crashed, it did not hang.
CRASHED = re.compile(r"Traceback \(most recent call last\)|ChildFailedError|Segmentation fault|core dumped"
                     r"|exitcode\s*: -?[1-9]|^\s*(?:\[rank\d+\]:\s*)?[\w.]+(?:Error|Exception): ")
# Literal words every progress, end or crash line contains: only lines holding one are matched against the patterns.
_WORDS = literal_finder("GLOBAL_RANK: ", "processes registered", "store_based_barrier_key", "Init COMPLETE", "Completed store-based",
                        "rocess group", "poch", "EPOCH", "tep", "STEP", "iter", "Iter", "ITER", "Trainer.fit", "raining complete",
                        "raining finished", "raining done", "raining is ", "worker group", "%|", "Traceback", "ChildFailedError",
                        "Segmentation fault", "core dumped", "exitcode", "Error: ", "Exception: ")


def timestamp(text: str) -> datetime | None:
    """The line's time, when it has one (glog's has no year: 2000 stands in, so only differences mean anything)."""
    if (iso := ISO_TIME.search(text)) is not None:
        return datetime.fromisoformat(f"{iso['date']}T{iso['time']}")
    if (glog := GLOG_TIME.search(text)) is not None:
        try:
            return datetime.fromisoformat(f"2000-{int(glog['month']):02d}-{glog['day']}T{glog['time']}")
        except ValueError:
            return None
    return None


@dataclass(frozen=True)
class Mark:
    """One progress line: how far (0 joining, 1 initialized, 2 training), its epoch and step, where it is, its time."""

    level: int
    epoch: int | None
    step: int | None
    excerpt: Excerpt
    time: datetime | None

    @property
    def order(self) -> tuple[int, int, int]:
        return self.level, -1 if self.epoch is None else self.epoch, -1 if self.step is None else self.step

    def describe(self) -> str:
        if self.level == 0:
            return "joining the process group (init_process_group started)"
        if self.level == 1:
            return "process group initialized"
        parts = ([f"epoch {self.epoch}"] if self.epoch is not None else []) + ([f"step {self.step}"] if self.step is not None else [])
        return " ".join(parts)


@dataclass
class ProgressTracker:
    """Feed it a log's blocks (or several logs', each with the rank its file belongs to); then ask whether it hung."""

    source: str = ""
    lines: int = 0
    last: dict[str, Mark] = field(default_factory=dict)  # furthest progress per rank label ("" for unknown)
    world: int = 0
    finished: bool = False
    last_time: datetime | None = None
    epochs: dict[str, int] = field(default_factory=dict)  # each rank's current epoch, for step lines that omit it
    crashes: dict[tuple[str, str], Excerpt] = field(default_factory=dict)  # (file, rank label) -> its last error line

    def start(self, source: str) -> None:
        """A new file begins (a folder's next log): its line numbers start again at 1."""
        self.source, self.lines = source, 0

    def feed(self, block: str, rank: str = "") -> None:
        """Read one block's progress lines; rank: the file's rank when its lines do not name one."""
        for line, text in lines_with(_WORDS, block, self.lines + 1):
            self._line(text, line, rank)
        # The log's last timestamp, from its last line that has one: how long it ran on after the last progress.
        tail = block.rstrip("\n").rsplit("\n", 8)
        for text in reversed(tail[-8:]):
            if (time := timestamp(text)) is not None:
                self.last_time = time if self.last_time is None else max(self.last_time, time)
                break
        self.lines += block.count("\n")

    def _line(self, text: str, line: int, rank: str) -> None:
        if FINISHED.search(text):
            self.finished = True
            return
        if (crash := CRASHED.search(text)) is not None:
            prefix = RANK_PREFIX.match(text)
            key = (self.source, (prefix and (prefix["a"] or prefix["b"])) or rank)
            if key in self.crashes or len(self.crashes) < KEPT_RANKS:
                self.crashes[key] = Excerpt(line, line_excerpt(text, crash.start()), self.source)
            return
        # A line can say several things ("epoch 2 step 300"): every pattern is tried, and the furthest stage counts.
        level, epoch, step, label, start = -1, None, None, "", len(text)
        for stage, pattern in PROGRESS:
            if (first := pattern.search(text)) is None:  # most patterns: one search, no list of matches built
                continue
            # The last match: a tqdm line holds every update of its bar, joined by carriage returns.
            match = first
            for match in pattern.finditer(text, first.end()):  # noqa: B007  # the loop keeps the last one
                pass
            groups = match.groupdict()
            level, start = max(level, LEVELS[stage]), min(start, match.start())
            if stage == "epoch":
                epoch = int(groups["number"])
            elif stage == "step":
                step = int(groups["number"])
            if groups.get("everyone"):
                label = EVERYONE
            elif groups.get("rank") and not label:
                label = groups["rank"]
            if groups.get("world"):
                self.world = max(self.world, min(int(groups["world"]), KEPT_RANKS))
        if level < 0:
            return
        prefix = RANK_PREFIX.match(text)
        label = label or (prefix and (prefix["a"] or prefix["b"])) or rank
        if epoch is None and step is not None:
            epoch = self.epochs.get(label)
        if epoch is not None and (label in self.epochs or len(self.epochs) < KEPT_RANKS):
            self.epochs[label] = epoch
        mark = Mark(level, epoch, step, Excerpt(line, line_excerpt(text, start), self.source), timestamp(text))
        held = self.last.get(label)
        if (held is None or mark.order >= held.order) and (label in self.last or len(self.last) < KEPT_RANKS):
            self.last[label] = mark

    def hang(self, explained: bool = False) -> Diagnosis | None:
        """A hang, when the log showed progress, never said it finished, (the caller checks) printed no error, and shows
        that it stopped: a rank behind the others or never heard from, a rank that crashed, the log going on for a while
        without progress, or (explained) a version known to hang. A pasted excerpt that just ends is not a hang."""
        if not self.last or self.finished:
            return None
        furthest = max(self.last.values(), key=lambda m: (m.order, m.excerpt.source, m.excerpt.line))
        known = {label: mark for label, mark in self.last.items() if label and label != EVERYONE}
        everyone = self.last.get(EVERYONE)
        for number in range(min(self.world, KEPT_RANKS) if everyone else 0):  # rank 0 spoke for all: each got that far
            held = known.get(str(number))
            if held is None or held.order < everyone.order:  # type: ignore[union-attr]  # everyone is set here
                known[str(number)] = everyone  # type: ignore[assignment]
        crashed = {label: where for label, where in ((label, self._crash_after(label, m)) for label, m in known.items()) if where}
        if self._crash_after("", furthest) or (crashed and len(crashed) == len(known)):
            return None  # the job ended on an error no signature knows: not a hang
        reported = sorted((label for label, m in known.items() if m.order == furthest.order), key=_label_key)
        behind = sorted((label for label, m in known.items() if m.order < furthest.order and label not in crashed), key=_label_key)
        numbered = {int(label) for label in known if label.isdigit()}
        # Ranks never heard from count while the job is still joining (each rank announces itself), or when the ranks heard
        # from are one block (a host's, or a file's): a pasted excerpt of interleaved NCCL init lines names scattered ranks
        # of a job that may well have run on.
        block = bool(numbered) and max(numbered) - min(numbered) + 1 == len(numbered)
        counts_missing = bool(numbered) and (furthest.level == LEVELS["joining"] or block)
        never = [str(r) for r in range(self.world) if r not in numbered] if self.world and counts_missing else []
        stalled = furthest.time is not None and self.last_time is not None and (self.last_time - furthest.time).total_seconds() >= STALL_S
        if not (behind or never or crashed or stalled or explained):
            return None
        details: dict[str, list[str]] = {"last progress": [furthest.describe()]}
        if reported:
            details["ranks that reached it"] = [_labels(reported)]
        if behind:
            details["ranks that fell silent before it"] = [f"{label} (last: {known[label].describe()})" for label in behind[:16]]
        if never:
            details["ranks never heard from"] = [_labels(never)]
        if crashed:
            details["ranks that stopped on an error no signature knows"] = [
                f"{label} ({':'.join(p for p in (where.source, str(where.line)) if p)}: {where.text[:120]})"
                for label, where in sorted(crashed.items(), key=lambda item: _label_key(item[0]))[:16]]
        if self.world:
            details["world size"] = [str(self.world)]
        if furthest.time is not None:
            details["last progress at"] = [furthest.time.isoformat(sep=" ").removeprefix("2000-")]
            if self.last_time is not None and self.last_time > furthest.time:
                details["log went on without progress for"] = [f"{(self.last_time - furthest.time).total_seconds():.0f} s"]
        excerpts = sorted({m.excerpt for m in known.values() if m.order == furthest.order} | {furthest.excerpt},
                          key=lambda e: (e.source, e.line))
        after_init = furthest.level == LEVELS["init"]
        return Diagnosis(code=HANG_CODE, codes=AFTER_INIT_CODES if after_init else HANG_CODES, tier="consequence",
                         signatures=("no-error-hang",), first_line=furthest.excerpt.line, matches=len(self.last),
                         excerpts=tuple(excerpts[-3:]), details=details, ranks=(),
                         before_job=AFTER_INIT_CHECKS if after_init else CHECKS)

    def _crash_after(self, label: str, mark: Mark) -> Excerpt | None:
        """The error line that ended label's output after its last progress (in the same file), if any."""
        for key in ((mark.excerpt.source, label), (mark.excerpt.source, "")) if label else ((mark.excerpt.source, ""),):
            where = self.crashes.get(key)
            if where is not None and where.line > mark.excerpt.line:
                return where
        return None


def _label_key(label: str) -> tuple[int, str]:
    return (int(label), "") if label.isdigit() else (1 << 30, label)


def _labels(labels: list[str]) -> str:
    """Numbered ranks as runs (0-3, 5), other labels as they are."""
    numbers = [int(label) for label in labels if label.isdigit()]
    others = [label for label in labels if not label.isdigit()]
    return ", ".join(([rank_ranges(numbers)] if numbers else []) + others[:16])
