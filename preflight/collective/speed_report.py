"""The speed judge's judgement in words and in the report: its findings (PF620-PF624, PF607 and PF608 in the pairwise
playbook, the history's PF613 for what it did not name), the speed section, the pairwise section of the rounds the launch
carried, and what this run could resolve (preflight.collective.speed has the rule)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from preflight.collective.contracts import (
    BaselineSection,
    ComputeHost,
    LinkFigure,
    NeighbourHost,
    NoiseSummary,
    PairFigure,
    PairwiseHost,
    PairwiseSection,
    Reference,
    SpeedSection,
    StartHost,
    SweepRow,
)
from preflight.collective.speed import RANK, Judgement, Verdict
from preflight.collective.speed_rails import RailJudgement, other_rails
from preflight.findings import CLUSTER, Finding, Status
from preflight.spec import Backend, BandwidthProfile
from preflight.spread import Spread, Stats, median, outliers

_STATUS = {"warn": Status.warn, "fail": Status.fail}
_CONTENTION_REMEDY = ("see `preflight explain PF624`: other processes compete for this host's CPUs during the test (another job "
                      "or container, more ranks than cores: top, pidstat); check it again when they are gone")


def findings(found: Judgement, backend: Backend, *, pairwise: bool, history: Sequence[Finding],
             rails: Sequence[RailJudgement] = ()) -> list[Finding]:
    """The judgement's findings: slow hosts (PF620, or PF607 with the pairwise stage's rounds), slow links (PF621 or
    PF608), hosts slow only while starved of CPU (PF624), each on its rail where the hosts have rails (speed_rails), slow
    compute (PF622), slow starts (PF623), and the history's PF613 for what is not named already."""
    host_code, link_code = ("PF607", "PF608") if pairwise else ("PF620", "PF621")
    out: list[Finding] = _rail_findings(found, rails, host_code, link_code) if rails else []
    for host in [] if rails else found.slow_hosts():
        out.append(Finding(host_code, _STATUS[found.network(host)], host, "slow network: " + _host_phrase(found, host),
                           _host_remedy(host_code)))
    for a, b in [] if rails else found.slow_links():
        v = found.links[(a, b)]
        untested = [what for what, end in ((f"{a}'s sending", found.sending[a]), (f"{b}'s receiving", found.receiving[b]))
                    if end.name == "untested"]
        out.append(Finding(link_code, _STATUS[v.name], CLUSTER,
                           f"the link {a} -> {b} is slow: {_ratios(v)}, while {a} sends and {b} receives at speed "
                           "with other partners" + (f" ({', '.join(untested)} had no other partner to measure with)" if untested else ""),
                           f"see `preflight explain {link_code}`: the path between the two hosts (switch port, cable, route, "
                           "a rate limit)"))
    for host in [] if rails else found.starved_hosts():
        out.append(Finding("PF624", _STATUS[found.contention(host)], host, "CPU contention, not a slow link: "
                           + _starved_phrase(found, host), _CONTENTION_REMEDY))
    for host in found.hosts:
        status = found.compute_status(host)
        if not RANK[status]:
            continue
        why = [f"its slowest rank's matmul ran at {_flops(found.tflops[host], backend)}, the median host's "
               f"{_flops(found.compute_reference, backend)} ({_slices(found.compute[host])})"]
        waits = [w for _, w in found.compute_slices.get(host, []) if w is not None]
        if waits:
            # Where the time went: waiting is other work on its CPUs or a quota's hold; running slowly is the chip's pace.
            why.append(f"its slowest rank waited for a CPU for {min(waits):.0%}-{max(waits):.0%} of each slice")
        if host in found.below_floor:
            why.append("under the matching profile's matmul_tflops floor")
        if found.throttled.get(host, 0.0) >= found.settings.throttled_share:
            why.append(f"its CPU cgroup's quota held it back for {found.throttled[host]:.0%} of the probe (cpu.stat throttled time)")
        if host in found.cpu_explains and RANK[found.severity(host)]:
            status = max(status, found.severity(host), key=RANK.__getitem__)
            why.append(f"its links are slow too ({_host_phrase(found, host)}): on gloo the CPU moves every byte, so this is its CPU, "
                       "not its network")
        out.append(Finding("PF622", _STATUS[status], host, "slow compute: " + "; ".join(why),
                           "see `preflight explain PF622`: the host's CPU quota (cgroup cpu.max, cpu.cfs_quota_us), frequency and "
                           "throttling, other processes on it, the GPU's clocks (nvidia-smi -q -d PERFORMANCE)"))
    for host in found.stragglers:
        said = [f"torch import {found.imports[host]:.1f} s (median host {median(found.imports.values()):.1f} s)"
                if host in found.imports else "",
                f"probe {found.probes[host]:.2f} s (median host {median(found.probes.values()):.2f} s)" if host in found.probes else ""]
        out.append(Finding("PF623", Status.warn, host, "slow start: " + ", ".join(s for s in said if s),
                           "see `preflight explain PF623`: the host's CPU (quota, throttling, load), its disk (a cold or network "
                           "filesystem under the python environment)"))
    named = {f.host for f in out} | {h for link in found.slow_links() for h in link}
    for finding in history:
        # A host named here already carries its deficit with the evidence of this launch; the history adds nothing to it.
        if finding.status == Status.passed or finding.host not in named:
            out.append(finding)
    if not any(f.status != Status.passed and f.code != "PF613" for f in out):
        out.append(Finding(host_code, Status.passed, CLUSTER, "neighbours and compute: " + summary(found, backend)))
    return out


