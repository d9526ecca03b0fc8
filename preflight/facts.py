"""The shape of one host's facts, as the probe prints them (see schemas/facts.schema.json).

The probe reports and never judges; these types are what the checks read. ``None`` always
means "the host could not tell" (a field not supported by the GPU, a library not found),
never "zero" or "off".
"""

from __future__ import annotations

from typing import Literal, TypedDict


class HostInfo(TypedDict):
    hostname: str
    fqdn: str
    resolves_to: list[str]  # IPv4/IPv6 addresses of the hostname; empty when it does not resolve
    resolve_error: str | None
    kernel: str
    os: str
    python: str  # version of the python that ran the probe
    python_executable: str


class TorchInfo(TypedDict):
    installed: bool
    version: str | None  # torch/version.py __version__, e.g. "2.11.0+cu130"
    cuda: str | None  # torch/version.py cuda, e.g. "13.0"; None for a CPU build
    location: str | None  # the torch package folder
    nccl_version: str | None  # version of the libnccl torch will load, e.g. "2.28.9"
    nccl_library: str | None  # path of that library


class NcclInfo(TypedDict):
    system_version: str | None  # the libnccl the dynamic linker finds, e.g. "2.28.3"
    system_library: str | None
    env: dict[str, str]  # NCCL_*, TORCH_NCCL_*, TORCH_DISTRIBUTED_*, GLOO_* and CUDA_VISIBLE_DEVICES
    conf_files: dict[str, dict[str, str]]  # path -> KEY=VALUE pairs of /etc/nccl.conf, ~/.nccl.conf


class GpuProcess(TypedDict):
    pid: int
    name: str | None
    used_memory_bytes: int | None


class GpuDevice(TypedDict):
    index: int
    name: str
    uuid: str
    pci_bus_id: str | None
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    ecc_enabled: bool | None
    ecc_uncorrected_volatile: int | None
    ecc_uncorrected_aggregate: int | None
    remapped_rows_pending: bool | None
    remapped_rows_failed: bool | None
    pcie_gen_current: int | None
    pcie_gen_max: int | None
    pcie_width_current: int | None
    pcie_width_max: int | None
    persistence_mode: bool | None
    compute_mode: Literal["default", "exclusive_thread", "prohibited", "exclusive_process"] | None
    mig_enabled: bool | None
    processes: list[GpuProcess] | None


class GpuInfo(TypedDict):
    source: Literal["nvml", "nvidia-smi", "none"]
    error: str | None  # why no driver could be read (source "none"), or which GPUs could not be read
    driver_version: str | None  # e.g. "580.159.04"
    cuda_driver_version: str | None  # the CUDA version the driver supports, e.g. "13.0"
    devices: list[GpuDevice]


class Interface(TypedDict):
    name: str
    operstate: str  # /sys/class/net/*/operstate: up, down, unknown, ...
    mtu: int | None
    speed_mbps: int | None  # None when the link reports no speed (virtual NICs report -1)
    mac: str | None
    ipv4: list[str]  # "address/prefix"
    loopback: bool


class InfinibandPort(TypedDict):
    device: str  # e.g. mlx5_0
    port: int
    state: str  # e.g. "ACTIVE", from "4: ACTIVE"
    phys_state: str  # e.g. "LinkUp"
    rate: str | None  # e.g. "400 Gb/sec (4X NDR)"
    link_layer: str | None  # InfiniBand or Ethernet


class NetInfo(TypedDict):
    interfaces: list[Interface]
    infiniband: list[InfinibandPort]


class ResourceInfo(TypedDict):
    dev_shm_bytes: int | None  # size of the /dev/shm file system
    memlock: int | Literal["unlimited"] | None  # RLIMIT_MEMLOCK soft limit in bytes


class ProbeInfo(TypedDict):
    schema: int
    started_unix_s: float  # host wall clock when the probe started (for clock skew)
    elapsed_s: float


class HostFacts(TypedDict):
    probe: ProbeInfo
    host: HostInfo
    torch: TorchInfo
    nccl: NcclInfo
    gpu: GpuInfo
    resources: ResourceInfo
    net: NetInfo
