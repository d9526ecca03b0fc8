"""The typed configuration: one dataclass per Hydra config group, registered in a ConfigStore.

Every field is documented where it is declared. The YAML under ``conf/`` is merged onto these dataclasses, so an unknown
key or a wrong type is caught by OmegaConf before anything else; the JSON Schema in ``schemas/spec.schema.json``, written
from these types (``python3 -m preflight.schemas_gen``; each field's comment is its description, each mark of
preflight.schema_marks a keyword), then checks values (host names, ports, specifiers, no shell metacharacters) across the
composed result. Every number has a range: counts from 1, timeouts and deadlines above 0 and at most a day, never NaN or inf.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from enum import Enum
from functools import cache
from typing import Annotated, Any

from preflight.schema_marks import Format, Items, Keys, MinLength, OneOf, Pattern, Range

# OmegaConf's marker of a value the config must supply. Spelled here rather than imported, so that the many
# modules that only read a config never load OmegaConf (0.15 s) for it.
MISSING: Any = "???"


class TransportKind(str, Enum):
    local = "local"
    ssh = "ssh"


class Backend(str, Enum):
    auto = "auto"
    nccl = "nccl"
    gloo = "gloo"


class HostKeyPolicy(str, Enum):
    """How SshConfig.host_key_policy's values are spelled in code."""

    strict = "strict"
    accept_new = "accept-new"


# What the values may be, in the types (preflight.schema_marks; schemas/spec.schema.json is written from them). Every
# string that could reach a command line has a strict format (schema_check.py's formats).
GIB, TIB, PIB = 1 << 30, 1 << 40, 1 << 50
Name = Annotated[str, Format("name")]
PathStr = Annotated[str, Format("path")]  # a path or command without spaces or shell metacharacters
Interface = Annotated[str, Format("interface-or-auto")]
# One interface per rail, in rail order: each a real name (never auto), none twice, at most 64 rails.
Rails = Annotated[list[Annotated[str, Format("interface")]], Items(maximum=64, unique=True)]
Specifier = Annotated[str, Format("pep440-specifier")]
Prose = Annotated[str, Format("prose")]  # shown to people, never run
Code = Annotated[str, Format("finding-code")]
Timeout = Annotated[float, Range(0, 86400, above=True)]  # seconds, above 0 and at most a day
Seconds = Annotated[int, Range(1, 86400)]  # whole seconds, at most a day
Fraction = Annotated[float, Range(0, 1)]
# A stage's name as a playbook gives it: well-formed here; preflight.stage_list says which names a run knows (each stage's,
# and the collective's sweep and pairwise), so that a stage's package adds its name without a change here.
StageName = Annotated[str, Pattern("^[a-z][a-z0-9_]{0,31}$")]


@dataclass
class HostSpec:
    """One machine of the cluster."""

    name: Name = MISSING  # unique name used in findings and reports
    address: Annotated[str, Format("host")] = MISSING  # host name or IP used to reach it (SSH) and to rendezvous
    transport: TransportKind = TransportKind.ssh  # local: this machine, no SSH
    user: Annotated[str, Format("user")] | None = None  # SSH user; None: from ~/.ssh/config, else the current user
    port: Annotated[int, Range(1, 65535)] | None = None  # SSH port; None: from ~/.ssh/config, else 22
    identity: PathStr | None = None  # SSH private key file
    jump: Annotated[str, Format("jump")] | None = None  # SSH jump host, [user@]host[:port]
    python: PathStr = "auto"  # python of the training environment; auto: this one (local) or python3
    gpus: Annotated[str, Format("count-or-auto")] = "auto"  # GPUs expected: a count (0 for a CPU host), or auto (whatever is found)
    interface: Interface = "auto"  # socket interface for the collective; auto: network.socket_ifname
    # The host's rails, one interface per rail in rail order (rail r meets every host's rail r on one switch and subnet);
    # []: network.interfaces; where both are empty the host has one rail, its socket interface (`interface`).
    interfaces: Rails = field(default_factory=list)


