"""The pairwise stage: which host, or which link between two hosts, is slow.

A collective over every host runs at the pace of its slowest link, and every rank waits alike, so the sweep cannot say
where the slow part is. Here hosts are measured two at a time, many pairs at once.

**In the full set's launch** (the playbook's collective, once torch is up on every host): the first rounds of a
round-robin (the circle method, ``circle_rounds``: round 1 pairs neighbours h1-h2, h3-h4, ..., every later round gives
each host a partner it has not had), ``IN_LAUNCH_ROUNDS`` of them at most, run as phases of the neighbour test
(``worker.pair_round_phases``): a round's pairs all at once one way (a -> b), then the other (b -> a), each phase a
point-to-point send for about ``collective.neighbour_time_s``. A pair's figure is the slower of its two directions
(its slowest rank's GB/s); a pair with a direction missing counts as 0 GB/s, as a failed pair. No launch of its own:
the stage then judges those rounds as a round-robin (below), and launches only to measure a slow link once more (the
pairs of that round in one launch of their hosts, the same point-to-point test, so its figures compare).

**On its own launches**, where the full set's launch measured no pairs (``collective.neighbour_time_s`` 0): each
round's pairs as launches of two hosts at once on distinct ports, each the all_gather of its two hosts at one large
size (``collective.pairwise_bytes``, the sweep's largest by default), so the figure (nccl-tests' busbw) is the pair's
point-to-point bandwidth, both ways at once:

- **Round 1**: disjoint pairs (h1-h2, h3-h4, ...). An odd host out is a suspect until round 2.
- **Suspects**: the median and MAD of the round's pairs (``preflight.spread``) name the slow pairs; both
  hosts of each are suspects.
- **Round 2**: each suspect with a distinct known-good host (the fastest pairs' hosts first), all at once. More
  suspects than good hosts take a round 3 (more than half the pairs slow is beyond what a median can judge anyway).

With fewer than 6 hosts round 1 has under three pairs, too few for a median to name one, so the stage runs rounds of
the round-robin instead (3 hosts 3 rounds, 4 hosts 2, 5 hosts 3), which gives every host two or more distinct
partners. Two hosts make one pair, reported and never judged: there is nothing to compare it with.

A host's figure is its best pair, the fastest it ran with any partner: a healthy host has at least one healthy
partner, a slow host is slow with every partner. A **slow host** (PF607) is, in the re-pair mode, a suspect that was
slow again with its known-good partner (every pair it ran below the threshold of round 1's pairs), and in the
round-robin an outlier of the hosts' best pairs (there, a slow host's pairs can be half of all, too many for the pairs'
threshold). A host that was never a suspect is never named: one noisy pair beside a fast one does not make it slow. A
**slow link** (PF608) is a pair below the pairs' threshold (over round 1's pairs, or every pair in a round-robin) whose
hosts are both fast with other partners, and that is slow again when measured once more (one more round: a moment of
noise, another job's burst, is not a link). A pair whose launch did not pass counts as 0 GB/s. In the full set's
launch a healthy cluster and a slow host take no launch of the stage's own, a slow link one; on its own launches, from
6 hosts, whatever N, a slow host is named in two rounds and a slow link in three, each round the time of one launch of
two hosts on a real cluster, and a healthy cluster takes one round (two when N is odd).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import islice
from typing import Literal

from preflight.collective.contracts import PAIRWISE, PairFigure, PairwiseHost, PairwiseSection, RunStatus
from preflight.collective.run import Collective, SweepPlan, no_sweep, sweep_sizes
from preflight.findings import CLUSTER, Finding, Status
from preflight.spec import Backend, PreflightConfig, split_port
from preflight.spread import Outliers, outliers

RE_PAIR_FROM = 6  # hosts: three pairs in round 1, enough for a median to name a slow one
PAIRWISE_OP = "all_gather"  # the stage's own launches
PAIR_ROUND_OP = "sendrecv"  # the rounds in a launch: point-to-point, each way in turn (nccl-tests' name for it)
# Round-robin rounds measured in the full set's launch: each host meets this many partners (every other host up to 6
# hosts), enough that a slow host is slow with all of them while a healthy host has a fast one among them. Each round is
# two phases of collective.neighbour_time_s (plus a message each way through a slow link) on torch already up: the cap,
# not the number of hosts, bounds what the rounds add to the launch (10 phases, 1.5 s of sends at the default 0.15 s).
IN_LAUNCH_ROUNDS = 5
# A pair's launch: its status, its busbw in GB/s (0 when it did not pass) and why it did not pass.
Measured = tuple[RunStatus, float, str]
Measure = Callable[[list[tuple[str, str]]], list[Measured]]


@dataclass(frozen=True)
class Pair:
    """One pair's run."""

    hosts: tuple[str, str]
    round: int
    status: RunStatus
    gbps: float
    message: str


