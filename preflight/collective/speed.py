"""The speed judge: one table of what the full set's launch measured of each host and link, judged once.

The table's rows, each with its source:

- **ring**: the neighbour test, each host sending to its ring neighbour, phase by phase (worker.neighbour_phases);
- **pairwise**: the pairwise stage's round-robin rounds in the same launch, when the playbook has the stage;
- **repeat**: every suspect measured again, ``repeats`` times (worker.repeat_plan): a host's sending with other
  receivers, its receiving with other senders, a suspect link itself;
- **compute**: each rank's matmul, timed in ``repeats`` slices; **start**: the probe's seconds and torch's import.

One rule decides every verdict (``collective.speed.<backend>``, preflight.spec.SpeedVerdicts): a figure under
``suspect_fraction`` of the median (of the hosts' best links in the ring and rounds, worker.peers_median; the median
host's matmul) makes a suspect; a suspect under ``fail_fraction`` in every repeat fails, under ``suspect_fraction`` in
every repeat warns, and one that does not repeat is noise, said in the report. A slow repeat during which the ranks at
its ends waited for a CPU for ``starved_fraction`` of its time or more (schedstat's run_delay, host.traffic) measured
CPU contention on a host, not its link: it is no evidence of a slow link, and a suspect slow only in such repeats is
starved (PF624), its severity by the same fractions (under ``fail_fraction`` in every one fails), as a host whose ranks
wait for a CPU in every repeat paces a job as a slow NIC would.
A repeat's figure is judged beside what was measured with it: the lower of its round's median and its phase's
(worker.repeat_ratios), as a loaded moment slows every link of a phase alike. Sending and receiving are judged apart, so
a host that sends slowly is named with both figures, and a neighbour that only received from it is cleared by its own
repeats. A slow link is one slow again while neither end is. On gloo, where the CPU moves every byte, a host's slow
links are put down to its CPU only on evidence: a cgroup quota that held its ranks back, or a compute deficit that
repeated; a slow torch import never does. The codes: PF620 slow host, PF621 slow link (PF607, PF608 when the pairwise
stage's rounds are in the launch), PF622 slow compute, PF623 slow start, and PF613 (the cluster's history,
preflight.collective.baseline) for what the judge did not name already, PF624 CPU contention where only starved
samples were slow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from preflight.collective.contracts import (
    VerdictName,
)
from preflight.collective.host.plans import counts, excused, peers_median, repeat_ratios, steadily_slow, suspects
from preflight.collective.wire import ResultEvent
from preflight.records import HostRecord
from preflight.spec import Backend, BandwidthProfile, PreflightConfig, SpeedVerdicts
from preflight.spread import median, outliers

Source = Literal["ring", "pairwise", "repeat"]
# How bad each verdict is as evidence of a slow host or link: ok, untested and noise name nothing, starved names the CPU.
RANK: dict[VerdictName, int] = {"ok": 0, "untested": 0, "noise": 0, "starved": 0, "warn": 1, "fail": 2}
# How bad a verdict is, whatever it is put down to: a starved one's too (Verdict.severity).
Severity = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Sample:
    """One link measured once: a host sending to another, its slowest rank's GB/s."""

    src: str
    dst: str
    source: Source
    phase: int
    repeat: int  # 0: the ring or a round; from 1: a repeat
    of: tuple[str, ...]  # in a repeat, what it measures again: "src", "dst", "link"
    gbps: float
    # The share of its time the slowest rank's ends waited for a CPU (the larger of its sender's and receiver's, host.traffic);
    # None: unknown
    wait: float | None = None


