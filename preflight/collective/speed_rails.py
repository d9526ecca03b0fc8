"""The speed judge rail by rail, on a rail-optimized cluster: local rank r of every host is bound to rail r
(preflight/rail_env.py), so the neighbour test's links of rail r are NIC r of one host sending to NIC r of the next.

Each rail is judged on its own by the one rule (preflight.collective.speed.judge on that rail's figures alone), against
that rail's median: a host whose rail 1 runs at a quarter of the other hosts' rail 1 is named on rail 1, and its rail 0,
at speed, clears it there; one slow on a rail only while its ranks waited for a CPU is named on that rail for CPU
contention (PF624), by the same fractions. The host's verdicts (what the report's host rows and its status take) are the worst of its
rails'; its compute and its start are the launch's, whatever the rail.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from preflight.checks.rails import rail_label
from preflight.collective.contracts import RailHost, RailSpeed
from preflight.collective.speed import RANK, Judgement, Verdict, judge
from preflight.collective.wire import ResultEvent
from preflight.records import HostRecord, Rail
from preflight.spec import Backend, BandwidthProfile, PreflightConfig


@dataclass(frozen=True)
class RailJudgement:
    """One rail's judgement: its links alone, against its own median."""

    index: int
    labels: dict[str, str]  # host -> how findings name its rail, e.g. rail 1 (eth2 / mlx5_1:1)
    interfaces: dict[str, str]  # host -> its interface on the rail
    found: Judgement


def rail_results(results: Sequence[ResultEvent], rail: int) -> list[ResultEvent]:
    """The launch's results with only the links that ranks bound to this rail sent."""
    out: list[ResultEvent] = []
    for result in results:
        mine = dict(result)
        for key in ("links", "pair_links"):
            if key in result:
                mine[key] = [link for link in result[key] if link.get("rail", 0) == rail]
        out.append(mine)  # type: ignore[arg-type]  # the same event, fewer links
    return out


def _worst(verdicts: Sequence[Verdict]) -> Verdict:
    """The worst verdict as evidence of a slow link, then by severity (a starved rail's over one at speed), and of equally
    bad ones the slowest."""
    return max(verdicts, key=lambda v: (RANK[v.name], RANK[v.severity], -(v.ratio() or 0.0)))


def judge_rails(config: PreflightConfig, backend: Backend, records: Sequence[HostRecord], results: Sequence[ResultEvent],
                profile: BandwidthProfile | None, rails: Mapping[str, Sequence[Rail]]) -> tuple[Judgement, list[RailJudgement]]:
    """The launch judged as a whole (compute, starts) and, where the hosts have rails (host -> its rails; empty: none),
    rail by rail; the whole's network verdicts are each host's and link's worst over its rails, so a host is named slow
    where one of its rails is."""
    found = judge(config, backend, records, results, profile)
    per_rail = [RailJudgement(index,
                              {h: rail_label(own[index]) for h, own in rails.items() if index < len(own)},
                              {h: own[index].interface for h, own in rails.items() if index < len(own)},
                              judge(config, backend, records, rail_results(results, index), profile))
                for index in range(max((len(own) for own in rails.values()), default=0))]
    if not per_rail:
        return found, []
    sending = {h: _worst([r.found.sending[h] for r in per_rail if h in r.found.sending]) for h in found.hosts}
    receiving = {h: _worst([r.found.receiving[h] for r in per_rail if h in r.found.receiving]) for h in found.hosts}
    links = {link: _worst([r.found.links[link] for r in per_rail if link in r.found.links]) for link in found.links}
    return replace(found, sending=sending, receiving=receiving, links=links), per_rail


def other_rails(per_rail: Sequence[RailJudgement], host: str, rail: int) -> str:
    """The host's other rails in a phrase: each one's best first figure against its own rail's median."""
    parts = []
    for other in per_rail:
        if other.index == rail or host not in other.labels:
            continue
        best = _best(other.found, host)
        reference = other.found.reference
        if best is None or not reference:
            continue
        parts.append(f"{other.labels[host]} at {best:.3g} GB/s ({best / reference:.2f}x of its peers)")
    return "; its other rails: " + ", ".join(parts) if parts else ""


def _best(found: Judgement, host: str) -> float | None:
    return max((s.gbps for s in found.table if s.repeat == 0 and host in (s.src, s.dst)), default=None)


def rails_section(per_rail: Sequence[RailJudgement], cpu_explains: Sequence[str]) -> list[RailSpeed]:
    """The report's per-rail table: per rail, its median and each host's figures and verdict on it."""
    out: list[RailSpeed] = []
    for rail in per_rail:
        found = rail.found
        slow = [h for h in found.slow_hosts() if h not in cpu_explains]
        starved = found.starved_hosts()
        hosts: list[RailHost] = []
        for h in found.hosts:
            best = _best(found, h)
            sends, receives = found.sending[h].gbps, found.receiving[h].gbps
            hosts.append({"host": h, "interface": rail.interfaces.get(h, ""),
                          "best_GBps": None if best is None else round(best, 6),
                          "ratio": None if best is None or not found.reference else round(best / found.reference, 4),
                          "send_GBps": None if sends is None else round(sends, 6),
                          "recv_GBps": None if receives is None else round(receives, 6),
                          "sending": found.sending[h].name, "receiving": found.receiving[h].name,
                          "verdict": "slow network" if h in slow else "cpu contention" if h in starved else "ok"})
        out.append({"rail": rail.index, "median_GBps": None if found.reference is None else round(found.reference, 6),
                    "hosts": hosts, "slow_hosts": slow,
                    "slow_links": [list(link) for link in found.slow_links() if not set(link) & set(cpu_explains)]})
    return out

