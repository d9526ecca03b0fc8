"""The report's speed section (schema 6), as its exact JSON shape: what the full set's launch measured of each host
beside the others (the neighbour test, the compute probe, each host's own start-up) and what the speed was judged
against. Apart from preflight/contracts.py only to keep each module short; the report's other shapes are there."""

from __future__ import annotations

from typing import Literal, TypedDict

Reference = Literal["profile", "history", "none"]


class Stats(TypedDict):
    """Robust statistics of figures measured alike, in the figures' own unit (preflight.collective.spread): a figure is an
    outlier when it is below the threshold, min(median * e^(-k * mad_log), fraction * median)."""

    count: int
    median: float | None  # None: no figure
    mad_log: float | None
    threshold: float | None  # None: fewer than 3 figures, too few to name an outlier


class LinkFigure(TypedDict):
    """One link of the neighbour test: a host sending to another, the slowest of its ranks."""

    src: str
    dst: str
    phase: int  # the test's phase (from 1); the links of a phase ran at once
    GBps: float
    outlier: bool  # below the links' threshold


class NeighbourHost(TypedDict):
    """One host as the neighbour test judged it: its best link (sending or receiving), the fastest with any partner."""

    host: str
    links: int
    best_GBps: float
    verdict: Literal["ok", "slow network", "slow compute"]  # slow compute: its links are slow because its CPU is


class ComputeHost(TypedDict):
    """One host's compute probe: its slowest rank."""

    host: str
    ranks: int
    tflops: float  # the dense matmul's rate: TFLOPS (1e12), on CPU too (the terminal shows GFLOPS there)
    throttled_share: float | None  # of the probe's time, the share its CPU cgroup's quota held a rank back; None: unknown
    outlier: bool


class StartHost(TypedDict):
    """One host's own pace before any peer is waited for: the probe's seconds and torch's import (its slowest rank)."""

    host: str
    probe_s: float | None  # None: the facts carry no time
    import_s: float | None  # None: no rank of it reported one
    straggler: bool  # an outlier in either


class SpeedSection(TypedDict):
    """Whether the speed was judged, against what, and each host beside the others."""

    reference: Reference  # what the bandwidth was judged against; none: only against each other
    reference_message: str
    message: str  # the neighbour test's and compute probe's outcome in one line
    bytes: int  # the neighbour test's message size
    links: list[LinkFigure]
    link_stats: Stats  # GB/s
    hosts: list[NeighbourHost]
    host_stats: Stats  # GB/s, over the hosts' best links
    slow_hosts: list[str]  # slow network
    slow_links: list[list[str]]  # [src, dst]
    compute: list[ComputeHost]
    compute_stats: Stats  # TFLOPS
    slow_compute: list[str]
    starts: list[StartHost]
    stragglers: list[str]
