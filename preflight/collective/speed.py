"""Each host's speed beside the others', from the full set's own launch: the neighbour test (each host sending to its
ring neighbour, phase by phase, then each suspect host with a known-good one), the compute probe (a fixed matmul per
rank) and each host's own start-up (the probe's seconds, torch's import). So a PASS means no host or link is far slower
than the rest, even where no hardware profile and no history say what the cluster should reach.

The statistics are preflight.collective.spread's (median and MAD of the logarithms; a figure is an outlier below both
median * e^(-k * mad_log) and fraction * median); the links are judged as the pairwise stage judges a round-robin
(preflight.collective.pairwise.judge_partners): a host slow with every partner is a slow host, a link slow between two
hosts fast with their other partners is a slow link. A host whose compute or start-up stands out is named for that,
and on gloo (where the CPU moves every byte) its slow links are put down to it rather than to its network.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from preflight.collective.pairwise import Pair, judge_partners
from preflight.collective.spread import median, outliers
from preflight.contracts import BaselineSection, PairwiseSection, SweepRow
from preflight.contracts_speed import ComputeHost, LinkFigure, NeighbourHost, Reference, SpeedSection, StartHost
from preflight.findings import CLUSTER, Finding, Status
from preflight.records import HostRecord
from preflight.spec import Backend, BandwidthProfile, PreflightConfig
from preflight.worker import neighbour_phases
from preflight.worker_wire import ResultEvent

# A host is CPU-throttled when its cgroup's quota held a rank back for this share of the compute probe or more: a fact of
# the host, named whatever the other hosts measured (a loaded machine slows every host alike; a quota only its own).
THROTTLED_SHARE = 0.2
# A start-up straggler must also be this many seconds behind the median host: the probe takes milliseconds, where a
# scheduler's hiccup doubles a figure without slowing anything a job would notice.
STRAGGLER_MIN_S = 1.0
# On gloo a host slow at its links and, of all hosts, the slowest at compute (under this share of the median) or the
# latest to import torch (over its inverse) is put down to its CPU: a starved CPU shows in its sockets first, before its
# matmul is an outlier by itself (a quota near a loaded machine's fair share).
CPU_LAGGING = 0.7
# The CPU explains a host's slow links only as far as its own deficit goes: links at most this many times further below
# the median host's than its compute (or torch import) is below the median. On gloo a CPU at a third of the others'
# pace moves bytes at about a third of theirs, never at a hundredth: a 40 Mbit/s host that also happened to be the
# slowest at compute on a loaded machine (CI saw it named slow compute, 0.7 of the median) is a slow network.
CPU_EXPLAINS = 4.0
# A slow host's best link under this share of the median host's fails (PF620); an outlier above it warns. On gloo the
# hosts' CPUs move the bytes, and a moment of load on a shared host starves its sockets: healthy hosts of a loaded
# machine were measured at 0.2-0.4 of the median, where a 40 Mbit/s host is at 0.003, so only a twentieth fails there.
FAR_BELOW = {Backend.nccl: 0.25, Backend.gloo: 0.05}
# A host slow at compute fails when its matmul is under this share of the median host's, when its cgroup's throttled time
# proves a quota held it back, or when its links, put down to its CPU, are far below (FAR_BELOW); else it warns. On nccl
# every outlier fails: the matmul runs on the GPU, which no other host's load touches. On gloo it runs on the CPU, and a
# moment of load on a shared host starves it: healthy hosts of a loaded 2-core machine were measured at 0.31 of the median
# (CI failed a healthy host so), where a host throttled to 3% of a CPU is at a tenth or less, with its throttled time.
COMPUTE_FAR_BELOW = {Backend.nccl: 1.0, Backend.gloo: 0.25}


def _links(results: Sequence[ResultEvent]) -> dict[tuple[str, str, int], float]:
    """Per (src, dst, phase) host link: its slowest rank's GB/s. A suspect's re-test is a phase of its own."""
    found: dict[tuple[str, str, int], float] = {}
    for result in results:
        for link in result.get("links", []):
            key = (link["src"], link["dst"], link["phase"])
            found[key] = min(float(link["GBps"]), found.get(key, float("inf")))
    return found


def _per_host(results: Sequence[ResultEvent], value: str) -> dict[str, float]:
    """Per host, the worst of its ranks' figure: the lowest TFLOPS, the longest import."""
    found: dict[str, float] = {}
    for result in results:
        if value == "tflops":
            compute = result.get("compute")
            if compute is not None:
                found[result["host"]] = min(float(compute["tflops"]), found.get(result["host"], float("inf")))
        elif "import_s" in result:
            found[result["host"]] = max(float(result["import_s"]), found.get(result["host"], 0.0))
    return found