@dataclass
class ClusterConfig:
    """Which hosts make up the cluster."""

    name: Name = MISSING  # the cluster's name, shown in reports
    master: Name = MISSING  # name of the host that serves the rendezvous (MASTER_ADDR)
    hosts: Annotated[list[HostSpec], Items(1)] = field(default_factory=list)  # the machines: at least one, no upper bound

    def host(self, name: str) -> HostSpec | None:
        """The host called name, or None."""
        return next((h for h in self.hosts if h.name == name), None)


@dataclass
class DenyEntry:
    """A version known to break distributed training."""

    component: Annotated[str, OneOf(("driver", "cuda_driver", "torch", "torch_cuda", "nccl"))] = MISSING  # the pin it breaks
    specifier: Annotated[Specifier, MinLength(1)] = MISSING  # PEP 440 specifier matching the bad versions, e.g. ==545.23.08
    reason: Annotated[Prose, MinLength(1)] = MISSING  # what breaks, and the fix
    # Variables that avoid the breakage at a cost; emit-launch sets them only with launch.allow_workarounds.
    workaround_env: Annotated[dict[str, Annotated[str, Format("argument")]], Keys("env-name")] = field(default_factory=dict)
    source: Prose = ""  # where the breakage is documented: an issue or release-notes address


@dataclass
class PinsConfig:
    """Versions every host must have; each a PEP 440 specifier, empty for any."""

    driver: Specifier = ""  # NVIDIA driver, e.g. >=535.104
    cuda_driver: Specifier = ""  # CUDA version the driver supports (driver API), e.g. >=12.2
    torch: Specifier = ""  # torch version, local tags such as +cu130 allowed
    torch_cuda: Specifier = ""  # the CUDA version torch was built for
    nccl: Specifier = ""  # the NCCL torch loads
    denylist: list[DenyEntry] = field(default_factory=list)


@dataclass
class NetworkConfig:
    """How ranks reach each other."""

    socket_ifname: Interface = "auto"  # interface for NCCL/gloo sockets; auto: the one routing to master
    ib_hca: list[Annotated[str, Format("hca")]] = field(default_factory=list)  # InfiniBand HCAs expected ACTIVE, e.g. mlx5_0
    # Every host's rails, one interface per rail in rail order, where a host names none of its own (HostSpec.interfaces).
    interfaces: Rails = field(default_factory=list)
    mtu: Annotated[int, Range(68, 65536)] | None = None  # expected MTU on the socket interface, 68 to 65536; None: not checked
    # Rendezvous port on the master; 0: the check picks a free one there (emit-launch reuses it).
    master_port: Annotated[int, Range(0, HIGHEST_PORT)] = 29500
    # The golden topology per hardware (PF827): a GPU name (matched as a substring, e.g. "H100 80GB HBM3") -> the layout
    # line PF826 prints for a good host of that hardware, e.g. "8 GPUs, 8 RDMA NICs, 4 NVSwitches on NUMA nodes [0, 1], ...".
    golden_topology: dict[str, Annotated[Prose, MinLength(1)]] = field(default_factory=dict)


HIGHEST_PORT = 65535


# The collective's launches besides the full set's run on ports derived from the rendezvous port, each on its group's
# first host (the rendezvous host): these say which, so that the range check and the launches agree. A round's launches
# run at once, each group on a port of its own (two first hosts may be one machine) up to DERIVED_PORTS groups; group k
# of a larger round takes k % DERIVED_PORTS's, on another first host, so no cluster size runs out of ports.
DERIVED_PORTS = 1000


def split_port(port: int, k: int) -> int:
    """The port of the k-th group (from 0) of a splitting round or of a pairwise round."""
    return port + 1 + k % DERIVED_PORTS


def alone_port(port: int, k: int, variant: int = 0) -> int:
    """The port of host k (from 0) run alone after a failed nccl set: as is (variant 0), then with P2P (1) or SHM (2) off;
    a retry's port is not the first run's, which a launch cut at its deadline may still hold."""
    return port + 100 + 3 * (k % DERIVED_PORTS) + variant


