"""Judging one launch: what every host's output says, as a pass, or the phase and the hosts of a failure or a hang."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from preflight.collective.contracts import RunStatus
from preflight.collective.events import Failure, RankEvent, parse_events
from preflight.collective.host.events import PHASES
from preflight.collective.wire import ResultEvent
from preflight.errors import last_line
from preflight.findings import Finding, Status
from preflight.launch import Launch
from preflight.transport.base import CommandResult

_EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception|Timeout)\b.*?: \S")
_NO_PHASE = -1  # what a host that entered no phase reached, below PHASES' first
# What a rank says when its peer's process went away under it: a consequence, never a cause of its own.
_PEER_GONE = ("closed by peer", "reset by peer", "broken pipe", "connection was likely closed", "got 0 bytes")


@dataclass(frozen=True)
class LostHost:
    """A host whose SSH connection was lost under a launch (powered off, cable pulled): where its ranks went silent."""

    host: str
    phase: str  # the furthest phase its ranks entered; "rendezvous" when none had started
    reason: str  # the transport's, in one line


@dataclass
class RunOutcome:
    """One launch over a set of hosts and what came of it."""

    launch: Launch
    status: RunStatus
    phase: str | None  # where it failed or hung; "rendezvous" when no worker started
    message: str  # one line, naming hosts and phase
    named_hosts: list[str] = field(default_factory=list)  # hosts this run alone points at
    results: list[ResultEvent] = field(default_factory=list)  # the ranks' result events
    port_taken: bool = False  # the master's torchrun found its rendezvous port in use
    outputs: dict[str, str] = field(default_factory=dict)  # each host's output (stdout, then stderr), for NCCL's own lines
    lost: list[LostHost] = field(default_factory=list)  # status "unknown": the hosts lost under it


def phase_order(phase: str | None) -> int:
    """Where a phase sorts among the worker's PHASES. One the worker does not have (or none) sorts after them all: of
    two causes, the one in a phase the worker names is the one to report."""
    return PHASES.index(phase) if phase in PHASES else len(PHASES)


def judge(launch: Launch, results: Sequence[CommandResult]) -> RunOutcome:
    """What one launch's output says: pass, or the phase and hosts of its failure or hang."""
    expected = launch.nnodes * launch.nproc_per_node
    events = {r.host: parse_events(r.stdout) for r in results}
    every = [e for evs in events.values() for e in evs]
    finals = [e.result for e in every if e.result is not None]
    errors = [e for e in every if e.kind == "error"]
    silent = [r.host for r in results if not any(e.kind == "phase" for e in events[r.host])]
    where = f"{launch.nnodes} host(s) x {launch.nproc_per_node} rank(s) at {launch.master}:{launch.master_port}"
    lost = [LostHost(r.host, _furthest_phase(events[r.host]), r.reason or "lost") for r in results if r.lost]
    if lost:
        # What the others said after a host went away says nothing of them: their peer's ranks went silent mid-phase, and
        # the transport ended them. The launch has no verdict, and no host is to blame.
        phrase = ", ".join(f"{h.host} in {h.phase}" for h in lost)
        return RunOutcome(launch, "unknown", min((h.phase for h in lost), key=_silent_order),
                          f"{where}: lost {phrase} ({lost[0].reason}); the launch has no verdict", [h.host for h in lost], finals,
                          lost=lost)
    if len(finals) == expected and all(r.ok for r in results) and not errors:
        wrong = sum(f["verify"]["wrong"] for f in finals)
        problems = sorted({p for f in finals for p in f["problems"]})
        if wrong or problems:
            named = sorted({f["host"] for f in finals if f["verify"]["wrong"]})
            detail = f"{wrong} wrong element(s) received" if wrong else "; ".join(problems)
            return RunOutcome(launch, "fail", "verify" if wrong else "identity", f"{where}: {detail}", named, finals)
        return RunOutcome(launch, "pass", None, f"{where}: every byte of the all_gather verified", [], finals)
    if not every or len(silent) == len(results):
        return _no_rendezvous(launch, results, silent, where)
    vanished, seen = _vanished_ranks(every)
    # torchrun stops a rank's siblings when it exits: beside a rank stopped by a peer's failure, a silent end is no cause.
    stopped_by_peer = {e.host for e in errors if e.after is not None}
    vanished = [v for v in vanished if v[0] not in stopped_by_peer]
    reasons = {r.host: _torchrun_reason(r.stderr) or r.reason or "" for r in results}
    if any(e.after is None for e in errors):
        # A rank whose torchrun died of its store going away ("got 0 bytes ... likely closed") beside a rank with an
        # error of its own is that error's echo: the store's host stopped because of it.
        vanished = [v for v in vanished if not _peer_gone(reasons.get(v[0]))]
    if vanished and len(vanished) < seen:
        # Ranks that stopped without a word (killed, crashed) are the root cause; their peers'
        # errors ("connection closed by peer") only follow from them.
        host, rank, phase = min(vanished, key=lambda v: phase_order(v[2]))
        why = reasons.get(host, "")
        named = sorted({v[0] for v in vanished})
        return RunOutcome(launch, "fail", phase, f"{where}: rank {rank} on {host} died in {phase} without a word"
                          f"{f' ({why})' if why else ''}; its peers failed after it", named, finals)
    if errors and not _peers_gone_after_a_timeout(every, errors):
        root = _root_cause(errors)
        named = sorted({h for h in (root.host, *silent) if h is not None})
        return RunOutcome(launch, "fail", root.phase, f"{where}: rank {root.rank} on {root.host} failed in {root.phase}: {root.error}",
                          named, finals)
    return _hang(launch, events, silent, where, finals)


