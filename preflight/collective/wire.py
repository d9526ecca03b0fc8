"""What the worker (preflight/collective/host) reads and prints, typed: its config (written by preflight.collective.run, read
by host.config.WorkerConfig.from_json) and the events of a rank and of its host's supervisor, one JSON object a line
(written by host.events.event_line, read back by host.events.parse_lines and typed by preflight.collective.events). The
worker is shipped to hosts as one file: it imports these for the type checker only, so that a host needs nothing but the
script and torch."""

from __future__ import annotations

from typing import Literal, TypedDict


class SweepConfig(TypedDict):
    """What a launch measures after the verified all_gather, as the worker's config carries it."""

    sizes: list[int]  # total bytes per message, as nccl-tests counts them; empty: no sweep
    ops: list[str]  # among worker.SWEEP_OPS
    warmup: int  # untimed iterations per size
    iters: int  # timed iterations per size; with a time budget, at most this many
    # Adaptive: the timed iterations fill about this many seconds per size (at least 1, at most iters), and the sizes stop
    # growing once busbw has plateaued; None: every size, iters iterations each.
    time_per_size_s: float | None


class WorkerConfigJson(TypedDict):
    """The worker's config, the JSON argument of each rank and of its host's supervisor. Every key is required and no
    other is taken: the host refuses a config that lacks one or carries another (worker.CONFIG_KEYS, held to these
    keys by a test), so a misspelt key fails the launch, and the type checker, instead of leaving a test out."""

    run_id: str  # names the launch; it is in every worker's command line, so `pgrep -f` finds a run's processes
    backend: str  # nccl or gloo
    seed: int  # with the rank, derives the verified payload
    host: str  # the cluster's name for this host, in every event
    deadlines_s: dict[str, float]  # per phase (worker.PHASES, each one and no other), from the phase's start
    verify_bytes: int  # payload per rank of the verified all_gather, at least 4
    sweep: SweepConfig
    compute_s: float  # the compute probe's matmuls fill about this long; 0: no probe
    neighbour_s: float  # each phase of the neighbour test sends for about this long; 0: no neighbour test
    neighbour_bytes: int  # per message of the neighbour test, at least 4
    suspect_fraction: float  # a host's sending or receiving, or a link, under this fraction of the median is a suspect
    repeats: int  # each suspect is measured again this many times (0 to 20); 0: none
    starved_repeats: int  # then at most this many more while fewer than repeats of a suspect's figures count (0 to 20; plans.unresolved)
    starved_fraction: float  # a slow sample whose ranks waited for a CPU this share of it or more is starved: no evidence
    neighbour_ring: bool  # the ring; false: only the pair rounds (a launch of the pairwise stage)
    # The pairwise stage's rounds, measured after the ring (worker.pair_round_phases): per round, its disjoint pairs of
    # hosts (the cluster's names), each pair a two-item array in JSON; empty: none.
    pair_rounds: list[list[tuple[str, str]]]
    # Rails per host (0 to 64): each local rank is bound to one (preflight/rail_env.py), and the neighbour test's suspects
    # and repeats are found rail by rail; 0: one interface, every rank's figures taken together.
    rails: int


class Identity(TypedDict):
    """Who a rank is, as every rank gathers it in the identity phase."""

    host: str  # the cluster's name for the host
    hostname: str  # the host's own name for itself
    rank: int
    local_rank: int
    gpu_uuid: str | None  # None on gloo
    torch: str
    nccl: str | None  # None on gloo


class VerifyResult(TypedDict):
    """The verified all_gather as one rank received it."""

    bytes: int  # payload per rank
    elements: int  # received in all
    wrong: int
    wrong_by_source_rank: dict[str, int]  # JSON's keys are strings


class SweepResult(TypedDict):
    """One (op, size) of one rank's sweep."""

    op: str
    bytes: int  # the size asked for; the rates use the bytes really moved (sweep_bytes)
    time_us: float
    algbw_GBps: float
    busbw_GBps: float


class PeerFailure(TypedDict):
    """What the first rank to fail posts in torchrun's store, and its peers repeat in their error's ``after``."""

    rank: int
    host: str
    phase: str
    error: str