def _stragglers(seconds: dict[str, float], k: float, fraction: float) -> list[str]:
    """The hosts far slower than the median host: outliers of the rates 1/seconds, by the same rule as bandwidth, and
    STRAGGLER_MIN_S behind the median at least."""
    slow = outliers({h: 1 / max(s, 1e-6) for h, s in seconds.items()}, k, fraction).outliers
    return [h for h in slow if seconds[h] - median(seconds.values()) >= STRAGGLER_MIN_S]


def _throttled_share(results: Sequence[ResultEvent]) -> dict[str, float]:
    """Per host, the largest share of a rank's compute probe that its CPU cgroup's quota held it back."""
    found: dict[str, float] = {}
    for result in results:
        compute = result.get("compute")
        if compute is not None and compute["throttled_s"] is not None and compute["seconds"] > 0:
            # cpu.stat's throttled time counts each of the group's CPUs: capped at the whole probe.
            share = min(1.0, max(0.0, float(compute["throttled_s"])) / float(compute["seconds"]))
            found[result["host"]] = max(share, found.get(result["host"], 0.0))
    return found


def judge_speed(config: PreflightConfig, backend: Backend, records: Sequence[HostRecord], results: Sequence[ResultEvent],
                profile: BandwidthProfile | None) -> tuple[list[Finding], SpeedSection]:
    """The findings (PF620 slow host, PF621 slow link, PF622 slow compute, PF623 slow start) and the report's section;
    its reference is filled in by the stage once the bandwidth has been judged."""
    c = config.collective
    k, fraction = c.outlier_mad_k, c.outlier_fraction
    hosts = list(dict.fromkeys(r["host"] for r in sorted(results, key=lambda r: r["rank"])))
    measured = _links(results)
    pairs = [Pair((src, dst), phase, "pass", rate, "") for (src, dst, phase), rate in measured.items()]
    pair_stats = outliers({f"{p.hosts[0]}>{p.hosts[1]}#{p.round}": p.gbps for p in pairs}, k, fraction)
    best, host_stats, slow_network, suspect_links = judge_partners(hosts, pairs, pair_stats, k, fraction)
    tflops = _per_host(results, "tflops")
    compute_stats = outliers(tflops, k, fraction)
    slow_compute = list(compute_stats.outliers)
    floor = profile.matmul_tflops if profile is not None and backend == Backend.nccl else 0.0
    below_floor = [h for h in hosts if floor and h in tflops and tflops[h] < floor]
    shares = _throttled_share(results)
    throttled = [h for h in hosts if shares.get(h, 0.0) >= THROTTLED_SHARE]
    slow_compute = [h for h in hosts if h in slow_compute or h in throttled]
    imports = _per_host(results, "import_s")
    probes = {r.host.name: float(r.facts["probe"]["elapsed_s"]) for r in records if r.host.name in hosts}
    late = set(_stragglers(imports, k, fraction)) | set(_stragglers(probes, k, fraction))
    stragglers = [h for h in hosts if h in late]
    # On gloo the CPU copies every byte through the sockets: a starved CPU makes every link of its host slow too.
    cpu_bound = backend == Backend.gloo
    import_rates = {h: 1 / max(seconds, 1e-6) for h, seconds in imports.items()}
    # On gloo, each slow-network host's CPU deficit (its compute or torch import against the median host's, the lower)
    # and whether it explains the host's links (CPU_EXPLAINS).
    middles = [(rates, median(rates.values())) for rates in (tflops, import_rates) if rates]
    # A host whose cgroup throttled it (its quota, proven by cpu.stat) is explained whatever the ratio: a quota runs it in
    # bursts, so a link timed for a fraction of a second can get next to none of them (CI: 3% of a CPU, links at a hundredth).
    explained = {h for h in slow_network
                 if cpu_bound and (h in throttled
                                   or ((deficits := [rates[h] / middle for rates, middle in middles if h in rates and middle])
                                       and (best[h] / host_stats.median if host_stats.median else 1.0) * CPU_EXPLAINS >= min(deficits)))}
    lagging = [h for h in slow_network if h in explained and (_last(h, tflops) or _last(h, import_rates))]
    slow_compute = [h for h in hosts if h in slow_compute or h in lagging]
    put_down_to_cpu = [h for h in slow_network if h in explained and (h in slow_compute or h in stragglers)]
    slow_hosts = [h for h in slow_network if h not in put_down_to_cpu]
    findings: list[Finding] = []
    for host in slow_hosts:
        mine = ", ".join(f"{'to ' + p.hosts[1] if p.hosts[0] == host else 'from ' + p.hosts[0]} {p.gbps:.3g}"
                         for p in pairs if host in p.hosts)
        # Far below (a NIC negotiated down, a rate limit: tens of times) fails; an outlier above that warns, since a moment
        # of load on a shared host can starve its sockets for its whole re-test.
        far = _under(best[host], FAR_BELOW[backend], host_stats.median)
        findings.append(Finding(
            "PF620", Status.fail if far else Status.warn, host,
            f"slow network: every link of this host to and from its neighbours is slow (GB/s: {mine}); its best "
            f"{best[host]:.3g} GB/s, the median host's best {_num(host_stats.median)} (outlier below {_num(host_stats.threshold)})",
            "see `preflight explain PF620`: the host's NIC (ethtool: speed, errors), a rate limit (tc qdisc show), its "
            "switch port; or leave it out (launch.exclude_failed=true)"))
    cpu_slow = {h for h in hosts if cpu_bound and (h in slow_compute or h in stragglers)}
    # A suspect re-tested with a known-good host and fast there was slow by a moment's noise, and so were its ring links.
    ring_phases = len(neighbour_phases(len(hosts)))
    ring_best = judge_partners(hosts, [p for p in pairs if p.round <= ring_phases], pair_stats, k, fraction)[0]
    suspected = {h for h, rate in ring_best.items() if rate < c.outlier_fraction * median(ring_best.values())}
    retested = {h for p in pairs if p.round > ring_phases for h in p.hosts if h in suspected and h not in slow_hosts}
    slow_links = [p for p in suspect_links if not set(p.hosts) & (cpu_slow | retested)]
    for pair in slow_links:
        findings.append(Finding(
            "PF621", Status.warn, CLUSTER,
            f"the link {pair.hosts[0]} -> {pair.hosts[1]} is slow: {pair.gbps:.3g} GB/s, the links' median "
            f"{_num(pair_stats.median)} (outlier below {_num(pair_stats.threshold)}), while both hosts are fast with other "
            f"partners ({pair.hosts[0]} {best[pair.hosts[0]]:.3g}, {pair.hosts[1]} {best[pair.hosts[1]]:.3g}); measured once",
            "run `preflight check playbook=pairwise` to measure it again; see `preflight explain PF621`"))
    for host in hosts:
        if host not in slow_compute and host not in below_floor:
            continue
        why = [f"its slowest rank's matmul ran at {_flops(tflops[host], backend)}, "
               f"the median host's {_flops(compute_stats.median, backend)}"]
        if host in below_floor:
            why.append(f"the profile {profile.gpu_name if profile else ''} expects at least {floor:g} TFLOPS")
        if host in throttled:
            why.append(f"its CPU cgroup's quota held it back for {shares[host]:.0%} of the probe (cpu.stat throttled time)")
        if host in lagging and host not in compute_stats.outliers:
            why.append(f"the last of all hosts at compute or torch import (under {CPU_LAGGING:g} of the median; import "
                       f"{imports.get(host, 0.0):.1f} s, the median host's {median(imports.values()) if imports else 0.0:.1f} s)")
        if host in put_down_to_cpu:
            why.append(f"its links are slow too (best {best[host]:.3g} GB/s, the median host's {_num(host_stats.median)}): on gloo "
                       "the CPU moves every byte, so this is its CPU, not its network")
        far = (host in throttled or host in below_floor or _under(tflops[host], COMPUTE_FAR_BELOW[backend], compute_stats.median)
               or (host in put_down_to_cpu and _under(best[host], FAR_BELOW[backend], host_stats.median)))
        findings.append(Finding("PF622", Status.fail if far else Status.warn, host, "slow compute: " + "; ".join(why),
                                "see `preflight explain PF622`: the host's CPU quota (cgroup cpu.max, cpu.cfs_quota_us), "
                                "frequency and throttling, other processes on it, the GPU's clocks (nvidia-smi -q -d PERFORMANCE)"))
    for host in stragglers:
        said = [f"torch import {imports[host]:.1f} s (median host {median(imports.values()):.1f} s)" if host in imports else "",
                f"probe {probes[host]:.2f} s (median host {median(probes.values()):.2f} s)" if host in probes else ""]
        extra = "" if host in slow_compute or host not in put_down_to_cpu else \
            f"; its links are slow too (best {best[host]:.3g} GB/s): on gloo a starved CPU slows its sockets, not its network"
        findings.append(Finding("PF623", Status.fail if host in put_down_to_cpu else Status.warn, host,
                                "slow start: " + ", ".join(s for s in said if s) + extra,
                                "see `preflight explain PF623`: the host's CPU (quota, throttling, load), its disk (a cold "
                                "or network filesystem under the python environment)"))
    link_rows: list[LinkFigure] = [{"src": p.hosts[0], "dst": p.hosts[1], "phase": p.round, "GBps": round(p.gbps, 6),
                                    "outlier": pair_stats.below(p.gbps)} for p in sorted(pairs, key=lambda p: (p.round, p.hosts))]
    host_rows: list[NeighbourHost] = [{"host": h, "links": sum(h in p.hosts for p in pairs), "best_GBps": round(best[h], 6),
                                       "verdict": "slow network" if h in slow_hosts else "slow compute" if h in put_down_to_cpu else "ok"}
                                      for h in hosts if h in best]
    compute_rows: list[ComputeHost] = [{"host": h, "ranks": sum(r["host"] == h for r in results), "tflops": round(tflops[h], 6),
                                        "throttled_share": None if h not in shares else round(shares[h], 4),
                                        "outlier": h in slow_compute or h in below_floor} for h in hosts if h in tflops]
    start_rows: list[StartHost] = [{"host": h, "probe_s": probes.get(h), "import_s": imports.get(h), "straggler": h in stragglers}
                                   for h in hosts]
    named = [*slow_hosts, *(f"{a}->{b}" for a, b in (p.hosts for p in slow_links)),
             *(h for h in hosts if h in slow_compute or h in below_floor), *stragglers]
    message = (f"{len(pairs)} link(s) measured, median {_num(pair_stats.median)} GB/s; "
               f"compute median {_flops(compute_stats.median, backend)}; "
               + (f"named: {', '.join(dict.fromkeys(named))}" if named else "no host or link far from the others"))
    if not pairs and not tflops:
        message = "no neighbour test or compute probe in this launch (collective.neighbour_time_s and compute_time_s are 0)"
    size = next((link["bytes"] for r in results for link in r.get("links", [])), 0)
    section: SpeedSection = {
        "reference": "none", "reference_message": "", "message": message, "bytes": size, "links": link_rows,
        "link_stats": pair_stats.stats(), "hosts": host_rows, "host_stats": host_stats.stats(), "slow_hosts": slow_hosts,
        "slow_links": [list(p.hosts) for p in slow_links], "compute": compute_rows, "compute_stats": compute_stats.stats(),
        "slow_compute": [h for h in hosts if h in slow_compute or h in below_floor], "starts": start_rows, "stragglers": stragglers}
    if not findings:
        findings.append(Finding("PF620", Status.passed, CLUSTER, "neighbours and compute: " + message))
    return findings, section


