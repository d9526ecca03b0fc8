"""The collective stage's section of the report (schema 7), as its exact JSON shapes: the launch and its verified
all_gather, the sweep, isolation, the pairwise stage, the baseline, the network NCCL chose, and the speed section (what
the full set's launch measured of each host beside the others: the neighbour test, the compute probe, each host's own
start-up, and what the speed was judged against). Like every stage's shapes, this module sits on floor 0, and
preflight.report_shape composes it into the report."""

from __future__ import annotations

from typing import Annotated, Literal, TypedDict

from preflight.contracts import BackendName
from preflight.schema_marks import Amount, Count, HostName, HostPair, OneOf, Percent, Range, Share
from preflight.spread import Spread, Stats

RunStatus = Literal["pass", "fail", "hang", "unknown"]  # one launch of the collective; unknown: a host was lost under it
CollectiveStatus = Literal["pass", "fail", "hang", "unknown", "skipped"]

Reference = Literal["profile", "history", "none"]
# The speed judge's rule (preflight.collective.speed.judge_ratios): ok (not a suspect), untested (a suspect whose repeats
# cannot tell: a host with one partner in them, a link one of whose ends was slow too in a repeat), noise (a suspect that
# did not repeat), starved (slow in every repeat, but each time its ranks waited for a CPU: contention, not its link; PF624
# fails or warns it by the same fractions as a slow link),
# warn (under suspect_fraction in every repeat), fail (under fail_fraction in every repeat).
VerdictName = Literal["ok", "untested", "noise", "starved", "warn", "fail"]

# The playbook's names of the collective's optional parts, listed in playbook.stages beside "collective" (the stage list
# knows them through the collective's entry): parts of its launches, with no section or stage of their own.
SWEEP = "sweep"  # bandwidth sweep after the verified all_gather
PAIRWISE = "pairwise"  # disjoint host pairs measured at once (in the full set's launch): names a slow host or link


class LinkFigure(TypedDict):
    """One link measured once in the launch: a host sending to another, the slowest of its ranks."""

    src: HostName
    dst: HostName
    phase: Annotated[int, Range(1)]  # the test's phase (from 1; the pairwise rounds count their own); the links of a phase ran at once
    source: Literal["ring", "pairwise", "repeat"]  # the neighbour ring, a pairwise round, a suspect's repeat
    repeat: Count  # 0: the ring or a round; from 1: which repeat
    # In a repeat: "round" (its shifted ring: its sender's sending, its receiver's receiving), "link" (a suspect link).
    of: list[Annotated[str, OneOf(("round", "link"))]]
    GBps: Amount
    ratio: Amount | None  # of the median link (the ring and rounds); None: no median
    outlier: bool  # under suspect_fraction of the median: a suspect
    # The share of its time the slowest rank's sender or receiver waited for a CPU while runnable (schedstat's run_delay,
    # summed over the rank's threads); None: unknown
    wait: Amount | None


class NeighbourHost(TypedDict):
    """One host as the speed judge found it, its sending and receiving apart."""

    host: HostName
    links: Count  # link figures it took part in, repeats included
    best_GBps: Amount  # its fastest first figure (ring or round), sending or receiving
    send_GBps: Amount | None  # what its sending's verdict rests on: a suspect's median repeat, else its best first figure
    recv_GBps: Amount | None  # the same of its receiving
    sending: VerdictName
    receiving: VerdictName
    # slow compute: its links are slow because its CPU is; cpu contention: slow only while its ranks waited for a CPU (PF624)
    verdict: Literal["ok", "slow network", "slow compute", "cpu contention"]


class _ComputeHost(TypedDict):

    host: HostName
    ranks: Annotated[int, Range(1)]
    tflops: Amount  # the dense matmul's rate: TFLOPS (1e12), on CPU too (the terminal shows GFLOPS there)
    slices: list[Amount]  # each slice of the probe as a ratio of the median host's same slice (its repeats)
    throttled_share: Amount | None  # of the probe's time, the share its CPU cgroup's quota held a rank back; None: unknown
    verdict: VerdictName
    outlier: bool  # named: warn or fail


class ComputeHost(_ComputeHost, total=False):
    """One host's compute probe: its slowest rank."""

    # per slice, the share of it that rank's matmul waited for a CPU (None: unknown); absent in reports written before
    # the probe measured it
    slices_waited: list[Amount | None]


class StartHost(TypedDict):
    """One host's own pace before any peer is waited for: the probe's seconds and torch's import (its slowest rank)."""

    host: HostName
    probe_s: Amount | None  # None: the facts carry no time
    import_s: Amount | None  # None: no rank of it reported one
    straggler: bool  # an outlier in either


class SpeedSettings(TypedDict):
    """The thresholds the judge applied (collective.speed.<backend>)."""

    suspect_fraction: Share
    fail_fraction: Share
    repeats: Count
    starved_repeats: Count  # at most this many more while a suspect was slow only in starved repeats