class PhaseEvent(TypedDict):
    """A rank enters a phase."""

    event: Literal["phase"]
    phase: str
    rank: int
    local_rank: int
    host: str
    pid: int
    t: float  # seconds since the rank started


class ComputeResult(TypedDict):
    """One rank's compute probe: a fixed square matmul repeated for a bounded time, as mamf-finder measures."""

    n: int  # the matrices' side
    dtype: str  # float32 on CPU, bfloat16 on GPU
    iters: int
    seconds: float
    tflops: float  # 2 * n**3 * iters / seconds / 1e12
    throttled_s: float | None  # of those seconds, how long the rank's CPU cgroup was held back by its quota; None: unknown
    slices_tflops: list[float]  # the same per slice, one per repeat of the speed judge, spread over the launch (COMPUTE_POINTS)
    slices_waited: list[float | None]  # per slice, the share of it the matmul's thread waited for a CPU; None: unknown


class LinkResult(TypedDict):
    """One timed send of the neighbour test: this rank to its counterpart (same local rank) on another host."""

    src: str  # the sending host (this rank's)
    dst: str  # the receiving host
    local_rank: int
    rail: int  # the rail this rank is bound to (rail_env.rail_of); 0 without rails
    phase: int  # the test's phase (1 first): the links of a phase run at once, no rank in two of them
    bytes: int  # per message
    messages: int
    seconds: float
    GBps: float  # bytes * messages / seconds / 1e9
    repeat: int  # 0: the ring or a pair round; from 1: a repeat of the suspects (worker.repeat_plan)
    of: list[str]  # in a repeat: "round" (the repeat's shifted ring) or "link" (a suspect link measured again); empty before
    # The share of the seconds the sender's rank, and the receiver's, waited for a CPU while runnable (schedstat's run_delay,
    # summed over the rank's threads, so above 1 where two waited at once): a loaded host's, not its link's; None: unknown.
    send_wait: float | None
    recv_wait: float | None


class _ResultEvent(TypedDict):
    event: Literal["result"]
    rank: int
    local_rank: int
    world_size: int
    host: str
    hostname: str
    gpu_uuid: str | None
    torch: str
    nccl: str | None
    identity: list[Identity] | None  # every rank's, on rank 0 only
    problems: list[str]  # what the identities say is wrong (identity_problems)
    verify: VerifyResult
    sweep: list[SweepResult]
    phases_s: dict[str, float]


class ResultEvent(_ResultEvent, total=False):
    """A rank's last word when every phase passed (exit 0)."""

    import_s: float  # from the rank's start to torch imported: its host's own pace, before any peer is waited for
    compute: ComputeResult | None  # None: no compute probe in this launch
    links: list[LinkResult]  # the neighbour test's sends of this rank; empty: no neighbour test in this launch
    pair_links: list[LinkResult]  # the pairwise stage's rounds, sent by this rank (phases of their own); empty: none


class _ErrorEvent(TypedDict):
    event: Literal["error"]
    phase: str
    rank: int | None  # None: it failed before torchrun's RANK could be read
    local_rank: int | None
    host: str | None  # None: it failed before its config could be read
    error: str  # the exception, in one line
    t: float


class ErrorEvent(_ErrorEvent, total=False):
    """A rank's last word when it failed (exit 1)."""

    pid: int  # absent when it failed before its run began
    after: PeerFailure  # it was stopped because this peer failed
    unix_s: float  # when its run failed, by the host's clock: unlike t, comparable across hosts that started apart


class _TimeoutEvent(TypedDict):
    event: Literal["timeout"]
    phase: str
    rank: int | None  # None when the supervisor cuts a rank whose events never said it
    local_rank: int
    host: str
    pid: int | None
    deadline_s: float


class TimeoutEvent(_TimeoutEvent, total=False):
    """A rank past its phase's deadline (exit 3): from its own watchdog, or from its host's supervisor when the rank
    was too stuck to end itself."""

    t: float  # the watchdog's; the supervisor does not keep the rank's clock
    stuck: bool  # the supervisor's: the rank's own watchdog could not run


class CutEvent(TypedDict):
    """The host's supervisor ended torchrun (see Supervisor)."""

    event: Literal["cut"]
    host: str
    reason: str


Event = PhaseEvent | ResultEvent | ErrorEvent | TimeoutEvent | CutEvent