def highest_derived_port(port: int, hosts: int) -> int:
    """The highest port the collective may derive from port over this many hosts (at most 3,099 above it)."""
    groups = min(hosts, DERIVED_PORTS)
    return max(split_port(port, groups - 1), alone_port(port, groups - 1, 2))


@dataclass
class TrainingConfig:
    """How the job will run."""

    backend: Backend = Backend.auto  # auto: nccl where GPUs are found, else gloo
    # Ranks per host: a count from 1 to 9999, or auto (GPUs; else 1, 2 on a one-host cluster).
    nproc_per_node: Annotated[str, Format("positive-count-or-auto")] = "auto"
    init_timeout_s: Seconds = 600  # init_process_group(timeout=...) of the job, whole seconds
    rendezvous_timeout_s: Seconds = 900  # torchrun's c10d join_timeout, whole seconds
    gpu_mig: bool = False  # the GPUs are meant to run in MIG mode (PF407, PF869): a rank per MIG instance, no NCCL across


@dataclass
class ThresholdsConfig:
    """Limits the checks apply."""

    dev_shm_min_bytes: Annotated[int, Range(0, PIB)] = 1 << 30  # Docker's 64 MiB default breaks NCCL's shared memory; 0 (none) to 1 PiB
    gpu_memory_used_max_fraction: Fraction = 0.05  # memory already in use on a GPU before the job, 0 to 1
    clock_skew_max_s: Timeout = 2.0  # between hosts, after correcting for the SSH round trip
    xid_window_h: Annotated[float, Range(0, 24, above=True)] = 2.0  # Xid/SXid lines this recent count (PF801, PF802); 24: lookback
    gpu_temperature_max_c: Annotated[int, Range(30, 120)] = 85  # a GPU hotter than this (degrees Celsius) before the job warns (PF861)
    cpu_quota_min_fraction: Fraction = 0.5  # a CPU quota under this share of the median host's, or under one CPU per rank, fails (PF206)
    nofile_min: Annotated[int, Range(0, 1 << 30)] = 4096  # a soft open-file limit under this warns (PF208): 1024 runs DataLoaders dry
    tmp_min_free_bytes: Annotated[int, Range(0, PIB)] = GIB  # less free in TMPDIR or /tmp fails (PF209): torch.compile's ENOSPC
    local_ports_gloo_groups: Annotated[int, Range(0, 1024)] = 1  # gloo groups whose listeners need free local ports (PF310); 0: off


@dataclass
class SshConfig:
    """How hosts are reached over SSH."""

    parallelism: Annotated[int, Range(1, 1024)] = 64  # hosts contacted at once, as pdsh's default fan-out; 1 to 1024
    connect_timeout_s: Timeout = 10.0  # TCP connect plus SSH banner and authentication
    command_timeout_s: Timeout = 60.0  # each remote command, enforced on the host and locally
    run_timeout_s: Timeout = 600.0  # the whole run of every stage
    # strict, or accept-new: record unknown keys (never changed ones), as OpenSSH's accept-new.
    # A plain string because OmegaConf matches enums by member name, and accept-new is no name.
    host_key_policy: Annotated[str, OneOf(tuple(p.value for p in HostKeyPolicy))] = HostKeyPolicy.strict.value
    known_hosts: PathStr | None = None  # extra known_hosts file besides the system and user ones
    ssh_config: PathStr | None = None  # OpenSSH client config; None: ~/.ssh/config when present
    # With nothing received from a host for this long, ask it for a reply, as OpenSSH's ServerAliveInterval; 0.1 to 3600.
    keepalive_interval_s: Annotated[float, Range(0.1, 3600)] = 5.0
    # A host silent for keepalive_interval_s times this many is lost (a powered-off host, a pulled cable: no RST comes):
    # its connection is closed and its command ends "lost", as ServerAliveCountMax; 2 to 100 (1 would give no reply time).
    keepalive_count_max: Annotated[int, Range(2, 100)] = 3


