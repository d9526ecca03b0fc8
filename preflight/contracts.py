"""The documents stages hand each other, typed: the report (``schemas/report.schema.json``) that ``check``, ``gate``
and ``agent`` write and emit-launch and the renderer read, and the launch document (``schemas/launch.schema.json``)
that emit-launch renders into every format.

These are the JSON shapes exactly, as TypedDicts: producers build them and consumers index them by key, so a key
spelt wrong on either side fails type checking, and the JSON Schemas still judge a document read from a file.
"""

from __future__ import annotations

from typing import Literal, TypedDict, get_args

from preflight.collective.contracts import SpeedSection
from preflight.contracts_spread import Spread as Spread  # re-exported: the collective and the renderers import it from here
from preflight.facts import HostFacts
from preflight.storage.contracts import StorageSection

FindingStatus = Literal["pass", "warn", "fail", "unknown"]
ReportStatus = Literal["pass", "fail", "incomplete"]
RunStatus = Literal["pass", "fail", "hang", "unknown"]  # one launch of the collective; unknown: a host was lost under it
CollectiveStatus = Literal["pass", "fail", "hang", "unknown", "skipped"]
ConnectivityStatus = Literal["pass", "fail", "unknown", "skipped"]
PathResult = Literal["ok", "filtered", "refused", "no-route", "error"]  # one TCP connect, as the mesh test saw it
BackendName = Literal["nccl", "gloo"]
LaunchFormat = Literal["env", "torchrun", "json", "slurm"]  # what emit-launch renders the launch document into
# Here rather than in emit, whose imports (jsonschema) the command line's parser should not pay for.
LAUNCH_FORMATS: tuple[LaunchFormat, ...] = get_args(LaunchFormat)


class _FindingEntry(TypedDict):
    code: str  # PFnnn, see `preflight explain`
    status: FindingStatus
    host: str  # a host's name, or "*" for the whole cluster
    message: str
    remedy: str


class FindingEntry(_FindingEntry, total=False):
    """One finding as the report holds it."""

    workaround: dict[str, str]  # env that avoids the failure at a cost; reports of schema 1 lack it
    traceback: str  # schema 6 on, an internal error's (PF009) only: the exception's traceback, for a bug report


class HostEntry(TypedDict):
    """One host of the report: its status over its findings, why it could not be checked, and its facts."""

    name: str
    address: str
    status: FindingStatus
    reason: str | None  # why the host has no facts (unreachable, probe failed); None when it has
    facts: HostFacts | None


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
    peak_busbw_GBps: float | None


class HostFigure(TypedDict):
    """One host's bandwidth in the sweep at one (op, size): the slowest of its ranks."""

    host: str
    ranks: int
    busbw_GBps: float
    time_us: float  # the slowest of its ranks' time per operation
    outlier: bool


class HostSpread(TypedDict):
    """Every host's bandwidth at the sweep's largest size of one op, beside the median over hosts."""

    op: str
    bytes: int
    spread: Spread
    hosts: list[HostFigure]


class PairFigure(TypedDict):
    """One pair of hosts measured by the pairwise stage."""

    hosts: list[str]  # the two hosts, the pair's master first
    round: int  # from 1
    status: RunStatus
    busbw_GBps: float  # the pair's GB/s (sendrecv: its slower way); 0 when its launch did not pass or a way is missing
    outlier: bool  # below the pair threshold
    message: str  # why the launch did not pass; empty when it did


class PairwiseHost(TypedDict):
    """One host as the pairwise stage judged it: its best pair, the fastest it ran with any partner."""

    host: str
    pairs: int
    best_GBps: float | None  # None: in no pair
    verdict: Literal["ok", "slow", "untested"]