class NoiseSummary(TypedDict):
    """What this run could resolve: the figures of hosts and links not named, as ratios of the median link."""

    healthy_low: Amount | None  # None: no figure
    healthy_high: Amount | None
    mad_log: Amount | None  # the median of |ln(ratio)|: healthy figures lie within a factor e^mad_log of the median
    cleared: list[str]  # suspects that did not repeat: "h3 sending", "h1->h2"
    message: str


class RailHost(TypedDict):
    """One host on one rail: the links its rank on that rail sent and received, against that rail's median."""

    host: HostName
    interface: str  # the host's interface on the rail
    best_GBps: Amount | None  # its fastest first figure on the rail; None: not measured
    ratio: Amount | None  # best_GBps of the rail's median
    send_GBps: Amount | None  # what its sending's verdict on the rail rests on
    recv_GBps: Amount | None
    sending: VerdictName
    receiving: VerdictName
    verdict: Literal["ok", "slow network", "cpu contention"]  # cpu contention: slow on the rail only while starved (PF624)


class RailSpeed(TypedDict):
    """One rail judged on its own (preflight.collective.speed_rails): rank r of every host sends to rank r of the next."""

    rail: Count  # r, from 0, in the config's rail order
    median_GBps: Amount | None  # the rail's peers' median (the hosts' best first figures on it); None: no figure
    hosts: list[RailHost]
    slow_hosts: list[HostName]
    slow_links: list[HostPair]


class _SpeedSection(TypedDict):

    reference: Reference  # what the bandwidth was judged against; none: only against each other
    reference_message: str
    message: str  # the neighbour test's and compute probe's outcome in one line
    bytes: Count  # the neighbour test's message size
    settings: SpeedSettings
    links: list[LinkFigure]
    link_stats: Stats  # GB/s: the peers' median (the hosts' best first figures), the healthy figures' spread, the suspect line
    hosts: list[NeighbourHost]
    host_stats: Stats  # GB/s, over the hosts' best links
    slow_hosts: list[HostName]  # slow network
    slow_links: list[HostPair]  # [src, dst]
    compute: list[ComputeHost]
    compute_stats: Stats  # TFLOPS
    slow_compute: list[HostName]
    starts: list[StartHost]
    stragglers: list[HostName]
    noise: NoiseSummary


class SpeedSection(_SpeedSection, total=False):
    """Whether the speed was judged, against what, and each host beside the others."""

    rails: list[RailSpeed]  # a rail-optimized cluster's rails, each judged on its own; absent: one interface per host


class VerifySummary(TypedDict):
    """The verified all_gather: the payload per rank and the elements received wrong (nccl-tests' #wrong)."""

    bytes_per_rank: int
    wrong: int
    ranks: int


class SweepRow(TypedDict):
    """One (op, size) of the bandwidth sweep over every rank, GB/s as nccl-tests computes them."""

    op: str
    bytes: int
    ranks: int
    busbw_min_GBps: float
    busbw_mean_GBps: float
    algbw_mean_GBps: float


class ConfirmedSet(TypedDict):
    """The healthy hosts run together once more after splitting: the set emit-launch may launch without the culprits."""

    hosts: list[str]
    port: int
    status: RunStatus
    message: str


class IsolationSection(TypedDict):
    """What splitting a failing set found."""

    rounds: int
    culprits: list[str]
    healthy: list[str]
    note: str  # why no culprit was found, when none was
    confirmed: ConfirmedSet | None


class RepeatRun(TypedDict):
    """One run of a repeated collective (playbook.repeats)."""

    status: RunStatus
    phase: str | None
    message: str
    peak_busbw_GBps: float | None  # the sweep's best busbw (slowest rank); None without a sweep or a pass


class HostFigure(TypedDict):
    """One host's bandwidth in the sweep at one (op, size): the slowest of its ranks."""

    host: HostName
    ranks: Count
    busbw_GBps: Amount
    time_us: Amount  # the slowest of its ranks' time per operation
    outlier: bool


class HostSpread(TypedDict):
    """Every host's bandwidth at the sweep's largest size of one op, beside the median over hosts."""

    op: str
    bytes: Count
    spread: Spread
    hosts: list[HostFigure]


class PairFigure(TypedDict):
    """One pair of hosts measured by the pairwise stage."""

    hosts: HostPair  # the two hosts, the pair's master first
    round: Annotated[int, Range(1)]  # from 1
    status: RunStatus
    busbw_GBps: Amount  # the pair's GB/s (sendrecv: its slower way); 0 when its launch did not pass or a way is missing
    outlier: bool  # below the pair threshold
    message: str  # why the launch did not pass; empty when it did


class PairwiseHost(TypedDict):
    """One host as the pairwise stage judged it: its best pair, the fastest it ran with any partner."""

    host: HostName
    pairs: Count
    best_GBps: Amount | None  # None: in no pair
    verdict: Literal["ok", "slow", "untested"]


class PairwiseSection(TypedDict):
    """The pairwise stage: disjoint pairs at once, in the full set's launch (op sendrecv, a round-robin) or in launches of
    its own (op all_gather, suspects re-paired with known-good hosts); slow hosts and links."""

    status: Literal["pass", "fail", "skipped"]
    message: str
    mode: Literal["re-pair", "round-robin"]  # in the launch: round-robin; own launches: re-pair from 6 hosts, round-robin below
    op: str
    bytes: Count
    rounds: Count
    pairs: list[PairFigure]
    pair_spread: Spread  # over the first round's pairs (re-pair) or every pair (round-robin)
    hosts: list[PairwiseHost]
    host_spread: Spread  # over the hosts' best pairs
    slow_hosts: list[HostName]
    slow_links: list[HostPair]
    elapsed_s: Amount