@dataclass
class BandwidthProfile:
    """Bandwidth a known hardware layout must reach, as nccl-tests measures busbw."""

    gpu_name: Name = MISSING  # matched as a substring of the GPU name, e.g. H100
    gpus_per_host: Annotated[int, Range(1, 9999)] = MISSING  # the profile's GPUs per host, 1 to 9999
    min_bytes: Annotated[int, Range(0, TIB)] = 1 << 30  # thresholds apply to messages at least this large (at most 1 TiB)
    all_reduce_busbw_gbps: Annotated[float, Range(0, 100000)] = 0.0  # 0: no threshold; at most 100000
    all_gather_busbw_gbps: Annotated[float, Range(0, 100000)] = 0.0  # 0: no threshold; at most 100000
    matmul_tflops: Annotated[float, Range(0, 100000)] = 0.0  # the compute probe's dense bf16 matmul each GPU must reach; 0: no threshold


@dataclass
class SpeedVerdicts:
    """How the speed judge names a slow host, link or CPU from the full set's launch (PF620-PF624, PF607, PF608), on one backend.
    Field decisions, each named with the fault it catches; the same on both backends by default. A verdict rests on repeats."""

    # A host's sending, receiving or matmul, or a link, under this fraction of the median is a suspect, measured again; 0 to 1.
    suspect_fraction: Fraction = 0.7
    # A suspect under this fraction of the median in every repeat fails: a NIC at half rate or worse, a 10GbE port at 1GbE (0.1),
    # a PCIe link trained down (x16 to x8: 0.5), a bad transmit lane; only under suspect_fraction warns. 0 to 1, <= suspect_fraction.
    fail_fraction: Fraction = 0.5
    # Each suspect is measured again this many times, with another known-good partner where there is one, its sending and
    # receiving apart (and a suspect link itself); 0 judges the first figure alone. 0 to 20.
    repeats: Annotated[int, Range(0, 20)] = 3
    # More repeats while fewer than `repeats` of a suspect's figures count (the rest starved: no evidence): a host whose CPUs
    # another process holds (a previous job's leftover) stays starved, PF624; a passing contention clears. 0 to 20; 0: none.
    starved_repeats: Annotated[int, Range(0, 20)] = 3
    # A rank held back by its cgroup's CPU quota this share of the compute probe or more fails PF622 (--cpus, a pod's limit); 0-1.
    throttled_share: Fraction = 0.2
    starved_fraction: Fraction = 0.5  # a slow sample whose ranks waited for a CPU this share of it: CPU contention (PF624), not its link
    # A start-up straggler (PF623 warns: a cold network filesystem under the python environment, a loaded host) is an outlier
    # of the hosts' start-up rates and at least this many seconds behind the median host. 0 to 3600.
    straggler_min_s: Annotated[float, Range(0, 3600)] = 1.0


@dataclass
class SpeedConfig:
    """The speed judge's settings per backend: nccl (GPUs, the NICs move the bytes) and gloo (CPUs, whose cores move
    the bytes through sockets)."""

    nccl: SpeedVerdicts = field(default_factory=SpeedVerdicts)
    gloo: SpeedVerdicts = field(default_factory=SpeedVerdicts)

    def of(self, backend: Backend) -> SpeedVerdicts:
        """The settings of one backend."""
        return self.nccl if backend == Backend.nccl else self.gloo