@dataclass(frozen=True)
class Verdict:
    """A host's sending, receiving or matmul, or a link, as the rule judged it: its first figure and its repeats, as
    ratios of the median."""

    name: VerdictName
    first: float | None  # ratio of the first figure (a host: its best); None: not measured
    repeats: tuple[float, ...]  # ratios, each to its own repeat's yardstick
    gbps: float | None = None  # what the verdict rests on, as measured: a suspect's median repeat, else its first figure
    starved: tuple[float, ...] = ()  # the CPU waits of the slow repeats left out as no evidence (starved_fraction)
    # A starved verdict's severity, by the fractions its starved repeats' ratios met in every one; None: not starved
    contention: Literal["warn", "fail"] | None = None
    # The repeats include the starved ones: fewer than `repeats` counted, and they were all there was (judge_ratios)
    pooled: bool = False
    # A host's way: the partners whose figures with it were left out, as their own slowness the other way explains them
    # (plans.excused)
    excused: tuple[str, ...] = ()

    @property
    def named(self) -> bool:
        """Named slow at its link (PF620, PF621 and their pairwise codes)."""
        return self.name in ("warn", "fail")

    @property
    def severity(self) -> Severity:
        """How bad, whatever the cause: a slow link's warn or fail, a starved one's contention, else ok."""
        if self.name == "starved":
            return self.contention or "warn"
        return "fail" if self.name == "fail" else "warn" if self.name == "warn" else "ok"

    def ratio(self) -> float | None:
        """What the verdict rests on, as a ratio: the median of the repeats of a suspect, else the first figure."""
        return median(self.repeats) if self.repeats and self.first is not None and self.name != "ok" else self.first


def judge_ratios(first: float | None, repeats: Sequence[float], settings: SpeedVerdicts,
                 waits: Sequence[float | None] = ()) -> Verdict:
    """The rule: not measured, or at or above suspect_fraction: ok; a suspect without repeats: untested; under
    fail_fraction in every repeat: fail; under suspect_fraction in every repeat: warn; else noise. A slow repeat whose
    ranks waited for a CPU for starved_fraction of its time or more (waits, one a repeat; None: unknown) measured that
    wait, not the link: it is left out, and a suspect slow only in such repeats is starved, as severe as those repeats'
    ratios say by the same fractions (contention: fail under fail_fraction in every one, else warn). A fast one counts,
    starved or not: a wait only ever slows a sample. A fail rests on `repeats` repeats: on those that count where there
    are as many (the ranks measure a suspect again until there are, within starved_repeats, plans.unresolved), else on
    every repeat, the starved ones too, so that it still takes `repeats` repeats all under fail_fraction, one of them
    measured with its CPUs at least."""
    if first is None or first >= settings.suspect_fraction:
        return Verdict("ok", first, tuple(repeats))
    if not repeats:
        return Verdict("untested", first, ())
    counted: list[float] = []
    waited: list[float] = []
    for ratio, wait in zip(repeats, list(waits) or [None] * len(repeats), strict=True):
        if not counts(ratio, wait, settings.suspect_fraction, settings.starved_fraction):
            waited.append(wait or 0.0)
        else:
            counted.append(ratio)
    starved = tuple(waited)
    if not counted:
        # Each left-out repeat was under suspect_fraction: the CPU is the cause, and the ratios still say how slow a job
        # on this host would run while it lasts.
        contention: Literal["warn", "fail"] = "fail" if all(r < settings.fail_fraction for r in repeats) else "warn"
        return Verdict("starved", first, tuple(repeats), starved=starved, contention=contention)
    # The evidence is the first `repeats` that count: the starved repeats' extra ones (starved_repeats) stand in for the
    # samples left out, and do not give a slow host measured beside a starved one more chances to look fast once.
    pooled = len(counted) < settings.repeats and bool(waited)
    evidence = tuple(repeats) if pooled else tuple(counted[:settings.repeats] if settings.repeats else counted)
    if len(evidence) >= settings.repeats and all(r < settings.fail_fraction for r in evidence):
        return Verdict("fail", first, evidence, starved=starved, pooled=pooled)
    if all(r < settings.suspect_fraction for r in evidence):
        return Verdict("warn", first, evidence, starved=starved, pooled=pooled)
    return Verdict("noise", first, evidence, starved=starved, pooled=pooled)


def _measured(verdict: Verdict, first: float, repeats: Sequence[float]) -> Verdict:
    """The verdict with the GB/s it rests on."""
    suspect = verdict.name != "ok" and bool(verdict.repeats)
    return replace(verdict, gbps=median(repeats) if suspect and repeats else first)


