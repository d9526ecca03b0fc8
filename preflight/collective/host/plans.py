"""What the ranks decide from each other's figures, all alike: the sweep's sizes, the neighbour test's phases and its
repeats of suspect links, and what the gathered identities say is wrong. The speed judge uses the same rules."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, TypeVar

from preflight.collective.host.events import SWEEP_OPS

if TYPE_CHECKING:
    from preflight.collective.wire import (
        Identity,
    )


H = TypeVar("H", bound=Hashable)  # a host, by index (the ranks) or by name (the judge)
# The sizes stop growing when two doublings in a row each gained less than this (busbw of the slowest rank): the link is
# full, and bigger messages would only cost time. Three sizes at least are always measured.
PLATEAU_GAIN = 0.05
# Nor do they grow past a size whose one iteration took the slowest rank this many times the size's time budget (1 s at
# the default 0.05 s): the next doubling would take twice as long an iteration, through a link far below what the larger
# sizes are there to measure (a 40 Mbit/s host made one sweep of 6 hosts last a minute), and the figure at this size
# already says how slow it is.
LONGEST_STEP_BUDGETS = 20
# A link of the neighbour test sends at most this many messages (1 GB at gloo's 1 MiB): a budget far above the default's.
NEIGHBOUR_MAX_MESSAGES = 1000


def plateaued(busbw: Sequence[float]) -> bool:
    """Whether a sweep whose busbw per size (ascending) is busbw has stopped gaining."""
    if len(busbw) < 3:
        return False
    return busbw[-1] < busbw[-2] * (1 + PLATEAU_GAIN) and busbw[-2] < busbw[-3] * (1 + PLATEAU_GAIN)


def sweep_bytes(op: str, size_bytes: int, world_size: int) -> int:
    """The bytes a sweep step really moves: size rounded down so that every rank's share is whole float32 elements."""
    if op not in SWEEP_OPS:
        raise ValueError(f"the sweep runs {', '.join(SWEEP_OPS)}, not {op!r}")
    unit = 4 * world_size
    return size_bytes // unit * unit


def neighbour_phases(count: int) -> list[list[tuple[int, int]]]:
    """The neighbour test's ring between count hosts (indices in rank order), in phases, as NCCL's ring diagnostics:
    each host sends to its ring neighbour (i -> i+1), even to odd, then odd to even, and the ring's closing link on its
    own when the count is odd, so that the links of a phase run at once without sharing a host. Every host has two
    partners (one with two hosts); the suspects are then measured again (repeat_plan)."""
    return lay_out([(i, (i + 1) % count) for i in range(count)])