def beside_pairwise(findings: Sequence[Finding], speed: SpeedSection | None, pairwise: PairwiseSection | None) -> list[Finding]:
    """The neighbour test's slow hosts and links (PF620, PF621: two ring partners, measured once) with what the pairwise
    stage found of the same host or pair (more partners, a slow link measured again), so that the report never says
    the one without the other. PF621's findings are in the order of speed["slow_links"] (judge_speed). A host the
    pairwise stage found fast with a partner of its own, in the same launch, is no slow host: its PF620 stays a warning
    (slow once, with its ring partners) and speed["slow_hosts"] drops it, as a loaded machine can starve one phase."""
    if speed is None or pairwise is None or pairwise["status"] == "skipped":
        return list(findings)
    verdicts = {h["host"]: h for h in pairwise["hosts"]}
    slow_hosts, slow_links = set(pairwise["slow_hosts"]), {frozenset(link) for link in pairwise["slow_links"]}
    links = iter(speed["slow_links"])
    noted = []
    cleared = set()  # slow with their ring partners only
    for finding in findings:
        note = ""
        if finding.code == "PF620" and finding.status != Status.passed:
            host = verdicts.get(finding.host)
            if finding.host in slow_hosts:
                note = "the pairwise stage names it too (PF607)"
            elif host is not None and host["best_GBps"] is not None:
                note = (f"the pairwise stage found it fast with its best of {host['pairs']} partner(s) ({host['best_GBps']:.3g} "
                        "GB/s): slow here with its ring partners only")
                finding = replace(finding, status=Status.warn)
                cleared.add(finding.host)
        elif finding.code == "PF621" and finding.status != Status.passed:
            pair = set(next(links, []))
            runs = [f"{p['busbw_GBps']:.3g}" for p in pairwise["pairs"] if set(p["hosts"]) == pair]
            if frozenset(pair) in slow_links:
                note = "the pairwise stage measured the pair again and names it (PF608)"
            elif pair & slow_hosts:
                note = f"the pairwise stage names {', '.join(sorted(pair & slow_hosts))} slow (PF607) rather than the link"
            elif runs:
                note = f"the pairwise stage measured the pair {len(runs)} time(s) ({', '.join(runs)} GB/s) and names no slow link"
        noted.append(replace(finding, message=f"{finding.message}; {note}") if note else finding)
    speed["slow_hosts"] = [h for h in speed["slow_hosts"] if h not in cleared]
    for row in speed["hosts"]:
        if row["host"] in cleared and row["verdict"] == "slow network":
            row["verdict"] = "ok"
    return noted