@dataclass
class CollectiveConfig:
    """The cross-host test: torchrun on every host, a verified all_gather, a bandwidth sweep."""

    rendezvous_timeout_s: Timeout = 30.0  # every host joins torchrun's c10d rendezvous
    init_timeout_s: Timeout = 60.0  # init_process_group, and the first connections between ranks
    identity_timeout_s: Timeout = 30.0  # all_gather_object of each rank's host, GPU and versions
    verify_timeout_s: Timeout = 60.0  # the verified all_gather
    sweep_timeout_s: Timeout = 300.0  # the whole bandwidth sweep
    finish_timeout_s: Timeout = 30.0  # the closing barrier and destroy_process_group
    verify_bytes: Annotated[int, Range(4, 16 * GIB)] = 4 << 20  # payload per rank of the verified all_gather, from one int32 element
    seed: Annotated[int, Range(0, 2**63 - 1)] = 1234  # payloads are derived from the seed and the rank; 0 to 2**63-1
    sweep_min_bytes: Annotated[int, Range(1, TIB)] | None = None  # None: 1 MiB for nccl, 64 KiB for gloo; at most sweep_max_bytes
    sweep_max_bytes: Annotated[int, Range(1, TIB)] | None = None  # None: 1 GiB for nccl, 64 MiB for gloo; 1 to 1 TiB
    # None: all_gather and all_reduce on nccl; all_reduce on gloo, the collective of the CPU data-parallel jobs gloo
    # runs (its all_gather is verified byte for byte all the same), at half a sweep's cost; [] measures none.
    sweep_ops: Annotated[list[Annotated[str, OneOf(("all_gather", "all_reduce"))]], Items(unique=True)] | None = None
    warmup: Annotated[int, Range(0, 1000)] = 5  # untimed iterations per size, 0 to 1000
    iters: Annotated[int, Range(1, 10000)] = 20  # timed iterations per size, 1 to 10000 (with sweep_adaptive, at most this many)
    # Adaptive sweep: the timed iterations of each size fill about sweep_time_per_size_s (at most iters; where one
    # iteration takes half of it or more, the one timed to choose the counts is the figure), its warm-ups half of it (at
    # most warmup, at least 1 untimed), and
    # the sizes stop growing once busbw gained under 5% over two doublings in a row (the link is full) or once one
    # iteration took the slowest rank 20 times sweep_time_per_size_s (1 s: a link far too slow for larger sizes). False: every
    # size from sweep_min_bytes to sweep_max_bytes, iters iterations each.
    sweep_adaptive: bool = True
    sweep_time_per_size_s: Annotated[float, Range(0.001, 3600)] = 0.05  # 0.001 to 3600
    isolate: bool = True  # when the full set fails or hangs, split it to find the culprit hosts
    profiles: list[BandwidthProfile] = field(default_factory=list)
    # A host's or a pair's GB/s is an outlier (a slow host or link, PF607/PF608) when it is below both median *
    # e^(-outlier_mad_k * MAD), the MAD taken of ln(GB/s / median), and outlier_fraction of the median, over figures
    # measured alike (preflight.spread).
    outlier_mad_k: Annotated[float, Range(0, 1000)] = 4.0  # 0 to 1000
    outlier_fraction: Fraction = 0.5  # 0 to 1
    # The full set's launch measures each rank's compute (a fixed matmul, GFLOPS on CPU, TFLOPS on GPU) and each host's links to its ring
    # neighbours (point-to-point, phase by phase), so a slow host or link is named without a second launch (PF620-PF623).
    compute_time_s: Annotated[float, Range(0, 60)] = 0.3  # the compute probe's matmuls fill about this long; 0: no probe; at most 60
    neighbour_time_s: Annotated[float, Range(0, 60)] = 0.15  # each phase of the neighbour test sends for about this long; 0: no test
    neighbour_bytes: Annotated[int, Range(4, 16 * GIB)] | None = None  # per message of the neighbour test; None: 64 MiB nccl, 1 MiB gloo
    # The pairwise stage's rounds run in the full set's launch, timed as the neighbour test (its time and bytes); with
    # neighbour_time_s 0 it runs launches of its own, which these two size.
    pairwise_bytes: Annotated[int, Range(4096, TIB)] | None = None  # its own launches' message size; None: the sweep's largest
    pairwise_iters: Annotated[int, Range(1, 10000)] = 5  # timed iterations per pair of its own launches after one warm-up, 1 to 10000
    baseline_runs: Annotated[int, Range(1, 1000)] = 10  # PF613 compares with the median of this cluster's last this many passing runs
    # PF613 warns on a figure more than this far below that median (a degraded fabric, a switch port renegotiated down,
    # a driver update that slowed the collective), and beyond the past runs' own spread; 0 to 100
    baseline_tolerance_percent: Annotated[float, Range(0, 100)] = 15.0
    speed: SpeedConfig = field(default_factory=SpeedConfig)  # the speed judge's thresholds, per backend