class BaselineFigure(TypedDict):
    """One bandwidth figure of this run beside the median of the same figure in the cluster's past passing runs."""

    source: Literal["sweep", "host", "pairwise"]  # a sweep row, a host's sweep figure, a host's best pair
    op: str
    bytes: Count
    host: HostName  # "*" for a sweep row of the whole cluster
    GBps: Amount
    median_GBps: Amount
    runs: Annotated[int, Range(1)]  # past runs that had this figure
    change_percent: float  # (GBps - median) / median * 100: negative is slower
    noise_percent: Amount  # how far below the median the past figures' own spread reaches: 1 - e^(-outlier_mad_k * mad_log)
    below: bool  # more than collective.baseline_tolerance_percent below, and beyond noise_percent


class BaselineSection(TypedDict):
    """This run's bandwidth against the cluster's own history (state_dir/history)."""

    runs: Count  # past passing runs of the same cluster, hosts, backend and ranks per host compared with
    wanted: Annotated[int, Range(1)]  # collective.baseline_runs
    tolerance_percent: Percent
    message: str
    figures: list[BaselineFigure]


class RankTransport(TypedDict):
    """What one NCCL process said about its network (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET)."""

    host: str
    device: Count  # the CUDA device of the process
    network: str | None  # IB, Socket, or a plugin's network name; None: it did not say
    devices: list[str]  # the NICs NET/IB or NET/Socket uses, e.g. mlx5_0:1/IB
    gdr: bool | None  # GPUDirect RDMA used (a GDRDMA channel, or "GPU Direct RDMA Enabled")
    plugin: str | None  # the external net plugin it loaded
    channels: Count | None  # coll channels
    nccl_version: str | None
    reasons: list[str]  # the lines that explain a fallback (NCCL_IB_DISABLE set, NET/IB : No device found, ...)


class NcclDiagnosticLine(TypedDict):
    """One result line of NCCL's own active diagnostics (NCCL_RUN_DIAGNOSTICS=1, NCCL 2.31 on): "NCCL DIAG [OK] p2p: ..."."""

    host: str  # the host whose output holds the line (rank 0's process prints the report)
    level: Literal["OK", "INFO"]  # NCCL's tag: INFO is "a condition that may require review"
    check: str  # the check that spoke: p2p, net bw (active); GPU inventory, CUDA driver version, ECC, NVLink, NCCL environment (RAS)
    text: str  # NCCL's words after the check's name
    failed: bool  # a failed verification or a check that could not complete, as opposed to a note to review


class NcclDiagnostics(TypedDict):
    """What NCCL's own diagnostics (active and RAS) said at communicator init (schema 5 on)."""

    nccl_version: str  # the oldest version the ranks report, 2.31 or newer
    requested: bool  # the launch set NCCL_RUN_DIAGNOSTICS=1 and NCCL_RUN_RAS_DIAGNOSTICS=1 (the facts said 2.31 or newer)
    ran: bool  # a report came back ("NCCL DIAG" lines)
    summaries: list[str]  # each report's closing line: "NCCL diagnostics completed in 245.3 ms across 8 ranks", "RAS ..."
    results: list[NcclDiagnosticLine]


class _TransportSection(TypedDict):
    expected: Literal["IB", "Socket"]  # IB where a host has ACTIVE InfiniBand/RoCE ports and does not disable them
    message: str
    ranks: list[RankTransport]


class TransportSection(_TransportSection, total=False):
    """The network NCCL chose on every host (schema 5 on)."""

    diagnostics: NcclDiagnostics | None  # None: NCCL older than 2.31 (or its version unknown), which has none


class _CollectiveSection(TypedDict):
    backend: BackendName
    status: CollectiveStatus
    hosts: list[str]  # the hosts the collective was for, the master first
    master: str | None
    port: int
    nproc_per_node: int | None
    world_size: int | None
    message: str
    verify: VerifySummary | None
    sweep: list[SweepRow]
    isolation: IsolationSection | None


class CollectiveSection(_CollectiveSection, total=False):
    """The report's account of the collective stage."""

    phase: str | None  # where it failed or hung, or where a lost host went silent (status unknown)
    repeats: list[RepeatRun]  # one entry per run of the full set (playbook.repeats; the first failure ends them), in order
    per_host: list[HostSpread]  # schema 4 on: each op's largest sweep size, per host
    pairwise: PairwiseSection | None  # schema 4 on; None when the playbook has no pairwise stage
    baseline: BaselineSection | None  # schema 4 on; None when the collective did not pass
    transport: TransportSection | None  # schema 5 on: the network NCCL chose; None for gloo, or when it did not pass
    speed: SpeedSection | None  # schema 6 on: neighbour test, compute probe, start-up, the reference; None: did not pass