def _under(value: float, share: float, middle: float | None) -> bool:
    """Whether value is under share of middle (never, where there is no middle)."""
    return middle is not None and value < share * middle


def _last(host: str, rates: dict[str, float]) -> bool:
    """Whether host has the lowest rate of all (of three or more), and below CPU_LAGGING of their median."""
    if host not in rates or len(rates) < 3:
        return False
    return rates[host] == min(rates.values()) and rates[host] < CPU_LAGGING * median(rates.values())


def judged_against(profile: BandwidthProfile | None, sweep: Sequence[SweepRow], baseline: BaselineSection | None
                   ) -> tuple[Reference, str]:
    """What the bandwidth was judged against, in the words of the verdict line: a hardware profile's floors (PF604), the
    cluster's own history (PF613), or nothing but the hosts and links against each other."""
    floors = profile is not None and bool(profile.all_reduce_busbw_gbps or profile.all_gather_busbw_gbps) and bool(sweep)
    history = bool(baseline and baseline["figures"])
    if floors and profile is not None:
        return "profile", f"speed judged against the profile {profile.gpu_name} x{profile.gpus_per_host}" + \
            (" and this cluster's history" if history else "")
    if history and baseline is not None:
        return "history", f"speed judged against this cluster's last {baseline['runs']} passing runs"
    return "none", ("speed not judged against a reference (no hardware profile matches, no history of 3 passing runs yet): "
                    "hosts and links were judged against each other only")


def _num(value: float | None) -> str:
    # None only where a set had too few figures for statistics.
    return "unknown" if value is None else f"{value:.3g}"


def _flops(tflops: float | None, backend: Backend) -> str:
    """TFLOPS on GPU; GFLOPS on CPU, where a whole TFLOPS is rare."""
    if tflops is None:
        return "unknown"
    return f"{tflops:.3g} TFLOPS" if backend == Backend.nccl else f"{tflops * 1000:.3g} GFLOPS"