class PairwiseSection(TypedDict):
    """The pairwise stage: disjoint pairs at once, in the full set's launch (op sendrecv, a round-robin) or in launches of
    its own (op all_gather, suspects re-paired with known-good hosts); slow hosts and links."""

    status: Literal["pass", "fail", "skipped"]
    message: str
    mode: Literal["re-pair", "round-robin"]  # in the launch: round-robin; own launches: re-pair from 6 hosts, round-robin below
    op: str
    bytes: int
    rounds: int
    pairs: list[PairFigure]
    pair_spread: Spread  # over the first round's pairs (re-pair) or every pair (round-robin)
    hosts: list[PairwiseHost]
    host_spread: Spread  # over the hosts' best pairs
    slow_hosts: list[str]
    slow_links: list[list[str]]
    elapsed_s: float


class BaselineFigure(TypedDict):
    """One bandwidth figure of this run beside the median of the same figure in the cluster's past passing runs."""

    source: Literal["sweep", "host", "pairwise"]  # a sweep row, a host's sweep figure, a host's best pair
    op: str
    bytes: int
    host: str  # "*" for a sweep row of the whole cluster
    GBps: float
    median_GBps: float
    runs: int  # past runs that had this figure
    change_percent: float  # (GBps - median) / median * 100: negative is slower
    noise_percent: float  # how far below the median the past figures' own spread reaches: 1 - e^(-outlier_mad_k * mad_log)
    below: bool  # more than collective.baseline_tolerance_percent below, and beyond noise_percent


class BaselineSection(TypedDict):
    """This run's bandwidth against the cluster's own history (state_dir/history)."""

    runs: int  # past passing runs of the same cluster, hosts, backend and ranks per host compared with
    wanted: int  # collective.baseline_runs
    tolerance_percent: float
    message: str
    figures: list[BaselineFigure]


class RankTransport(TypedDict):
    """What one NCCL process said about its network (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET)."""

    host: str
    device: int  # the CUDA device of the process
    network: str | None  # IB, Socket, or a plugin's network name; None: it did not say
    devices: list[str]  # the NICs NET/IB or NET/Socket uses, e.g. mlx5_0:1/IB
    gdr: bool | None  # GPUDirect RDMA used (a GDRDMA channel, or "GPU Direct RDMA Enabled")
    plugin: str | None  # the external net plugin it loaded
    channels: int | None  # coll channels
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


class TransportSection(TypedDict):
    """The network NCCL chose on every host (schema 5 on)."""

    expected: Literal["IB", "Socket"]  # IB where a host has ACTIVE InfiniBand/RoCE ports and does not disable them
    message: str
    ranks: list[RankTransport]
    diagnostics: NcclDiagnostics | None  # None: NCCL older than 2.31 (or its version unknown), which has none


class DcgmTest(TypedDict):
    """One result of `dcgmi diag -j`."""

    category: str
    test: str
    gpus: str  # the GPU ids the result is for, as DCGM gives them ("0,1,2,3" or "3")
    status: str  # PASS, FAIL, WARN, SKIP
    warnings: list[str]


class DcgmHost(TypedDict):
    """What the dcgm stage found on one host."""

    host: str
    status: Literal["pass", "fail", "not run", "timed out", "error"]
    message: str
    version: str | None  # DCGM's version, from the document
    tests: list[DcgmTest]


class DcgmSection(TypedDict):
    """The dcgm stage (schema 5 on): `dcgmi diag -r LEVEL -j` on every host."""

    level: int
    timeout_s: float
    hosts: list[DcgmHost]


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
    repeats: list[RepeatRun]
    per_host: list[HostSpread]  # schema 4 on: each op's largest sweep size, per host
    pairwise: PairwiseSection | None  # schema 4 on; None when the playbook has no pairwise stage
    baseline: BaselineSection | None  # schema 4 on; None when the collective did not pass
    transport: TransportSection | None  # schema 5 on: the network NCCL chose; None for gloo, or when it did not pass
    speed: SpeedSection | None  # schema 6 on: neighbour test, compute probe, start-up, the reference; None: did not pass


class TcpPath(TypedDict):
    """One TCP connect of the connectivity test that did not succeed."""

    source: str
    destination: str
    address: str
    port: int
    rendezvous: bool  # the master's rendezvous port, rather than the destination's mesh listener
    result: PathResult
    detail: str