@dataclass
class ConnectivityConfig:
    """The test before torchrun, on the interface the job will use: every host connects to the master's rendezvous
    port and to a listener on its peers (gloo and NCCL open a full mesh on ephemeral ports), sends do-not-fragment
    datagrams at its interface's MTU, and counts the echoes of small datagrams (packet loss)."""

    join_timeout_s: Annotated[float, Range(1, 600)] = 10.0  # every host registers at the master's rendezvous port within this, 1 to 600
    connect_timeout_s: Annotated[float, Range(0.5, 60)] = 3.0  # a TCP connect unanswered this long is "filtered" (the SYN is resent at 1 s)
    full_mesh_max_hosts: Annotated[int, Range(2, 4096)] = 64  # every ordered pair is tested up to this many hosts, 2 to 4096
    # Beyond full_mesh_max_hosts, each host tests this many peers: its ring neighbours at 1, 2, 4, 8, ... hosts ahead,
    # then peers drawn at random (seeded by collective.seed), so every host is a source and a destination. 1 to 4096
    sample_peers: Annotated[int, Range(1, 4096)] = 16
    loss_peers: Annotated[int, Range(0, 64)] = 4  # each host sends loss datagrams to the next this many hosts of the ring, 0 to 64
    loss_probes: Annotated[int, Range(1, 10000)] = 50  # datagrams per loss path, 1 to 10000
    loss_window_s: Annotated[float, Range(0, 60)] = 0.25  # the loss datagrams are paced over this long, 0 to 60
    echo_grace_s: Annotated[float, Range(0.1, 60)] = 1.0  # how long after the last datagram an echo still counts, 0.1 to 60
    max_loss_percent: Annotated[float, Range(0, 100)] = 2.0  # a path losing more than this fails (PF612), 0 to 100
    mtu_probe: bool = True  # send do-not-fragment datagrams at each interface's MTU to every peer tested (PF611)


@dataclass
class DcgmConfig:
    """The optional dcgm stage: NVIDIA DCGM's diagnostic on every host that has dcgmi."""

    level: Annotated[int, Range(1, 4)] = 1  # dcgmi diag -r LEVEL: 1 (seconds, deployment checks) to 4 (hours)
    timeout_s: Timeout = 300.0  # the diagnostic's deadline on each host; a host past it is "timed out", not failed


@dataclass
class StoragePath:
    """A folder the job writes to or reads from, checked from every host at once."""

    path: Annotated[str, Format("absolute-path")] = MISSING  # an absolute path, the same on every host
    shared: bool = False  # one filesystem seen by every host (a checkpoint folder on NFS, Lustre, ...); false: each host's own
    min_free_bytes: Annotated[int, Range(0, PIB)] = 0  # less free space than this (for the training user) fails, 0 to 1 PiB
    write_bytes: Annotated[int, Range(4096, 16 * GIB)] = 8 << 20  # each host writes and reads back this much for its throughput figure


@dataclass
class StorageConfig:
    """The storage stage: the job's checkpoint and data paths, as the training user, from every host at once."""

    paths: list[StoragePath] = field(default_factory=list)  # none: the stage is skipped
    timeout_s: Timeout = 30.0  # each of the stage's rounds on each host (write, read, clean up) ends by this


@dataclass
class PlaybookConfig:
    """Which stages a run performs."""

    name: Name = MISSING  # the playbook's name
    stages: Annotated[list[StageName], Items(1, unique=True)] = field(default_factory=lambda: ["facts"])  # facts runs always
    checks: list[Code] = field(default_factory=list)  # only these finding codes are evaluated; empty: every code
    skip_checks: list[Code] = field(default_factory=list)  # finding codes not to evaluate
    repeats: Annotated[int, Range(1, 1000)] = 1  # the collective (and its sweep) runs this many times; a failure ends it
    # The probe's deadline on each host, and the SSH run's, when shorter than ssh.*: a gate must answer before
    # the scheduler kills it (Slurm's HealthCheckProgram at 60 s). None: ssh.command_timeout_s and ssh.run_timeout_s.
    deadline_s: Timeout | None = None


