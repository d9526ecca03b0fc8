"""The report's speed section (schema 7), as its exact JSON shape: what the full set's launch measured of each host
beside the others (the neighbour test, the compute probe, each host's own start-up) and what the speed was judged
against. The rest of the collective's section (CollectiveSection and its parts) is typed in preflight/contracts.py;
this module, like every stage's shapes, sits on floor 0 so that contracts.Report can compose it."""

from __future__ import annotations

from typing import Literal, TypedDict

Reference = Literal["profile", "history", "none"]
# The speed judge's rule (preflight.collective.speed.judge_ratios): ok (not a suspect), untested (a suspect whose repeats
# cannot tell: a host with one partner in them, a link one of whose ends was slow too in a repeat), noise (a suspect that
# did not repeat), warn (under suspect_fraction in every repeat), fail (under fail_fraction in every repeat).
VerdictName = Literal["ok", "untested", "noise", "warn", "fail"]


class Stats(TypedDict):
    """Robust statistics of figures measured alike, in the figures' own unit (preflight.collective.spread): a figure is an
    outlier when it is below the threshold, min(median * e^(-k * mad_log), fraction * median)."""

    count: int
    median: float | None  # None: no figure
    mad_log: float | None
    threshold: float | None  # None: fewer than 3 figures, too few to name an outlier


class LinkFigure(TypedDict):
    """One link measured once in the launch: a host sending to another, the slowest of its ranks."""

    src: str
    dst: str
    phase: int  # the test's phase (from 1; the pairwise rounds count their own); the links of a phase ran at once
    source: Literal["ring", "pairwise", "repeat"]  # the neighbour ring, a pairwise round, a suspect's repeat
    repeat: int  # 0: the ring or a round; from 1: which repeat
    of: list[str]  # in a repeat: "round" (its shifted ring: its sender's sending, its receiver's receiving), "link" (a suspect link)
    GBps: float
    ratio: float | None  # of the median link (the ring and rounds); None: no median
    outlier: bool  # under suspect_fraction of the median: a suspect


class NeighbourHost(TypedDict):
    """One host as the speed judge found it, its sending and receiving apart."""

    host: str
    links: int  # link figures it took part in, repeats included
    best_GBps: float  # its fastest first figure (ring or round), sending or receiving
    send_GBps: float | None  # what its sending's verdict rests on: a suspect's median repeat, else its best first figure
    recv_GBps: float | None  # the same of its receiving
    sending: VerdictName
    receiving: VerdictName
    verdict: Literal["ok", "slow network", "slow compute"]  # slow compute: its links are slow because its CPU is


class ComputeHost(TypedDict):
    """One host's compute probe: its slowest rank."""

    host: str
    ranks: int
    tflops: float  # the dense matmul's rate: TFLOPS (1e12), on CPU too (the terminal shows GFLOPS there)
    slices: list[float]  # each slice of the probe as a ratio of the median host's same slice (its repeats)
    throttled_share: float | None  # of the probe's time, the share its CPU cgroup's quota held a rank back; None: unknown
    verdict: VerdictName
    outlier: bool  # named: warn or fail


class StartHost(TypedDict):
    """One host's own pace before any peer is waited for: the probe's seconds and torch's import (its slowest rank)."""

    host: str
    probe_s: float | None  # None: the facts carry no time
    import_s: float | None  # None: no rank of it reported one
    straggler: bool  # an outlier in either


class SpeedSettings(TypedDict):
    """The thresholds the judge applied (collective.speed.<backend>)."""

    suspect_fraction: float
    fail_fraction: float
    repeats: int


class NoiseSummary(TypedDict):
    """What this run could resolve: the figures of hosts and links not named, as ratios of the median link."""

    healthy_low: float | None  # None: no figure
    healthy_high: float | None
    mad_log: float | None  # the median of |ln(ratio)|: healthy figures lie within a factor e^mad_log of the median
    cleared: list[str]  # suspects that did not repeat: "h3 sending", "h1->h2"
    message: str


class SpeedSection(TypedDict):
    """Whether the speed was judged, against what, and each host beside the others."""

    reference: Reference  # what the bandwidth was judged against; none: only against each other
    reference_message: str
    message: str  # the neighbour test's and compute probe's outcome in one line
    bytes: int  # the neighbour test's message size
    settings: SpeedSettings
    links: list[LinkFigure]
    link_stats: Stats  # GB/s: the peers' median (the hosts' best first figures), the healthy figures' spread, the suspect line
    hosts: list[NeighbourHost]
    host_stats: Stats  # GB/s, over the hosts' best links
    slow_hosts: list[str]  # slow network
    slow_links: list[list[str]]  # [src, dst]
    compute: list[ComputeHost]
    compute_stats: Stats  # TFLOPS
    slow_compute: list[str]
    starts: list[StartHost]
    stragglers: list[str]
    noise: NoiseSummary
