"""The documents stages hand each other, typed: the part of the report (``schemas/report.schema.json``) that every
report holds whichever stages ran (its head, hosts and findings), and the launch document (``schemas/launch.schema.json``)
that emit-launch renders into every format. Each stage package types its own section in its ``contracts`` module, and
``preflight.report_shape`` composes the whole report above them, so nothing here imports a stage.

These are the JSON shapes exactly, as TypedDicts: producers build them and consumers index them by key, so a key
spelt wrong on either side fails type checking, and the JSON Schemas still judge a document read from a file.
"""

from __future__ import annotations

from typing import Annotated, Literal, TypedDict, get_args

from preflight.facts import HostFacts
from preflight.schema_marks import Amount, Format, Items, KeyPattern, MinLength, OneOf, Pattern, Range, Requires

Sha256 = Annotated[str, Pattern("^[0-9a-f]{64}$")]

FindingStatus = Literal["pass", "warn", "fail", "unknown"]
ReportStatus = Literal["pass", "fail", "incomplete"]
BackendName = Literal["nccl", "gloo"]
LaunchFormat = Literal["env", "torchrun", "json", "slurm"]  # what emit-launch renders the launch document into
# Here rather than in emit, whose imports (jsonschema) the command line's parser should not pay for.
LAUNCH_FORMATS: tuple[LaunchFormat, ...] = get_args(LaunchFormat)

REPORT_SCHEMA_VERSION = 8
# Schema 3 added the connectivity section; a schema 2 report (no such key) is still read by emit-launch. Schema 4 added
# the collective's per_host, pairwise and baseline; a schema 2 or 3 report has none of them. Schema 5 added the
# collective's transport (the network NCCL chose), the dcgm section, and hosts' facts of facts schema 2. Schema 6 added
# the storage section, an internal error's traceback to its finding (PF009), which no reader needs, and the
# collective's speed (the neighbour test, the compute probe, each host's start-up, what the speed was judged against).
# Schema 7 gave the speed section the shape of one judgement: each link's source and repeat, each host's sending and
# receiving, the compute probe's slices, the settings applied, and what the run could resolve. Schema 8 added the
# connectivity section's rails (each rail's paths) and each failed path's rail, on clusters with rails.
READABLE_REPORT_SCHEMAS = (2, 3, 4, 5, 6, 7, 8)


class _FindingEntry(TypedDict):
    code: Annotated[str, Pattern("^PF[0-9]{3}$")]  # PFnnn, see `preflight explain`
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
    status: FindingStatus  # the worst status of this host's findings; unknown when it could not be checked
    reason: str | None  # why the host has no facts (unreachable, probe failed); None when it has
    facts: HostFacts | None  # what the probe reported (schemas/facts.schema.json judges it)


class ReportHead(TypedDict):
    """What every report holds, whichever stages ran: the run, its verdict, its hosts and findings. The stages' sections
    follow these keys in the composed report (preflight.report_shape.Report); a reader that needs no section (the
    history) reads this."""

    schema: Annotated[int, OneOf(READABLE_REPORT_SCHEMAS)]  # REPORT_SCHEMA_VERSION when written; emit-launch reads these
    preflight_version: str
    created_at: Annotated[str, Format("date-time")]  # ISO 8601 with its UTC offset
    elapsed_s: Amount
    cluster: str
    playbook: str
    spec_digest: Sha256  # sha256 of the composed config the report was made for
    # sha256 of each config group that defines the job (compose.JOB_GROUPS): emit-launch refuses a report made for others
    config_digests: dict[str, Sha256]
    status: ReportStatus  # fail: a check failed; incomplete: a host could not be checked and nothing failed
    exit_code: Annotated[int, OneOf((0, 1, 3))]  # the status's exit code (errors.ExitCode): passed, failed, incomplete
    hosts: list[HostEntry]
    findings: list[FindingEntry]  # root cause first


# What a launch document's values may be (schemas/launch.schema.json is written from these types).
LaunchName = Annotated[str, Pattern("^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]
IPv4 = Annotated[str, Pattern(r"^(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])){3}$")]
# Variables by name, each value free of control characters (one line in an env file or a shell command).
Env = Annotated[dict[str, Annotated[str, Pattern(r"^[^\x00-\x1f\x7f]*$")]], KeyPattern("^[A-Z_][A-Z0-9_]*$")]
AtLeastOne = Annotated[int, Range(1)]
# What torchrun and a training script read on every host: the rendezvous, the host's place in it, and preflight's own.
HOST_ENV = ("MASTER_ADDR", "MASTER_PORT", "NNODES", "NPROC_PER_NODE", "NODE_RANK", "PET_NNODES", "PET_NPROC_PER_NODE",
            "PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_RDZV_ID", "PET_RDZV_CONF", "PET_LOCAL_ADDR", "PREFLIGHT_BACKEND",
            "PREFLIGHT_INIT_TIMEOUT_S")


class Workaround(TypedDict):
    """A finding's workaround applied to one host of a launch (launch.allow_workarounds)."""

    host: str
    code: Annotated[str, Pattern("^PF[0-9]{3}$")]
    env: Env
    why: str


class LaunchReportRef(TypedDict):
    """The report a launch was derived from."""

    path: str
    created_at: Annotated[str, Format("date-time")]
    status: ReportStatus
    spec_digest: Sha256


class LaunchMaster(TypedDict):
    """The host that serves the rendezvous."""

    host: LaunchName
    addr: IPv4  # MASTER_ADDR: an IPv4 address; loopback only for a one-host launch
    port: Annotated[int, Range(1, 65535)]


class Rendezvous(TypedDict):
    """torchrun's c10d rendezvous."""

    backend: Literal["c10d"]
    endpoint: Annotated[str, Pattern("^[0-9.]+:[0-9]{1,5}$")]
    id: Annotated[str, Pattern("^[A-Za-z0-9._-]+$")]
    join_timeout_s: AtLeastOne
    read_timeout_s: AtLeastOne


class Excluded(TypedDict):
    """A host left out by launch.exclude_failed, and why."""

    host: LaunchName
    reason: str


class LaunchHost(TypedDict):
    """One host's part of a launch: its environment and torchrun's arguments."""

    name: LaunchName
    node_rank: Annotated[int, Range(0)]
    is_host: bool  # true on the master only: it serves the c10d store
    local_addr: IPv4  # torchrun --local-addr: this host's IPv4
    ifname: str | None
    env: Annotated[Env, Requires(HOST_ENV)]
    torchrun_args: list[str]
    workarounds: list[Workaround]


class LaunchDocument(TypedDict):
    """What `preflight emit-launch --format json` prints: the launch that passed `preflight check`, per host. The env,
    torchrun and slurm formats are renderings of this document."""

    schema: Annotated[int, OneOf((1,))]
    preflight_version: str
    cluster: LaunchName
    report: LaunchReportRef  # the report this launch was derived from
    forced: bool  # true when --force overrode a refusal; forced_over says which
    forced_over: list[str]
    backend: BackendName
    master: LaunchMaster
    nnodes: AtLeastOne
    nproc_per_node: AtLeastOne
    world_size: AtLeastOne
    rendezvous: Rendezvous
    init_timeout_s: AtLeastOne  # for init_process_group(timeout=...): PREFLIGHT_INIT_TIMEOUT_S
    excluded: list[Excluded]  # hosts left out by launch.exclude_failed, and why
    torchrun: Annotated[str, MinLength(1)]
    script: Annotated[list[str], Items(1)]
    hosts: Annotated[list[LaunchHost], Items(1)]