def samples(results: Sequence[ResultEvent]) -> list[Sample]:
    """The launch's links: per (src, dst, phase, source), its slowest rank's GB/s and how long that rank's ends waited for
    a CPU."""
    found: dict[tuple[str, str, Source, int, int, tuple[str, ...]], tuple[float, float | None]] = {}
    for result in results:
        for rows, paired in ((result.get("links", []), False), (result.get("pair_links", []), True)):
            for link in rows:
                repeat = int(link.get("repeat", 0))
                source: Source = "pairwise" if paired else "repeat" if repeat else "ring"
                key = (link["src"], link["dst"], source, int(link["phase"]), repeat, tuple(link.get("of", ())))
                waits = [float(w) for w in (link.get("send_wait"), link.get("recv_wait")) if w is not None]
                if float(link["GBps"]) < found.get(key, (math.inf, None))[0]:
                    found[key] = (float(link["GBps"]), max(waits) if waits else None)
    return [Sample(*key, gbps, wait) for key, (gbps, wait) in sorted(found.items(), key=lambda item: (item[0][4], item[0][3], item[0][:2]))]


@dataclass(frozen=True)
class Judgement:
    """Every verdict of one launch."""

    settings: SpeedVerdicts
    hosts: list[str]
    table: list[Sample]
    reference: float | None  # GB/s: the median of the hosts' best links in the ring and rounds (worker.peers_median)
    ratios: dict[Sample, float]  # each figure against what it is judged by: the reference, or its repeat's (worker.repeat_ratios)
    sending: dict[str, Verdict]
    receiving: dict[str, Verdict]
    links: dict[tuple[str, str], Verdict]
    tflops: dict[str, float]  # each host's slowest rank
    compute: dict[str, Verdict]
    compute_slices: dict[str, list[tuple[float, float | None]]]  # per host, each slice against the median host's, and its wait
    compute_reference: float | None
    throttled: dict[str, float]  # share of the probe a quota held a rank back, per host that reported one
    below_floor: list[str]  # under the profile's matmul floor (nccl)
    cpu_explains: list[str]  # gloo: hosts whose slow links are their CPU's (a quota, or a compute deficit that repeated)
    stragglers: list[str]
    imports: dict[str, float]
    probes: dict[str, float]
    ranks: dict[str, int]  # per host, its ranks that ran the compute probe
    size: int  # the neighbour test's message size

    def ratio_of(self, sample: Sample) -> float | None:
        """A figure against what it is judged by (None: nothing to judge it against)."""
        return self.ratios.get(sample)

    def network(self, host: str) -> VerdictName:
        """The worse of the host's sending and receiving."""
        return max(self.sending[host].name, self.receiving[host].name, key=RANK.__getitem__)

    def severity(self, host: str) -> Severity:
        """The worse of the host's sending's and receiving's severities, whatever the cause (a starved way's too)."""
        return max(self.sending[host].severity, self.receiving[host].severity, key=RANK.__getitem__)

    def slow_hosts(self) -> list[str]:
        """Hosts slow at their network (their sending, receiving or both), not put down to their CPU."""
        return [h for h in self.hosts if RANK[self.network(h)] and h not in self.cpu_explains]

    def slow_links(self) -> list[tuple[str, str]]:
        """Links slow again while neither end is named for that direction, nor put down to a CPU."""
        return [(a, b) for (a, b), v in self.links.items()
                if v.named and not self.sending[a].named and not self.receiving[b].named and not {a, b} & set(self.cpu_explains)]

    def starved_hosts(self) -> list[str]:
        """Hosts slow in every repeat of their sending or receiving only while the ranks moving their bytes waited for a
        CPU (judge_ratios' starved), and not named slow otherwise: CPU contention, their links' speed unknown. Not those
        whose CPU the compute probe proved slow (cpu_explains): PF622 names that CPU, with its evidence."""
        return [h for h in self.hosts if "starved" in (self.sending[h].name, self.receiving[h].name) and not RANK[self.network(h)]
                and h not in self.cpu_explains]

    def contention(self, host: str) -> Severity:
        """How bad a starved host's CPU contention is: the worse of its starved ways' severities (ok: none starved)."""
        starved = [v.severity for v in (self.sending[host], self.receiving[host]) if v.name == "starved"]
        return max(starved, key=RANK.__getitem__, default="ok")

    def compute_status(self, host: str) -> VerdictName:
        """A host's compute: the rule on its slices, and a fail on a quota's evidence or under the profile's floor."""
        if self.throttled.get(host, 0.0) >= self.settings.throttled_share or host in self.below_floor:
            return "fail"
        return self.compute[host].name if host in self.compute else "ok"