@dataclass
class LaunchConfig:
    """What `preflight emit-launch` adds to the launch the check tested, and when it refuses."""

    max_report_age_h: Annotated[float, Range(0, 8760, above=True)] = 24.0  # refuse a report older than this (--force overrides, says so)
    exclude_failed: bool = False  # leave out the hosts that failed and resize; false: refuse while any failed
    allow_workarounds: bool = False  # apply a finding's env workaround (e.g. NCCL_P2P_DISABLE=1) instead of refusing
    rdzv_read_timeout_s: Seconds = 60  # torchrun's c10d read_timeout; its join_timeout is training.rendezvous_timeout_s
    # The NCCL watchdog's monitor aborts a rank whose watchdog is stuck this long (a hung CUDA/NCCL call).
    heartbeat_timeout_s: Seconds = 600
    trace_buffer_size: Annotated[int, Range(0, 1000000)] = 2000  # flight recorder entries per rank (0: off), dumped on a timeout
    dump_prefix: PathStr = "/tmp/preflight_fr_rank_"  # flight recorder dump files: this prefix plus the rank
    nccl_debug: Annotated[str, OneOf(("VERSION", "WARN", "INFO", "TRACE"))] = "WARN"  # NCCL_DEBUG: WARN prints NCCL's reason for a failure
    torchrun: PathStr = "torchrun"  # torchrun as each host starts it, e.g. /opt/venv/bin/torchrun (torchrun and slurm formats)
    script: PathStr = "train.py"  # the training script, for the torchrun and slurm formats
    script_args: list[Annotated[str, Format("argument")]] = field(default_factory=list)  # its arguments
    rail_wrapper: PathStr = "rail_env.py"  # on rails: where hosts find emit-launch's rail_env.py, run before the script


@dataclass
class PreflightConfig:
    """The composed configuration of one run."""

    cluster: ClusterConfig = MISSING
    pins: PinsConfig = field(default_factory=PinsConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    thresholds: ThresholdsConfig = field(default_factory=ThresholdsConfig)
    ssh: SshConfig = field(default_factory=SshConfig)
    collective: CollectiveConfig = field(default_factory=CollectiveConfig)
    connectivity: ConnectivityConfig = field(default_factory=ConnectivityConfig)
    dcgm: DcgmConfig = field(default_factory=DcgmConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    playbook: PlaybookConfig = MISSING
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    state_dir: PathStr = ".preflight"  # where reports are saved for emit-launch
    history_keep: Annotated[int, Range(1, 100000)] = 100  # reports kept in state_dir/history (PF613's baseline), the oldest removed


def register_configs() -> None:
    """Put the schema in Hydra's ConfigStore, where conf/config.yaml's defaults list finds it.

    It is a group option (``schema=preflight``) so that a composition can leave it out
    (``~schema``) to locate an error that OmegaConf reports without its full key path.
    """
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group="schema", name="preflight", node=PreflightConfig, package="_global_")


def from_plain(plain: dict[str, Any]) -> PreflightConfig:  # the plain JSON form of a validated config
    """The typed tree of a plain config that already passed validation (a cached composition): the same objects
    OmegaConf.to_object makes of it, without Hydra or OmegaConf."""
    config = _typed(PreflightConfig, plain)
    if not isinstance(config, PreflightConfig):
        raise TypeError("a plain config must be a mapping")
    return config


@cache
def _hints(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls)


def _typed(hint: Any, value: Any) -> Any:
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        hints = _hints(hint)
        return hint(**{f.name: _typed(hints[f.name], value[f.name]) for f in dataclasses.fields(hint) if f.name in value})
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list:
        return [_typed(args[0], item) for item in value]
    if origin is dict:
        return {key: _typed(args[1], item) for key, item in value.items()}
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        return _typed(next(a for a in args if a is not type(None)), value)
    if isinstance(hint, type) and issubclass(hint, Enum):
        return hint(value)
    if hint is float:
        return float(value)
    return value