def lay_out(links: Sequence[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Links laid into phases greedily in their order, no host in two links of a phase."""
    phases: list[list[tuple[int, int]]] = []
    busy: list[set[int]] = []
    for link in dict.fromkeys(link for link in links if link[0] != link[1]):
        free = next((k for k, used in enumerate(busy) if not used & set(link)), None)
        if free is None:
            phases.append([])
            busy.append(set())
            free = len(phases) - 1
        phases[free].append(link)
        busy[free].update(link)
    return phases


def pair_round_phases(rounds: Sequence[Sequence[tuple[int, int]]]) -> list[list[tuple[int, int]]]:
    """The pairwise stage's rounds (disjoint pairs of host indices each) as phases of the neighbour test: each round's
    pairs one way at once (a -> b), then the other way (b -> a), so that a pair's two directions are timed apart and
    its slower one is its figure."""
    return [phase for pairs in rounds for phase in lay_out([*pairs, *((b, a) for a, b in pairs)])]


def next_chunk(budget_s: float, elapsed_s: float, sent: int) -> int:
    """How many messages a link of the neighbour test sends next, after sent messages in elapsed_s: one to start with;
    none once the budget is spent (when less than half a message's time is left) or NEIGHBOUR_MAX_MESSAGES were sent;
    else as many as the rate so far fits in what is left, but at most as many as were sent already, so that an early
    message timed too fast (a socket buffer taking it whole) at most doubles the time before the rate is measured again."""
    if sent == 0:
        return 1
    per_message = elapsed_s / sent
    left = budget_s - elapsed_s
    if sent >= NEIGHBOUR_MAX_MESSAGES or left < per_message / 2:
        return 0
    return max(1, min(sent, round(left / per_message) if per_message > 0 else sent, NEIGHBOUR_MAX_MESSAGES - sent))


def peers_median(measured: Sequence[tuple[Hashable, Hashable, float]]) -> float:
    """The yardstick of the neighbour test: the median over hosts of each host's best link (sending or receiving), so
    that a slow host, which takes part in two of a 4-host ring's four links, does not drag it down with it. 0 for no
    links."""
    best: dict[Hashable, float] = {}
    for src, dst, rate in measured:
        best[src], best[dst] = max(rate, best.get(src, 0.0)), max(rate, best.get(dst, 0.0))
    ordered = sorted(best.values())
    return (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) / 2 if ordered else 0.0


def repeat_plan(count: int, measured: Sequence[tuple[int, int, float]], suspect_fraction: float, repeats: int
                ) -> list[list[tuple[int, int, str]]]:
    """The neighbour test's repeats, when anything is a suspect: per repeat, a whole ring shifted to other partners
    (host i sends to i + shift, a shift of 2, 3, ... so that each host sends to and receives from hosts it has not met
    in the ring), each link tagged "round"; and every suspect link measured again, tagged "link". A host's sending is a
    suspect when its best link sending (of those measured: the ring and any pair rounds) is under suspect_fraction of
    the peers' median (peers_median), its receiving likewise; a link, when it is under that (and not in the round
    already). Every host is measured in every repeat, so each repeat has its own yardstick, measured at the same moment
    as the suspects' figures (repeat_ratios). A host that sends slowly is slow again with every receiver; a neighbour
    that only received from it is fast with its other senders. No suspect: no repeat. Every rank computes the same plan
    from the same gathered figures."""
    if not measured or repeats < 1 or count < 2:
        return []
    # A link measured twice (the ring's and a pair round's) and fast once is no suspect: its best figure is judged.
    sends, receives, links = suspects(measured, suspect_fraction)
    suspect_links = sorted(links)
    if not (sends or receives or links):
        return []
    # Shifts 2, 3, ..., count - 1, then 1 (the ring's own): new partners first, as many as there are.
    shifts = [*range(2, count), 1]
    plan: list[list[tuple[int, int, str]]] = []
    for r in range(repeats):
        ring = [(i, (i + shifts[r % len(shifts)]) % count) for i in range(count)]
        plan.append([*((a, b, "round") for a, b in dict.fromkeys(ring)), *((a, b, "link") for a, b in suspect_links if (a, b) not in ring)])
    return plan


def rails_plan(count: int, measured: Mapping[int, Sequence[tuple[int, int, float]]], suspect_fraction: float, repeats: int
               ) -> list[list[tuple[int, int, str]]]:
    """The repeats of a launch whose ranks are bound to rails, per rail its figures (rail -> (src, dst, GB/s)): each rail's
    suspects are its own (repeat_plan on its figures, against its own median), and a repeat measures every rail's at once,
    each rank on its own rail, so the repeat's links are the union of the rails' (a shifted ring is the same on every rail)."""
    plans = [repeat_plan(count, figures, suspect_fraction, repeats) for figures in measured.values()]
    merged: list[list[tuple[int, int, str]]] = []
    for r in range(max((len(plan) for plan in plans), default=0)):
        merged.append(list(dict.fromkeys(link for plan in plans if r < len(plan) for link in plan[r])))
    return merged


def _median(values: Sequence[float]) -> float | None:
    ordered = sorted(values)
    return (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) / 2 if ordered else None


def suspects(measured: Sequence[tuple[H, H, float]], suspect_fraction: float) -> tuple[set[H], set[H], set[tuple[H, H]]]:
    """The suspects of the first figures: the hosts whose best link sending is under suspect_fraction of the peers'
    median, those whose best link receiving is, and the links whose best figure is."""
    line = suspect_fraction * peers_median(measured)
    sending: dict[H, float] = {}
    receiving: dict[H, float] = {}
    fastest: dict[tuple[H, H], float] = {}
    for src, dst, rate in measured:
        sending[src], receiving[dst] = max(rate, sending.get(src, 0.0)), max(rate, receiving.get(dst, 0.0))
        fastest[(src, dst)] = max(rate, fastest.get((src, dst), 0.0))
    return ({h for h, rate in sending.items() if rate < line}, {h for h, rate in receiving.items() if rate < line},
            {link for link, rate in fastest.items() if rate < line})


def _round_yard(again: Sequence[tuple[H, H, int, str, float]], yardstick: Callable[[H, H], bool]) -> float | None:
    """A repeat's round yardstick: the median of its round's figures whose link may be one (yardstick). Where none may
    (four hosts, two of them slow), the median of the hosts' best figures in the round (peers_median): a host slow one
    way is fast the other."""
    ring = [(src, dst, rate) for src, dst, _, of, rate in again if of == "round"]
    clear = [rate for src, dst, rate in ring if yardstick(src, dst)]
    return _median(clear) if clear else peers_median(ring) or None


def steadily_slow(measured: Sequence[tuple[H, H, float]], repeats: Sequence[Sequence[tuple[H, H, int, str, float]]],
                  suspect_fraction: float) -> tuple[set[H], set[H]]:
    """The suspects' ways slow in every figure of theirs in these repeats, each against its repeat's round (the median of
    the hosts' best figures in it, peers_median): the hosts that send slowly throughout, and those that receive slowly
    throughout. Such a way is no yardstick for the figures beside it (repeat_ratios): two slow hosts measured in one phase
    would otherwise clear each other. A host slow only in some phases (a loaded moment, a slow partner) stays one."""
    sends, receives, _ = suspects(measured, suspect_fraction)
    sending: dict[H, list[float]] = {}
    receiving: dict[H, list[float]] = {}
    for again in repeats:
        # The hosts' best figures in the round, as the first figures' yardstick: a host slow one way is fast the other.
        yard = peers_median([(src, dst, rate) for src, dst, _, of, rate in again if of == "round"])
        if not yard:
            continue
        for src, dst, _, _, rate in again:
            if src in sends:
                sending.setdefault(src, []).append(rate / yard)
            if dst in receives:
                receiving.setdefault(dst, []).append(rate / yard)
    return ({h for h, ratios in sending.items() if all(r < suspect_fraction for r in ratios)},
            {h for h, ratios in receiving.items() if all(r < suspect_fraction for r in ratios)})


def repeat_ratios(measured: Sequence[tuple[H, H, float]], again: Sequence[tuple[H, H, int, str, float]],
                  suspect_fraction: float, steady: tuple[set[H], set[H]] | None = None) -> list[float | None]:
    """Each figure of one repeat, (src, dst, phase, "round" or "link", GB/s), as a ratio of what it is judged against:
    the lower of the median of the repeat's round (its shifted ring) and the median of the other links of its own phase,
    both without the links of a host suspect both ways (with four hosts, half a round's links would be a slow host's
    own), nor those of a way slow throughout the launch's repeats (steady: steadily_slow's sending and receiving). Both
    were measured beside the figure, the phase to the same tenth of a second: on a shared machine the same link varies
    tenfold from one second to the next, and a loaded moment slows every link of a phase alike; so a figure is slow only
    where it is slow beside its round and beside its phase. A phase whose other links are all such ways gives no
    yardstick: a host that sends slowly in every repeat, beside one that receives slowly in every repeat, is no loaded
    moment. None: nothing to judge it against."""
    sends, receives, _ = suspects(measured, suspect_fraction)
    both = sends & receives
    slow_sends, slow_receives = steady or (set(), set())

    def yardstick(src: H, dst: H) -> bool:  # a link that may measure the others: no end excluded above
        return src not in both and dst not in both and src not in slow_sends and dst not in slow_receives

    round_yard = _round_yard(again, yardstick)
    out: list[float | None] = []
    for k, (_, _, phase, _, rate) in enumerate(again):
        mates = _median([r for j, (src, dst, p, _, r) in enumerate(again) if j != k and p == phase and yardstick(src, dst)])
        yards = [y for y in (round_yard, mates) if y]
        out.append(rate / min(yards) if yards else None)
    return out


def settled(measured: Sequence[tuple[int, int, float]], again: Sequence[tuple[int, int, int, str, float]], suspect_fraction: float,
            earlier: Sequence[Sequence[tuple[int, int, int, str, float]]] = ()) -> bool:
    """Whether a repeat left nothing to measure again: no suspect of the first figures (a host's sending, its receiving,
    a link) was under suspect_fraction in it (repeat_ratios, as the judge takes them, with the ways slow throughout
    this repeat and the earlier ones). A suspect back at speed once is noise whatever later repeats say, as a deficit
    must hold in every repeat: so the repeats stop there."""
    sends, receives, links = suspects(measured, suspect_fraction)
    steady = steadily_slow(measured, [*earlier, again], suspect_fraction)
    ratios = repeat_ratios(measured, again, suspect_fraction, steady)  # one a figure of again, in its order (no zip(strict=) in 3.8)
    for i, (src, dst, _, of, _) in enumerate(again):
        ratio = ratios[i]
        slow = ratio is not None and ratio < suspect_fraction
        if slow and ((of == "round" and (src in sends or dst in receives)) or (src, dst) in links):
            return False
    return True


def counts(ratio: float, wait: float | None, suspect_fraction: float, starved_fraction: float) -> bool:
    """Whether a repeat's figure (its ratio, repeat_ratios; the share of it its ranks waited for a CPU, None: unknown) is
    evidence of its link's speed: not when it was slow while its ranks waited starved_fraction or more, as it measured
    that wait. A fast figure counts, starved or not: a wait only ever slows a sample."""
    return not (ratio < suspect_fraction and wait is not None and wait >= starved_fraction)


def excused(figures: Sequence[tuple[H, H, float, float | None]], sends: set[H], receives: set[H], suspect_fraction: float,
            starved_fraction: float) -> tuple[list[bool], list[bool]]:
    """Which of a launch's repeat round figures (src, dst, ratio, CPU wait) are no evidence of their sender's sending,
    and which none of their receiver's receiving: those whose other end is itself slow that way. A receiver is slow
    receiving when its receiving was a suspect in the first figures (sends, receives: suspects) and every figure of it
    that counts from senders that were no suspects themselves is under suspect_fraction (one at least); a sender alike.
    A healthy host whose ring neighbour receives slowly sends to it slowly in every repeat whose shift comes back to it:
    that figure is its neighbour's, not its own. Only partners that were no suspects the same way testify, so neither
    the figure's own other end nor another slow host's figures excuse anything."""
    def slow(host: H, end: int, own: set[H], others: set[H]) -> bool:
        if host not in own:
            return False
        mine = [figure[2] for figure in figures if figure[end] == host and figure[1 - end] not in others
                and counts(figure[2], figure[3], suspect_fraction, starved_fraction)]
        return bool(mine) and all(ratio < suspect_fraction for ratio in mine)

    slow_receiving = {h: slow(h, 1, receives, sends) for h in {dst for _, dst, _, _ in figures}}
    slow_sending = {h: slow(h, 0, sends, receives) for h in {src for src, _, _, _ in figures}}
    return [slow_receiving[dst] for _, dst, _, _ in figures], [slow_sending[src] for src, _, _, _ in figures]


def unresolved(measured: Sequence[tuple[int, int, float]], repeats: Sequence[Sequence[tuple[int, int, int, str, float, float | None]]],
               suspect_fraction: float, starved_fraction: float, wanted: int) -> bool:
    """Whether some suspect of the first figures (a host's sending, its receiving, a link) still lacks evidence after
    these repeats (each its figures, (src, dst, phase, tag, GB/s, the share of the sample its ranks waited for a CPU;
    None: unknown)): it was never at speed, and fewer than wanted of its figures count (counts; a host's figure that its
    other end's own slowness explains, excused, is not its evidence). The judge leaves such samples out
    (speed.judge_ratios), so a suspect is measured again until wanted of its figures count: a host whose CPUs another
    process holds stays starved, a passing contention clears, and a host is never failed on one sample that counted
    while the others measured a wait. A suspect with no figure judged against a yardstick is left as it is: another
    repeat would have none either."""
    sends, receives, links = suspects(measured, suspect_fraction)
    rounds: list[tuple[int, int, float, float | None]] = []
    linked: list[tuple[int, int, float, float | None]] = []
    steady = steadily_slow(measured, [[figure[:5] for figure in figures] for figures in repeats], suspect_fraction)
    for figures in repeats:
        ratios = repeat_ratios(measured, [figure[:5] for figure in figures], suspect_fraction, steady)
        for i, (src, dst, _, of, _, wait) in enumerate(figures):
            ratio = ratios[i]
            if ratio is not None:
                (rounds if of == "round" else linked).append((src, dst, ratio, wait))
    by_sender, by_receiver = excused(rounds, sends, receives, suspect_fraction, starved_fraction)
    # Each figure, and the suspects it is evidence of: its link; a round's, its sender's sending and its receiver's
    # receiving too, unless the other end explains it (by index: the ranks' python may be 3.8, without zip(strict=)).
    tagged: list[tuple[tuple[int, int, float, float | None], list[tuple[str, object]]]] = [(figure, []) for figure in linked]
    for k, (src, dst, ratio, wait) in enumerate(rounds):
        ways: list[tuple[str, object]] = []
        if src in sends and not by_sender[k]:
            ways.append(("src", src))
        if dst in receives and not by_receiver[k]:
            ways.append(("dst", dst))
        tagged.append(((src, dst, ratio, wait), ways))
    evidence: dict[tuple[str, object], list[float]] = {}  # a suspect, and the ratios of its figures that count
    for (src, dst, ratio, wait), ways in tagged:
        for suspect in [("link", (src, dst))] * ((src, dst) in links) + ways:
            evidence.setdefault(suspect, [])
            if counts(ratio, wait, suspect_fraction, starved_fraction):
                evidence[suspect].append(ratio)
    return any(len(ratios) < wanted and all(r < suspect_fraction for r in ratios) for ratios in evidence.values())


def identity_problems(identity: Sequence[Identity]) -> list[str]:
    """What the gathered identities say is wrong: one GPU used by two ranks, torch or NCCL versions that differ."""
    problems = []
    by_gpu: dict[str, list[Identity]] = {}
    for who in identity:
        if who["gpu_uuid"]:
            by_gpu.setdefault(who["gpu_uuid"], []).append(who)
    # GPU UUIDs are unique worldwide, so one UUID under two cluster host names is one machine listed twice.
    for uuid, ranks in sorted(by_gpu.items()):
        if len(ranks) > 1:
            problems.append(f"GPU {uuid} is used by ranks {_rank_list(ranks)} on {', '.join(_host_list(ranks))}: "
                            "each rank needs its own GPU (LOCAL_RANK must pick the CUDA device)")
    keys: tuple[tuple[Literal["torch", "nccl"], str], ...] = (("torch", "torch"), ("nccl", "NCCL"))
    for key, name in keys:
        by_version: dict[str, list[Identity]] = {}
        for who in identity:
            version = who[key]
            if version is not None:
                by_version.setdefault(version, []).append(who)
        if len(by_version) > 1:
            listed = "; ".join(f"{version} on {_host_summary(ranks)}" for version, ranks in sorted(by_version.items()))
            problems.append(f"{name} versions differ between ranks: {listed}")
    return problems


def _rank_list(ranks: Sequence[Identity]) -> list[int]:
    return sorted(who["rank"] for who in ranks)


def _host_list(ranks: Sequence[Identity]) -> list[str]:
    return sorted({who["host"] for who in ranks})


def _host_summary(ranks: Sequence[Identity], shown: int = 5) -> str:
    hosts = _host_list(ranks)
    more = f" and {len(hosts) - shown} more" if len(hosts) > shown else ""
    return ", ".join(hosts[:shown]) + more