def judge(config: PreflightConfig, backend: Backend, records: Sequence[HostRecord], results: Sequence[ResultEvent],
          profile: BandwidthProfile | None) -> Judgement:
    """Judge one launch's table (see the module's docstring)."""
    settings = config.collective.speed.of(backend)
    hosts = list(dict.fromkeys(r["host"] for r in sorted(results, key=lambda r: r["rank"])))
    table = samples(results)
    first = [s for s in table if s.repeat == 0]
    reference = peers_median([(s.src, s.dst, s.gbps) for s in first]) or None

    again = [s for s in table if s.repeat > 0]
    measured = [(s.src, s.dst, s.gbps) for s in first]
    ratios: dict[Sample, float] = {s: s.gbps / reference for s in first} if reference else {}
    by_repeat = [[s for s in again if s.repeat == r] for r in sorted({s.repeat for s in again})]
    figures = [[(s.src, s.dst, s.phase, "round" if "round" in s.of else "link", s.gbps) for s in mine] for mine in by_repeat]
    steady = steadily_slow(measured, figures, settings.suspect_fraction)  # as the ranks took it for their last repeat
    for mine, theirs in zip(by_repeat, figures, strict=True):
        ratios.update((s, ratio) for s, ratio in zip(mine, repeat_ratios(measured, theirs, settings.suspect_fraction, steady), strict=True)
                      if ratio is not None)

    # Each repeat round's figure, and whether its other end's own slowness explains it for its sender, for its receiver.
    rounds = [s for s in again if "round" in s.of and s in ratios]
    first_sends, first_receives, _ = suspects(measured, settings.suspect_fraction)
    for_sender, for_receiver = excused([(s.src, s.dst, ratios[s], s.wait) for s in rounds], first_sends, first_receives,
                                       settings.suspect_fraction, settings.starved_fraction)
    left_out = {(s, "src") for s, out in zip(rounds, for_sender, strict=True) if out} | \
        {(s, "dst") for s, out in zip(rounds, for_receiver, strict=True) if out}

    def way(host: str, end: Literal["src", "dst"]) -> Verdict:
        """A host's sending ("src") or receiving ("dst"): its best first figure, and its figure in each repeat's round,
        but those its partner's own slowness explains (plans.excused)."""
        rows = [s for s in first if getattr(s, end) == host]
        if not rows or not reference:
            return Verdict("ok", None, ())
        theirs = [s for s in rounds if getattr(s, end) == host]
        mine = [s for s in theirs if (s, end) not in left_out]
        partners = {s.dst if end == "src" else s.src for s in mine}
        best = max(s.gbps for s in rows)
        verdict = judge_ratios(best / reference, [ratios[s] for s in mine], settings, [s.wait for s in mine])
        if verdict.severity != "ok" and len(partners) < 2:
            # One partner in every repeat (two hosts) cannot tell this end from the other, nor whose CPU the ranks waited
            # for: the link is named instead.
            verdict = replace(verdict, name="untested", repeats=(), contention=None)
        others = tuple(sorted({s.dst if end == "src" else s.src for s in theirs if (s, end) in left_out}))
        return _measured(replace(verdict, excused=others), best, [s.gbps for s in mine])

    def link(src: str, dst: str) -> Verdict:
        """A link: its best first figure, and its figure in each repeat, judged as a slow link only where its sender sent
        and its receiver received at speed in that same repeat's round (else the slowness may be either end's)."""
        value = max(s.gbps for s in first if (s.src, s.dst) == (src, dst))
        mine = [s for s in again if (s.src, s.dst) == (src, dst) and s in ratios]
        verdict = judge_ratios(value / reference if reference else None, [ratios[s] for s in mine], settings, [s.wait for s in mine])
        ends = [s for s in again if "round" in s.of and (s.src, s.dst) != (src, dst) and (s.src == src or s.dst == dst)]
        if verdict.named and any(ratios.get(s, 1.0) < settings.suspect_fraction for s in ends):
            verdict = replace(verdict, name="untested")
        return _measured(verdict, value, [s.gbps for s in mine])

    sending = {h: way(h, "src") for h in hosts}
    receiving = {h: way(h, "dst") for h in hosts}
    links = {(s.src, s.dst): link(s.src, s.dst) for s in first}
    tflops, slices, throttled = _compute_figures(results)
    compute_reference = median(tflops.values()) if tflops else None
    slice_medians = [median(row[i][0] for row in slices.values() if len(row) > i) for i in range(max(map(len, slices.values()), default=0))]
    compute_slices = {h: [(value / slice_medians[i], wait) for i, (value, wait) in enumerate(slices[h]) if slice_medians[i] > 0]
                      for h in tflops}
    # Each slice's wait is evidence for the reader, not for the rule: a quota's throttling shows as a wait too (the task
    # stays runnable while its group is held), so a slow slice that waited may still be its CPU's, and so it counts.
    compute = {h: judge_ratios(tflops[h] / compute_reference if compute_reference else None, [r for r, _ in compute_slices[h]],
                               settings)
               for h in tflops}
    floor = profile.matmul_tflops if profile is not None and backend == Backend.nccl else 0.0
    below_floor = [h for h in hosts if floor and h in tflops and tflops[h] < floor]
    imports: dict[str, float] = {}
    for result in results:
        if "import_s" in result:
            imports[result["host"]] = max(float(result["import_s"]), imports.get(result["host"], 0.0))
    probes = {r.host.name: float(r.facts["probe"]["elapsed_s"]) for r in records if r.host.name in hosts}
    c = config.collective
    late = set(_stragglers(imports, c.outlier_mad_k, c.outlier_fraction, settings)) | \
        set(_stragglers(probes, c.outlier_mad_k, c.outlier_fraction, settings))
    partial = Judgement(settings, hosts, table, reference, ratios, sending, receiving, links, tflops, compute, compute_slices,
                        compute_reference,
                        throttled, below_floor, [], [h for h in hosts if h in late], imports, probes,
                        {h: sum(r["host"] == h and r.get("compute") is not None for r in results) for h in hosts},
                        next((int(link["bytes"]) for r in results for link in [*r.get("links", []), *r.get("pair_links", [])]), 0))
    # On gloo the CPU copies every byte through the sockets: a CPU proven slow (its quota, or a deficit that repeated)
    # makes its host's links slow too. On nccl the NIC and the GPU's DMA move the bytes, not the CPU.
    cpu = [h for h in hosts if backend == Backend.gloo and RANK[partial.compute_status(h)] and (h in below_floor or h in throttled
                                                                                                  or compute[h].named)]
    return replace(partial, cpu_explains=cpu)