def _host_remedy(code: str) -> str:
    return (f"see `preflight explain {code}`: the host's NIC (ethtool: speed, errors), a rate limit (tc qdisc show), its switch "
            "port or cable; or leave it out (launch.exclude_failed=true)")


def _rail_findings(found: Judgement, rails: Sequence[RailJudgement], host_code: str, link_code: str) -> list[Finding]:
    """Each rail's slow hosts and links, named with the rail and the host's interface on it, against the rail's median
    and beside the host's other rails; not those whose CPU explains them (found.cpu_explains); and each host slow on a
    rail only while starved of CPU (PF624), named with the rail."""
    out: list[Finding] = []
    for rail in rails:
        median_line = f"rail {rail.index}'s median {_num(rail.found.reference)} GB/s"
        for host in rail.found.slow_hosts():
            if host in found.cpu_explains:
                continue
            out.append(Finding(host_code, _STATUS[rail.found.network(host)], host,
                               f"{rail.labels.get(host, f'rail {rail.index}')}: slow network: {_host_phrase(rail.found, host)}, "
                               f"against {median_line}{other_rails(rails, host, rail.index)}", _host_remedy(host_code)))
        for a, b in rail.found.slow_links():
            if {a, b} & set(found.cpu_explains):
                continue
            v = rail.found.links[(a, b)]
            out.append(Finding(link_code, _STATUS[v.name], CLUSTER,
                               f"rail {rail.index}: the link {a} ({rail.interfaces.get(a, '?')}) -> {b} ({rail.interfaces.get(b, '?')}) "
                               f"is slow: {_ratios(v)} against {median_line}, while {a} sends and {b} receives at speed on it with "
                               "other partners", f"see `preflight explain {link_code}`: the path between the two hosts on rail "
                               f"{rail.index} (switch port, cable, a rate limit)"))
        for host in rail.found.starved_hosts():
            out.append(Finding("PF624", _STATUS[rail.found.contention(host)], host,
                               f"{rail.labels.get(host, f'rail {rail.index}')}: CPU contention, not a slow link: "
                               f"{_starved_phrase(rail.found, host)}", _CONTENTION_REMEDY))
    return out


def _ratios(v: Verdict) -> str:
    first = f"{v.first or 0:.2f}x of its peers"
    figures = ", ".join(f"{r:.2f}x" for r in v.repeats)
    return f"{v.gbps or 0:.3g} GB/s ({first} first, then {figures} in {len(v.repeats)} repeat(s))" if v.repeats else \
        f"{v.gbps or 0:.3g} GB/s ({first}, measured once)"


def _slices(v: Verdict) -> str:
    return f"{v.first or 0:.2f}x of the median" + (f"; slices {', '.join(f'{r:.2f}x' for r in v.repeats)}" if v.repeats else "")


def _starved_phrase(found: Judgement, host: str) -> str:
    """"its sending was under 0.5x ... in each of 3 repeats, but in each the ranks ... waited for a CPU ...": the verdicts of
    a host whose only slow figures were starved, each under the fraction its severity rests on."""
    parts = []
    s = found.settings
    for way, v in (("sending", found.sending[host]), ("receiving", found.receiving[host])):
        if v.name != "starved":
            continue
        under = s.fail_fraction if v.severity == "fail" else s.suspect_fraction
        parts.append(f"its {way} was under {under:g}x of its peers in each of {len(v.repeats)} repeat(s) "
                     f"({', '.join(f'{r:.2f}x' for r in v.repeats)}), but in each the ranks moving the bytes waited for a CPU for "
                     f"{min(v.starved):.0%}-{max(v.starved):.0%} of the sample's time (starved_fraction {s.starved_fraction:g})")
    pace = (f"; under {s.fail_fraction:g}x in every repeat, a job on this host runs at that pace while the contention lasts"
            if found.contention(host) == "fail" else "")
    return "; ".join(parts) + ": those samples measured the wait, so its link speed is unknown" + pace