def lost_findings(lost: Sequence[LostHost], during: str) -> list[Finding]:
    """A PF601 unknown for each host lost under a launch (during: which one, in words), with where its ranks went silent.
    Unknown, never failed: nothing says how the host would have done, and the others' errors only followed its going."""
    remedy = "bring the host back (its power, cable or sshd) or leave it out of cluster.hosts, then check again"
    return [Finding("PF601", Status.unknown, h.host, f"lost {during} in {h.phase}: {h.reason}", remedy) for h in lost]


def _furthest_phase(events: Sequence[RankEvent]) -> str:
    """The furthest of PHASES a host's ranks entered, or "rendezvous" when none had started."""
    entered = [phase_order(e.phase) for e in events if e.kind == "phase" and e.phase in PHASES]
    return PHASES[max(entered)] if entered else "rendezvous"


def _silent_order(phase: str) -> int:
    """Where a lost host went silent, earliest first: the rendezvous before the worker's first phase."""
    return -1 if phase == "rendezvous" else phase_order(phase)


def _peers_gone_after_a_timeout(every: Sequence[RankEvent], errors: Sequence[RankEvent]) -> bool:
    """Whether every error only says a peer went away, and a rank timed out: the first rank to wait out its
    deadline ends its process, and a peer still inside the same collective hears "connection closed by peer"
    before its own watchdog fires. The hang is the cause."""
    if not any(e.kind == "timeout" for e in every):
        return False
    # A rank stopped by a peer's failure (`after`) echoes the hang only when that failure was itself a peer gone: the
    # store relays the echo to ranks whose own watchdog had not fired yet.
    return all(_peer_gone((e.after or e).error) for e in errors)


def _peer_gone(error: str | None) -> bool:
    """Whether an error only says that a peer's process went away under this rank."""
    return any(words in (error or "").lower() for words in _PEER_GONE)


def _no_rendezvous(launch: Launch, results: Sequence[CommandResult], silent: list[str], where: str) -> RunOutcome:
    """No worker started anywhere: the rendezvous never completed."""
    reasons = {r.host: (r.reason if not r.reached else _torchrun_reason(r.stderr)) for r in results}
    hung = any(_is_timeout(why or "") for why in reasons.values())
    first = next((f"{h}: {why}" for h, why in reasons.items() if why), "no output")
    others = [h for h in silent if h != launch.master]
    master_reason = reasons.get(launch.master) or ""
    # When even the master cannot reach its own store, the store's host and port are the suspects.
    master_failed = bool(master_reason) and all(reasons.values())
    taken = any(word in master_reason.lower() for word in ("eaddrinuse", "address already in use"))
    return RunOutcome(launch, "hang" if hung else "fail", "rendezvous",
                      f"{where}: the rendezvous never completed ({first})", [launch.master] if master_failed else others,
                      port_taken=taken)