class MtuPath(TypedDict):
    """A do-not-fragment datagram at the source interface's MTU that never came back, while a smaller one did."""

    source: str
    destination: str
    mtu: int  # the source interface's MTU, the size that got no answer
    largest_passed: int | None  # the largest size tried that passed; None: no size passed


class LossPath(TypedDict):
    """Packet loss between two hosts: small UDP datagrams sent and echoed."""

    source: str
    destination: str
    sent: int
    echoed: int
    loss_percent: float
    rtt_ms: float | None  # median round trip of the echoed ones


class ConnectivitySection(TypedDict):
    """The report's account of the connectivity test that runs before torchrun: only what failed is listed, so that
    the report stays small at hundreds of hosts; the counts say what was tested."""

    status: ConnectivityStatus
    message: str
    master: str | None
    port: int  # the rendezvous port tested on the master
    hosts: list[str]  # the hosts tested, the master first
    mode: Literal["full", "sampled"]  # every pair, or each host towards a sample of peers
    tcp_tested: int  # TCP connects made, rendezvous ones included
    tcp_failed: list[TcpPath]
    mtu_tested: int  # (source, destination) pairs probed at the source's MTU
    mtu_failed: list[MtuPath]
    loss_tested: int
    loss_failed: list[LossPath]  # paths above connectivity.max_loss_percent
    loss_max_percent: float | None
    rtt_median_ms: float | None
    elapsed_s: float


class StageSections(TypedDict, total=False):
    """Each stage's section of the report, under the stage's name (spec.Stage); None, in a report, for a stage the run
    did not perform. A new stage with a section adds its key here and in schemas/report.schema.json."""

    collective: CollectiveSection | None
    connectivity: ConnectivitySection | None  # schema 3 on
    dcgm: DcgmSection | None  # schema 5 on
    storage: StorageSection | None  # schema 6 on; None also when no path is configured


class _Report(TypedDict):

    schema: int
    preflight_version: str
    created_at: str  # ISO 8601 with its UTC offset
    elapsed_s: float
    cluster: str
    playbook: str
    spec_digest: str
    config_digests: dict[str, str]  # config group -> sha256, for the groups that define the job
    status: ReportStatus
    exit_code: int
    hosts: list[HostEntry]
    findings: list[FindingEntry]  # root cause first


class Report(_Report, StageSections):
    """One run's report: what `check --json` prints and `state_dir/report.json` holds: its sections follow the
    findings, each present (None when the playbook did not run it) from the schema that added it on."""


class Workaround(TypedDict):
    """A finding's workaround applied to one host of a launch (launch.allow_workarounds)."""

    host: str
    code: str
    env: dict[str, str]
    why: str


class LaunchReportRef(TypedDict):
    """The report a launch was derived from."""

    path: str
    created_at: str
    status: ReportStatus
    spec_digest: str


class LaunchMaster(TypedDict):
    host: str
    addr: str
    port: int


class Rendezvous(TypedDict):
    backend: Literal["c10d"]
    endpoint: str
    id: str
    join_timeout_s: int
    read_timeout_s: int


class Excluded(TypedDict):
    host: str
    reason: str


class LaunchHost(TypedDict):
    """One host's part of a launch: its environment and torchrun's arguments."""

    name: str
    node_rank: int
    is_host: bool  # serves the c10d store
    local_addr: str
    ifname: str | None
    env: dict[str, str]
    torchrun_args: list[str]
    workarounds: list[Workaround]


class LaunchDocument(TypedDict):
    """The whole launch emit-launch derived; every output format renders this."""

    schema: int
    preflight_version: str
    cluster: str
    report: LaunchReportRef
    forced: bool
    forced_over: list[str]
    backend: BackendName
    master: LaunchMaster
    nnodes: int
    nproc_per_node: int
    world_size: int
    rendezvous: Rendezvous
    init_timeout_s: int
    excluded: list[Excluded]
    torchrun: str
    script: list[str]
    hosts: list[LaunchHost]