def _host_phrase(found: Judgement, host: str) -> str:
    """"sends at X GB/s, receives at Y GB/s", each with the evidence of its verdict."""
    parts = []
    for way, v in (("sends", found.sending[host]), ("receives", found.receiving[host])):
        ratio = v.ratio()
        if ratio is None or v.gbps is None:
            continue
        aside = (f", {len(v.starved)} of them while starved of CPU: too few measured with their CPUs" if v.pooled
                 else f"; {len(v.starved)} more starved of CPU, left out" if v.starved else "")
        if v.excused:
            aside += f"; left out with {', '.join(v.excused)}, slow the other way itself"
        evidence = {"fail": f"under {found.settings.fail_fraction:g}x in each of {len(v.repeats)} repeats{aside}",
                    "warn": f"under {found.settings.suspect_fraction:g}x in each of {len(v.repeats)} repeats{aside}",
                    "noise": "slow once, not again", "untested": "slow once, no other partner to measure with",
                    "starved": "slow only while its ranks waited for a CPU"}.get(v.name, "at speed")
        parts.append(f"{way} at {v.gbps:.3g} GB/s ({ratio:.2f}x of its peers, {evidence}"
                     + (f": {', '.join(f'{r:.2f}x' for r in v.repeats)}" if v.repeats and v.name != "ok" else "") + ")")
    return ", ".join(parts)


def noise(found: Judgement) -> NoiseSummary:
    """What this run could resolve: the spread of the figures of hosts and links not named (the check's own noise), and
    the suspects that did not repeat."""
    named_hosts = set(found.slow_hosts()) | set(found.cpu_explains) | set(found.starved_hosts())
    slow_links = set(found.slow_links())
    healthy = [r for s in found.table if s.src not in named_hosts and s.dst not in named_hosts and (s.src, s.dst) not in slow_links
               and (r := found.ratio_of(s)) is not None]
    cleared = [f"{h} {way}" for h in found.hosts for way, v in (("sending", found.sending[h]), ("receiving", found.receiving[h]))
               if v.name == "noise"] + [f"{a}->{b}" for (a, b), v in found.links.items() if v.name == "noise"]
    low, high = (min(healthy), max(healthy)) if healthy else (None, None)
    spread = median(abs(math.log(max(r, 1e-9))) for r in healthy) if healthy else None
    s = found.settings
    message = (f"a host's sending or receiving, or a link, under {s.fail_fraction:g}x of its peers in each of {s.repeats} "
               f"repeat(s) fails, under {s.suspect_fraction:g}x warns"
               + (f" (a suspect slow only while starved of CPU, up to {s.starved_repeats} more)" if s.starved_repeats else ""))
    if low is not None and high is not None:
        message += f"; healthy figures here ran {low:.2f}x-{high:.2f}x of it"
        message += (f", so one figure alone would have resolved only a link under {low:.2f}x: the repeats resolve "
                    f"{s.fail_fraction:g}x" if low < s.fail_fraction else f", so links under {s.fail_fraction:g}x would have been named")
    if cleared:
        message += f"; slow once, not in their repeats (noise): {', '.join(cleared)}"
    starved = [f"{h} {way}" for h in found.hosts for way, v in (("sending", found.sending[h]), ("receiving", found.receiving[h]))
               if v.name == "starved"] + [f"{a}->{b}" for (a, b), v in found.links.items() if v.name == "starved"]
    if starved:
        message += f"; slow only while their ranks waited for a CPU (starved, no evidence of a slow link): {', '.join(starved)}"
    return {"healthy_low": None if low is None else round(low, 4), "healthy_high": None if high is None else round(high, 4),
            "mad_log": None if spread is None else round(spread, 4), "cleared": cleared, "message": message}


# What a check without link figures says of the neighbour test, in the summary and the terminal's table alike: one host
# has no link to measure; several hosts had the neighbour test off.
NO_LINK_ON_ONE_HOST = "no neighbour test: no link between hosts"
NO_LINK_FIGURE = "no neighbour test figure"