def _compute_figures(results: Sequence[ResultEvent]) -> tuple[dict[str, float], dict[str, list[tuple[float, float | None]]],
                                                              dict[str, float]]:
    """Per host: its slowest rank's TFLOPS, its slices (each its slowest rank's, with the share of it that rank waited for
    a CPU; None: unknown), and the largest share of a rank's probe its CPU cgroup's quota held it back."""
    tflops: dict[str, float] = {}
    slices: dict[str, list[tuple[float, float | None]]] = {}
    throttled: dict[str, float] = {}
    for result in results:
        compute = result.get("compute")
        if compute is None:
            continue
        host = result["host"]
        tflops[host] = min(float(compute["tflops"]), tflops.get(host, math.inf))
        waits = list(compute.get("slices_waited", []))
        mine = [(float(v), waits[i] if i < len(waits) else None) for i, v in enumerate(compute.get("slices_tflops", []))]
        slices[host] = [min(a, b, key=lambda s: s[0]) for a, b in zip(slices[host], mine, strict=False)] if host in slices else mine
        if compute["throttled_s"] is not None and compute["seconds"] > 0:
            # cpu.stat's throttled time counts each of the group's CPUs: capped at the whole probe.
            share = min(1.0, max(0.0, float(compute["throttled_s"])) / float(compute["seconds"]))
            throttled[host] = max(share, throttled.get(host, 0.0))
    return tflops, slices, throttled


def _stragglers(seconds: dict[str, float], k: float, fraction: float, settings: SpeedVerdicts) -> list[str]:
    """The hosts far slower to start than the median host: outliers of the rates 1/seconds (the sweep's statistic) and
    straggler_min_s behind the median at least (the probe takes milliseconds, where a scheduler's hiccup doubles a
    figure without slowing anything a job would notice)."""
    slow = outliers({h: 1 / max(s, 1e-6) for h, s in seconds.items()}, k, fraction).outliers
    return [h for h in slow if seconds[h] - median(seconds.values()) >= settings.straggler_min_s]