@dataclass(frozen=True)
class Localized:
    """What the rounds found."""

    hosts: list[str]
    mode: Literal["re-pair", "round-robin"]
    rounds: int
    pairs: list[Pair]
    pair_stats: Outliers
    best: dict[str, float]  # each host in a pair: its fastest pair
    host_stats: Outliers
    slow_hosts: list[str]
    slow_links: list[Pair]  # as first measured; slow again when measured once more
    transient: list[Pair]  # slow once, not when measured again

    def slow_pair(self, pair: Pair) -> bool:
        """Whether the pair is below the pairs' threshold."""
        return self.pair_stats.below(pair.gbps)


def circle_rounds(hosts: Sequence[str]) -> Iterator[list[tuple[str, str]]]:
    """The rounds of a round-robin (the circle method): round 1 pairs neighbours (h1-h2, h3-h4, ...), and every later
    round gives each host a partner it has not had. With an odd count one host sits each round out."""
    players: list[str | None] = [*hosts, *([None] if len(hosts) % 2 else [])]
    circle = players[0::2] + players[1::2][::-1]
    order = {h: i for i, h in enumerate(hosts)}
    for shift in range(len(circle) - 1):
        rest = circle[1:]
        turned = [circle[0], *rest[len(rest) - shift:], *rest[:len(rest) - shift]]
        pairs = [(turned[i], turned[-1 - i]) for i in range(len(turned) // 2)]
        yield [(a, b) if order[a] < order[b] else (b, a) for a, b in pairs if a is not None and b is not None]


def localize(hosts: Sequence[str], measure: Measure, k: float, fraction: float, rounds: int | None = None) -> Localized:
    """Run the rounds through measure (one call a round, every pair of it at once) and name the slow hosts and links.
    rounds: a round-robin of that many rounds whatever the number of hosts (those the full set's launch measured);
    None: the re-pair mode from RE_PAIR_FROM hosts, a round-robin below."""
    pairs: list[Pair] = []

    def run_round(round_pairs: list[tuple[str, str]]) -> None:
        number = 1 + max((p.round for p in pairs), default=0)
        for hosts_, (status, gbps, message) in zip(round_pairs, measure(round_pairs), strict=True):
            pairs.append(Pair(hosts_, number, status, gbps, message))

    def stats(of: Sequence[Pair]) -> Outliers:
        return outliers({f"{p.hosts[0]}-{p.hosts[1]}": p.gbps for p in of}, k, fraction)

    mode: Literal["re-pair", "round-robin"]
    repaired: set[str] = set()  # re-pair mode: the suspects measured again with a known-good partner
    if rounds is not None or len(hosts) < RE_PAIR_FROM:
        mode = "round-robin"
        for round_pairs in islice(circle_rounds(hosts), rounds if rounds is not None else {2: 1, 4: 2}.get(len(hosts), 3)):
            run_round(round_pairs)
        pair_stats = stats(pairs)
    else:
        mode = "re-pair"
        run_round(next(circle_rounds(hosts)))
        pair_stats = stats(pairs)
        slow = {h for p in pairs if pair_stats.below(p.gbps) for h in p.hosts}
        tested = {h for p in pairs for h in p.hosts}
        suspects = [h for h in hosts if h in slow or h not in tested]
        good = [h for p in sorted(pairs, key=lambda p: -p.gbps) if not pair_stats.below(p.gbps) for h in p.hosts]
        order = {h: i for i, h in enumerate(hosts)}
        while suspects and good:
            batch, suspects = suspects[:len(good)], suspects[len(good):]
            repaired.update(batch)
            run_round([(s, g) if order[s] < order[g] else (g, s) for s, g in zip(batch, good, strict=False)])
    best, host_stats, slow_hosts, pending = judge_partners(hosts, pairs, pair_stats, k, fraction)
    if mode == "re-pair":
        # Slow with a known-good partner, as with its first: only a suspect re-paired can be named. The hosts' best pairs
        # are no yardstick here: a re-paired host's is the better of two runs, an unsuspected host's its only one.
        slow_hosts = [h for h in hosts if h in repaired and all(pair_stats.below(p.gbps) for p in pairs if h in p.hosts)]
        pending = [p for p in pairs if pair_stats.below(p.gbps) and not set(p.hosts) & set(slow_hosts)]
    # A slow pair of two hosts fast with other partners: the link, or a moment of noise. Measured once more (pairs with
    # no host in common at once), it is a slow link only when slow again.
    links: list[Pair] = []
    transient: list[Pair] = []
    while pending:
        again_now: list[Pair] = []
        for pair in pending:
            if not any(set(pair.hosts) & set(other.hosts) for other in again_now):
                again_now.append(pair)
        pending = [p for p in pending if p not in again_now]
        run_round([p.hosts for p in again_now])
        for first, again in zip(again_now, pairs[-len(again_now):], strict=True):
            (links if pair_stats.below(again.gbps) else transient).append(first)
    return Localized(list(hosts), mode, max((p.round for p in pairs), default=0), pairs, pair_stats, best, host_stats, slow_hosts,
                     links, transient)


def judge_partners(hosts: Sequence[str], pairs: Sequence[Pair], pair_stats: Outliers, k: float, fraction: float
                   ) -> tuple[dict[str, float], Outliers, list[str], list[Pair]]:
    """Hosts measured with two or more partners each (a round-robin, or the neighbour test's ring and re-test): each
    host's best pair, the statistics of those, the slow hosts (an outlier best: slow with every partner, among hosts
    fast with theirs) and the suspect links (below the pairs' threshold, between two hosts not slow)."""
    best: dict[str, float] = {}
    for pair in pairs:
        for host in pair.hosts:
            best[host] = max(pair.gbps, best.get(host, 0.0))
    host_stats = outliers({h: best[h] for h in hosts if h in best}, k, fraction)
    slow_hosts = [h for h in hosts if h in host_stats.outliers]
    suspects = [p for p in pairs if pair_stats.below(p.gbps) and not set(p.hosts) & set(slow_hosts)]
    return best, host_stats, slow_hosts, suspects


def in_launch_plan(config: PreflightConfig, backend: Backend, hosts: Sequence[str], sweep: SweepPlan | None) -> SweepPlan | None:
    """The full set's launch plan: with the pairwise stage in the playbook, the first IN_LAUNCH_ROUNDS rounds of the
    round-robin ride on it (the configured sweep's plan, or one without sizes when the playbook has no sweep)."""
    if PAIRWISE not in config.playbook.stages or len(hosts) < 2 or config.collective.neighbour_time_s <= 0:
        return sweep
    plan = sweep or no_sweep(config, backend)
    return replace(plan, pair_rounds=list(islice(circle_rounds(hosts), IN_LAUNCH_ROUNDS)))


def _all_gather_pairs(config: PreflightConfig, collective: Collective, port: int, size: int) -> Measure:
    """Each pair its own launch of two hosts, all at once on ports split_port(port, 0), (port, 1), ...: the all_gather of
    the pair at one size."""
    plan = SweepPlan(sizes=[size], ops=[PAIRWISE_OP], warmup=1, iters=config.collective.pairwise_iters)

    def measure(pairs: list[tuple[str, str]]) -> list[Measured]:
        collective.activity.now("pairwise", f"{len(pairs)} pair(s) of hosts at once", sweep=True)
        outcomes = collective.run([(list(pair), split_port(port, i)) for i, pair in enumerate(pairs)], sweep=plan, derived=True)
        measured: list[Measured] = []
        for outcome in outcomes:
            rates = [float(row["busbw_GBps"]) for result in outcome.results for row in result["sweep"]
                     if row["op"] == PAIRWISE_OP and row["bytes"] == size]
            if outcome.status == "pass" and rates:
                measured.append(("pass", min(rates), ""))
            else:
                measured.append((outcome.status, 0.0, outcome.message or "no bandwidth measured"))
        return measured

    return measure


def run_pairwise(config: PreflightConfig, collective: Collective, hosts: Sequence[str], port: int,
                 cpu_bound: Collection[str] = ()) -> tuple[list[Finding], PairwiseSection]:
    """The stage on launches of its own (ports split_port(port, 0), (port, 1), ... of each pair's first host), where the
    full set's launch carried no neighbour test (collective.neighbour_time_s 0); its rounds otherwise ride on that launch
    and the speed judge names what they find (preflight.collective.speed). Findings (PF607, PF608) and the report's
    section. cpu_bound: hosts whose slow pairs are their CPU's (pairwise_findings)."""
    began = time.monotonic()
    c = config.collective
    size = c.pairwise_bytes or max(sweep_sizes(config, collective.backend))
    found = localize(hosts, _all_gather_pairs(config, collective, port, size), c.outlier_mad_k, c.outlier_fraction)
    section = _section(found, PAIRWISE_OP, size, time.monotonic() - began)
    return pairwise_findings(found, size, cpu_bound), section


def _section(found: Localized, op: str, size: int, elapsed_s: float) -> PairwiseSection:
    pairs: list[PairFigure] = [{"hosts": list(p.hosts), "round": p.round, "status": p.status, "busbw_GBps": round(p.gbps, 6),
                                "outlier": found.slow_pair(p), "message": p.message} for p in found.pairs]
    hosts: list[PairwiseHost] = []
    for host in found.hosts:
        count = sum(host in p.hosts for p in found.pairs)
        if host not in found.best:
            hosts.append({"host": host, "pairs": count, "best_GBps": None, "verdict": "untested"})
            continue
        hosts.append({"host": host, "pairs": count, "best_GBps": round(found.best[host], 6),
                      "verdict": "slow" if host in found.slow_hosts else "ok"})
    failed = bool(found.slow_hosts or found.slow_links)
    return {"status": "fail" if failed else "pass", "message": _summary(found), "mode": found.mode, "op": op, "bytes": size,
            "rounds": found.rounds, "pairs": pairs, "pair_spread": found.pair_stats.summary(),
            "hosts": hosts, "host_spread": found.host_stats.summary(), "slow_hosts": list(found.slow_hosts),
            "slow_links": [list(p.hosts) for p in found.slow_links], "elapsed_s": round(elapsed_s, 3)}


def skipped(why: str) -> PairwiseSection:
    """The section of a pairwise stage that did not run."""
    empty = outliers({}, 0.0, 0.0).summary()
    return {"status": "skipped", "message": why, "mode": "re-pair", "op": PAIRWISE_OP, "bytes": 0, "rounds": 0, "pairs": [],
            "pair_spread": empty, "hosts": [], "host_spread": empty, "slow_hosts": [], "slow_links": [], "elapsed_s": 0.0}


def _gbps(value: float | None) -> str:
    # None only where a set had too few figures for statistics, and such a set has no outliers to phrase.
    return "unknown" if value is None else f"{value:.3g} GB/s"


def _summary(found: Localized) -> str:
    median = found.pair_stats.median
    where = f"{len(found.pairs)} pair(s) in {found.rounds} round(s) ({found.mode})"
    if median is None:
        return f"{where}: nothing measured"
    parts = [f"{where}: pairs' median {_gbps(median)}"]
    if found.pair_stats.threshold is None:
        parts.append("too few pairs to name a slow one")
    if found.slow_hosts:
        parts.append("slow host(s) " + ", ".join(found.slow_hosts))
    if found.slow_links:
        parts.append("slow link(s) " + ", ".join("-".join(p.hosts) for p in found.slow_links))
    if found.transient:
        parts.append("slow once, not again (noise): " + ", ".join("-".join(p.hosts) for p in found.transient))
    if found.pair_stats.threshold is not None and not found.slow_hosts and not found.slow_links:
        parts.append("no slow host or link")
    return "; ".join(parts)


def _pair_phrase(pair: Pair, host: str | None = None) -> str:
    who = next((h for h in pair.hosts if h != host), pair.hosts[1]) if host else "-".join(pair.hosts)
    figure = _gbps(pair.gbps) if pair.status == "pass" else f"{pair.status} ({pair.message})"
    return f"{'with ' if host else ''}{who} {figure} (round {pair.round})"


def pairwise_findings(found: Localized, size: int, cpu_bound: Collection[str] = ()) -> list[Finding]:
    """PF607 for each slow host, PF608 for each slow link (both fail: the job runs at their pace), or a pass. A slow host
    in cpu_bound (on gloo, named slow at compute or start-up: PF622, PF623) is said to be slow for its CPU, and a slow
    link of such a host is a warning that says so."""
    findings = []
    host_median, host_threshold = found.host_stats.median, found.host_stats.threshold
    for host in found.slow_hosts:
        mine = [p for p in found.pairs if host in p.hosts]
        findings.append(Finding(
            "PF607", Status.fail, host,
            f"slow with every partner at {size:,} B: its best pair {_gbps(found.best[host])}, the median of the hosts' best pairs "
            f"{_gbps(host_median)} (outlier below {_gbps(host_threshold)}); " + "; ".join(_pair_phrase(p, host) for p in mine) +
            ("; on gloo its CPU moves every byte, and this host is slow at compute or start-up (PF622, PF623): its CPU, not "
             "its network"
             if host in cpu_bound else ""),
            "see `preflight explain PF607`: the host's NIC (speed, errors: ethtool -S), its CPU frequency and throttling, "
            "its PCIe link; or leave it out (launch.exclude_failed=true)"))
    pair_median, pair_threshold = found.pair_stats.median, found.pair_stats.threshold
    for pair in found.slow_links:
        runs = [p for p in found.pairs if p.hosts == pair.hosts]
        others = [f"{h} {_gbps(found.best[h])}" for h in pair.hosts]
        # On gloo a host slow at compute moves its bytes slowly on whichever pair its CPU starves most: its CPU's, a warning.
        starved = [h for h in pair.hosts if h in cpu_bound]
        findings.append(Finding(
            "PF608", Status.warn if starved else Status.fail, CLUSTER,
            f"the link {'-'.join(pair.hosts)} is slow at {size:,} B: " + ", ".join(_pair_phrase(p) for p in runs) +
            f"; the pairs' median {_gbps(pair_median)} (outlier below {_gbps(pair_threshold)}); each host is fast with other "
            f"partners ({', '.join(others)})" +
            (f"; on gloo its CPU moves every byte, and {', '.join(starved)} is slow at compute or start-up (PF622, PF623): "
             "likely its CPU, not the link" if starved else ""),
            "see `preflight explain PF608`: the path between the two hosts (switch port, cable, route, a rate limit)"))
    if not findings:
        findings.append(Finding("PF607", Status.passed, CLUSTER, "pairwise: " + _summary(found)))
    return findings