def summary(found: Judgement, backend: Backend) -> str:
    """The judgement in one line."""
    if not found.table and not found.tflops:
        return "no neighbour test or compute probe in this launch (collective.neighbour_time_s and compute_time_s are 0)"
    named = [*found.slow_hosts(), *(f"{a}->{b}" for a, b in found.slow_links()), *found.starved_hosts(),
             *(h for h in found.hosts if RANK[found.compute_status(h)]), *found.stragglers]
    verdict = f"named: {', '.join(dict.fromkeys(named))}" if named else "no host or link far from the others"
    if not found.table:  # no link figure (one host has no link to measure): neither a figure nor the links' rule to state
        one_host = len(found.hosts) == 1
        return ((NO_LINK_ON_ONE_HOST if one_host else f"{NO_LINK_FIGURE} in this launch")
                + f"; compute median {_flops(found.compute_reference, backend)}; "
                + ("one host, no other to compare it with" if one_host and not named else verdict))
    return (f"{len(found.table)} link figure(s), median {_num(found.reference)} GB/s; compute median "
            f"{_flops(found.compute_reference, backend)}; {verdict}; {noise(found)['message']}")


def section(found: Judgement, backend: Backend) -> SpeedSection:
    """The report's speed section; its reference is filled in by the stage once the bandwidth has been judged."""
    first = [s for s in found.table if s.repeat == 0]
    spread = noise(found)
    stats: Stats = {"count": len(first), "median": None if found.reference is None else round(found.reference, 6),
                    "mad_log": spread["mad_log"],
                    "threshold": None if found.reference is None else round(found.settings.suspect_fraction * found.reference, 6)}
    slow_hosts, slow_links, starved = found.slow_hosts(), found.slow_links(), found.starved_hosts()
    link_rows: list[LinkFigure] = [{"src": s.src, "dst": s.dst, "phase": s.phase, "source": s.source, "repeat": s.repeat, "of": list(s.of),
                                    "GBps": round(s.gbps, 6), "ratio": None if (r := found.ratio_of(s)) is None else round(r, 4),
                                    "outlier": r is not None and r < found.settings.suspect_fraction,
                                    "wait": None if s.wait is None else round(s.wait, 4)}
                                   for s in found.table]
    best = {h: max((s.gbps for s in first if h in (s.src, s.dst)), default=None) for h in found.hosts}
    host_rows: list[NeighbourHost] = []
    for h in found.hosts:
        if best[h] is None:
            continue
        verdict: Literal["ok", "slow network", "slow compute", "cpu contention"] = (
            "slow network" if h in slow_hosts else "slow compute" if h in found.cpu_explains and RANK[found.severity(h)]
            else "cpu contention" if h in starved else "ok")
        sends, receives = found.sending[h].gbps, found.receiving[h].gbps
        host_rows.append({"host": h, "links": sum(h in (s.src, s.dst) for s in found.table), "best_GBps": round(best[h] or 0.0, 6),
                          "send_GBps": None if sends is None else round(sends, 6),
                          "recv_GBps": None if receives is None else round(receives, 6),
                          "sending": found.sending[h].name, "receiving": found.receiving[h].name, "verdict": verdict})
    host_stats = outliers({r["host"]: r["best_GBps"] for r in host_rows}, 0.0, found.settings.suspect_fraction)
    compute_rows: list[ComputeHost] = [{"host": h, "ranks": found.ranks.get(h, 0), "tflops": round(found.tflops[h], 6),
                                        "slices": [round(r, 4) for r, _ in found.compute_slices[h]],
                                        "slices_waited": [None if w is None else round(w, 4) for _, w in found.compute_slices[h]],
                                        "throttled_share": None if h not in found.throttled else round(found.throttled[h], 4),
                                        "verdict": found.compute_status(h), "outlier": bool(RANK[found.compute_status(h)])}
                                       for h in found.hosts if h in found.tflops]
    compute_stats = outliers(found.tflops, 0.0, found.settings.suspect_fraction)
    start_rows: list[StartHost] = [{"host": h, "probe_s": found.probes.get(h), "import_s": found.imports.get(h),
                                    "straggler": h in found.stragglers} for h in found.hosts]
    s = found.settings
    return {"reference": "none", "reference_message": "", "message": summary(found, backend), "bytes": found.size,
            "settings": {"suspect_fraction": s.suspect_fraction, "fail_fraction": s.fail_fraction, "repeats": s.repeats,
                         "starved_repeats": s.starved_repeats},
            "links": link_rows, "link_stats": stats, "hosts": host_rows, "host_stats": host_stats.stats(),
            "slow_hosts": slow_hosts, "slow_links": [list(link) for link in slow_links], "compute": compute_rows,
            "compute_stats": compute_stats.stats(), "slow_compute": [h for h in found.hosts if RANK[found.compute_status(h)]],
            "starts": start_rows, "stragglers": found.stragglers, "noise": spread}