def _root_cause(errors: Sequence[RankEvent]) -> Failure:
    """The failure behind a launch's errors. A rank stopped by a peer's failure carries that failure in `after`: the
    peer is the root cause, even when its own line was lost. Of the ranks' own errors, the first: the earliest phase,
    then the earliest by the hosts' clocks (as torch elastic's ProcessFailure.timestamp): each rank's t counts from its
    own start, and hosts start apart. Only where an error has no clock time (its worker could not read its config) do
    the t decide, one without a t counting as its rank's start."""
    own = [e for e in errors if e.after is None]
    if own:
        by_clock = all(e.unix_s is not None for e in own)
        return min(own, key=lambda e: (phase_order(e.phase), (e.unix_s if by_clock else e.t) or 0.0)).failure
    heard = [e.after for e in errors if e.after is not None]
    return heard[0]


def _hang(launch: Launch, events: Mapping[str, list[RankEvent]], silent: list[str], where: str, finals: list[ResultEvent]) -> RunOutcome:
    """Every rank still running waited: the phase it hung in, and the hosts that stopped reporting first."""
    timeouts = [e for evs in events.values() for e in evs if e.kind == "timeout"]
    reached = {h: max((phase_order(e.phase) for e in evs if e.kind == "phase" and e.phase in PHASES), default=_NO_PHASE)
               for h, evs in events.items()}
    # The earliest phase a rank timed out in; when no timeout names a phase the worker has, the earliest one reached.
    timed_out = min((phase_order(t.phase) for t in timeouts), default=len(PHASES))
    phase = PHASES[timed_out] if timed_out < len(PHASES) else PHASES[max(0, min(reached.values()))]
    # Hosts that stopped reporting before the others (hung earlier, or cut by the transport) are the suspects.
    furthest = max(reached.values())
    stuck = {t.host for t in timeouts if t.stuck and t.host is not None}  # cut by the host's supervisor: deaf to its own watchdog
    suspects = sorted({h for h, p in reached.items() if p < furthest} | set(silent) | stuck)
    joined = sorted({e.rank for evs in events.values() for e in evs if e.kind == "phase" and e.rank is not None})
    detail = f"ranks {joined} joined; " if joined else ""
    if suspects:
        detail += "stopped reporting first: " + ", ".join(suspects)
    else:
        # Every rank waited in the same collective: no host stands out here; splitting the set names it.
        deadline = next((t.deadline_s for t in timeouts if t.phase == phase and t.deadline_s is not None), None)
        detail += f"every rank waited out the {phase} deadline" + (f" ({deadline:g} s)" if deadline is not None else "")
    return RunOutcome(launch, "hang", phase, f"{where}: HANG in {phase}: {detail}", suspects, finals)


def _vanished_ranks(events: Sequence[RankEvent]) -> tuple[list[tuple[str, int, str]], int]:
    """(host, rank, last phase) of every rank that started but ended with no result, error or timeout; and how many
    ranks said anything at all."""
    last_phase: dict[tuple[str, int], str] = {}
    ended: set[tuple[str, int]] = set()
    seen: set[tuple[str, int]] = set()
    for e in events:
        # A rank that failed before torchrun's RANK was read reports rank null: it cannot be told apart.
        if e.rank is None or e.host is None:
            continue
        key = (e.host, e.rank)
        seen.add(key)
        if e.kind == "phase" and e.phase is not None:
            last_phase[key] = e.phase
        elif e.kind in ("result", "error", "timeout"):
            ended.add(key)
    return sorted((host, rank, phase) for (host, rank), phase in last_phase.items() if (host, rank) not in ended), len(seen)


def _torchrun_reason(stderr: str) -> str:
    """Why torchrun stopped: the first exception of its traceback (the root cause, before the
    exceptions raised while handling it), else its last line."""
    for line in stderr.splitlines():
        if _EXCEPTION_LINE.match(line.strip()):
            return line.strip()[:300]
    return last_line(stderr)


def _is_timeout(reason: str) -> bool:
    return any(word in reason.lower() for word in ("timed out", "timeout"))