def pairwise_section(found: Judgement, rounds: Sequence[Sequence[tuple[str, str]]], size: int) -> PairwiseSection:
    """The pairwise stage's section when its rounds ran in the full set's launch: each pair's figure (its slower way, 0
    for a way not measured) and the hosts' verdicts, from the one judgement."""
    ways = {(s.src, s.dst): s.gbps for s in found.table if s.source == "pairwise"}
    line = found.settings.suspect_fraction * (found.reference or 0.0)
    pairs: list[PairFigure] = []
    for number, round_pairs in enumerate(rounds, start=1):
        for a, b in round_pairs:
            both = [ways.get((a, b)), ways.get((b, a))]
            missing = [f"{x}->{y}" for (x, y), rate in zip(((a, b), (b, a)), both, strict=True) if rate is None]
            gbps = 0.0 if missing else min(rate for rate in both if rate is not None)
            pairs.append({"hosts": [a, b], "round": number, "status": "fail" if missing else "pass", "busbw_GBps": round(gbps, 6),
                          "outlier": gbps < line, "message": f"not measured ({', '.join(missing)})" if missing else ""})
    slow_hosts, slow_links = found.slow_hosts(), found.slow_links()
    best = {h: max((p["busbw_GBps"] for p in pairs if h in p["hosts"]), default=None) for h in found.hosts}
    hosts: list[PairwiseHost] = [{"host": h, "pairs": sum(h in p["hosts"] for p in pairs), "best_GBps": best[h],
                                  "verdict": "untested" if best[h] is None else "slow" if h in slow_hosts else "ok"} for h in found.hosts]
    status: Literal["pass", "fail"] = "fail" if any(found.network(h) == "fail" for h in slow_hosts) or \
        any(found.links[link].name == "fail" for link in slow_links) else "pass"
    return {"status": status, "message": f"{len(pairs)} pair(s) in {len(rounds)} round(s) (round-robin, in the full set's launch); "
            + summary_of_names(slow_hosts, slow_links), "mode": "round-robin", "op": "sendrecv", "bytes": size, "rounds": len(rounds),
            "pairs": pairs, "pair_spread": _spread([p["busbw_GBps"] for p in pairs], line),
            "hosts": hosts, "host_spread": _spread([b for b in best.values() if b is not None], line),
            "slow_hosts": slow_hosts, "slow_links": [list(link) for link in slow_links], "elapsed_s": 0.0}


def summary_of_names(slow_hosts: Sequence[str], slow_links: Sequence[tuple[str, str]]) -> str:
    """"slow host(s) h3; slow link(s) h1->h2", or that there are none."""
    parts = ([f"slow host(s) {', '.join(slow_hosts)}"] if slow_hosts else []) + \
        ([f"slow link(s) {', '.join(f'{a}->{b}' for a, b in slow_links)}"] if slow_links else [])
    return "; ".join(parts) or "no slow host or link"


def _spread(values: Sequence[float], line: float) -> Spread:
    middle = median(values) if values else None
    mad = median(abs(math.log(max(v, 1e-9) / middle)) for v in values) if values and middle else None
    return {"count": len(values), "median_GBps": None if middle is None else round(middle, 6),
            "mad_log": None if mad is None else round(mad, 6), "threshold_GBps": round(line, 6) if values else None}


def judged_against(profile: BandwidthProfile | None, sweep: Sequence[SweepRow], baseline: BaselineSection | None,
                   hosts: int) -> tuple[Reference, str]:
    """What the bandwidth was judged against, in the words of the verdict line: a hardware profile's floors (PF604), the
    cluster's own history (PF613), or nothing but the hosts and links against each other (with one host, nothing)."""
    floors = profile is not None and bool(profile.all_reduce_busbw_gbps or profile.all_gather_busbw_gbps) and bool(sweep)
    history = bool(baseline and baseline["figures"])
    if floors and profile is not None:
        return "profile", f"speed judged against the profile {profile.gpu_name} x{profile.gpus_per_host}" + \
            (" and this cluster's history" if history else "")
    if history and baseline is not None:
        return "history", f"speed judged against this cluster's last {baseline['runs']} passing runs"
    return "none", ("speed not judged against a reference (no hardware profile matches, no history of 3 passing runs yet): "
                    + ("hosts and links were judged against each other only" if hosts > 1 else
                       "one host, so not judged at all"))


def _num(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.3g}"


def _flops(tflops: float | None, backend: Backend) -> str:
    """TFLOPS on GPU; GFLOPS on CPU, where a whole TFLOPS is rare."""
    if tflops is None:
        return "unknown"
    return f"{tflops:.3g} TFLOPS" if backend == Backend.nccl else f"{tflops * 1000:.3g} GFLOPS"
