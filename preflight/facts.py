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


class _NcclInfo(TypedDict):
    system_version: str | None  # the libnccl the dynamic linker finds, e.g. "2.28.3"
    system_library: str | None
    env: dict[str, str]  # NCCL_*, TORCH_NCCL_*, TORCH_DISTRIBUTED_*, GLOO_* and CUDA_VISIBLE_DEVICES
    conf_files: dict[str, dict[str, str]]  # path -> KEY=VALUE pairs of /etc/nccl.conf, ~/.nccl.conf


class NcclInfo(_NcclInfo, total=False):
    net_plugins: list[str]  # schema 2 on: libnccl-net*.so* in the linker's folders and torch's NCCL folder


class GpuProcess(TypedDict):
    pid: int
    name: str | None
    used_memory_bytes: int | None


class _GpuDevice(TypedDict):
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


ClockEventReason = Literal["gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
                           "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "display_clock_setting"]


class GpuDevice(_GpuDevice, total=False):
    """One GPU. The fields added by facts schema 3 are absent from older facts."""

    mig_pending_enabled: bool | None  # the MIG mode after the GPU's next reset
    ecc_pending_enabled: bool | None  # the ECC mode after the next reboot
    temperature_c: int | None  # the GPU core's temperature
    clock_event_reasons: list[ClockEventReason] | None  # why the clocks are below their maximum now
    pcie_gen_gpu_max: int | None  # the GPU's own maximum PCIe generation (pcie_gen_max is the link's, slot included)
    vbios_version: str | None  # e.g. "96.00.DA.00.0C"
    inforom_image_version: str | None  # e.g. "G520.0200.00.05"
    retired_pages_pending: bool | None  # pages waiting to be retired at the next reboot (pre-Ampere; None on Ampere on)
    recovery_action: str | None  # NVML's GPU recovery action: none, gpu_reset, node_reboot, drain_p2p, drain_and_reset, ...


class _GpuInfo(TypedDict):
    source: Literal["nvml", "nvidia-smi", "none"]
    error: str | None  # why no driver could be read (source "none"), or which GPUs could not be read
    driver_version: str | None  # e.g. "580.159.04"
    cuda_driver_version: str | None  # the CUDA version the driver supports, e.g. "13.0"
    devices: list[GpuDevice]


class GpuInfo(_GpuInfo, total=False):
    # schema 3 on: NVML calls that failed other than by NVML's own answer (arguments pynvml does not take, a call it
    # lacks, a function the driver's library does not export), "call: error"
    nvml_call_errors: list[str]


class Interface(TypedDict):
    name: str
    operstate: str  # /sys/class/net/*/operstate: up, down, unknown, ...
    mtu: int | None
    speed_mbps: int | None  # None when the link reports no speed (virtual NICs report -1)
    mac: str | None
    ipv4: list[str]  # "address/prefix"
    loopback: bool


class _InfinibandPort(TypedDict):
    device: str  # e.g. mlx5_0
    port: int
    state: str  # e.g. "ACTIVE", from "4: ACTIVE"
    phys_state: str  # e.g. "LinkUp"
    rate: str | None  # e.g. "400 Gb/sec (4X NDR)"
    link_layer: str | None  # InfiniBand or Ethernet


class InfinibandPort(_InfinibandPort, total=False):
    pci: str | None  # schema 2 on: the HCA's PCI address, e.g. 0000:1a:00.0
    counters: dict[str, int]  # schema 2 on: counters/<name> (link_downed, symbol_error, ...) that could be read
    hw_counters: dict[str, int]  # schema 3 on: hw_counters/<name> (mlx5: out_of_buffer, local_ack_timeout_err, CNPs, ...)
    carrier_down_count: int | None  # schema 3 on: the port's netdev's carrier_down_count (link downs, not capped at 255)
    fw_ver: str | None  # schema 3 on: the HCA's firmware, e.g. 28.41.1000
    board_id: str | None  # schema 3 on: the HCA's board (PSID), e.g. MT_0000000838
    netdev: str | None  # schema 4 on: the interface the port carries (RoCE's GID device, or IPoIB's), e.g. eth1; None: none found


class NetInfo(TypedDict):
    interfaces: list[Interface]
    infiniband: list[InfinibandPort]


class TempFolder(TypedDict):
    path: str  # the folder the job's processes get from Python's tempfile: $TMPDIR (or TEMP, TMP), else /tmp, /var/tmp
    free_bytes: int  # free for an unprivileged user (f_bavail)
    total_bytes: int  # 0: a filesystem that counts no blocks (ramfs, some FUSE)
    free_inodes: int  # f_favail
    total_inodes: int  # 0: a filesystem without inode counts


class LocalPorts(TypedDict):
    first: int  # net.ipv4.ip_local_port_range: the ports the kernel picks for a socket bound to port 0, or connecting
    last: int
    reserved: int  # of first..last, the ports net.ipv4.ip_local_reserved_ports keeps out
    in_use: int  # of the others, those a TCP socket of the host's network namespace holds (any state, TIME_WAIT too)


class _ResourceInfo(TypedDict):
    dev_shm_bytes: int | None  # size of the /dev/shm file system
    memlock: int | Literal["unlimited"] | None  # RLIMIT_MEMLOCK soft limit in bytes


class ResourceInfo(_ResourceInfo, total=False):
    # Absent from facts recorded before they were read.
    cpus: int | None  # CPUs the probe may run on (its affinity), as the job's processes started the same way
    cpu_quota: float | None  # CPUs its cgroup's quota allows (the smallest from its group up); None: no quota
    nofile: int | Literal["unlimited"] | None  # RLIMIT_NOFILE soft limit: the descriptors each process may hold open
    tmp: TempFolder | None  # the temporary folder; None: no candidate is a folder this user may write in
    local_ports: LocalPorts | None  # the local port range and how much of it is taken; None: the range unreadable


class _XidEvent(TypedDict):
    kind: Literal["Xid", "SXid"]  # a GPU's (NVRM) or an NVSwitch's (nvidia-nvswitch)
    pci: str  # the device's PCI address as the line gives it, lower case, e.g. 0000:3b:00
    code: int
    count: int  # lines of this kind, device and code in the lookback
    first_unix_s: float | None  # None when the lines carry no time stamp
    last_unix_s: float | None
    message: str  # the text after the code on the last such line (a Fatal line's once one was seen)


class XidEvent(_XidEvent, total=False):
    fatal: bool | None  # schema 3 on: a line said Fatal (True), only Non-fatal (False), neither (None)


class KernelLog(TypedDict):
    source: str | None  # kmsg, journal, /var/log/kern.log, /var/log/messages; None: none could be read
    error: str | None  # why none could be read
    lookback_s: float  # how far back the probe kept events
    events: list[XidEvent]
    truncated: bool  # more distinct events than the probe keeps


class _FabricManager(TypedDict):
    installed: bool  # the nvidia-fabricmanager unit or binary exists
    running: bool | None  # nv-fabricmanager is a running process; None when not installed


class FabricManager(_FabricManager, total=False):
    version: str | None  # schema 3 on: nv-fabricmanager --version; it must equal the driver's


class GpuFabric(TypedDict):
    index: int
    pci: str | None
    state: str | None  # not_supported, not_started, in_progress, completed
    status: str | None  # success, or the error NVML/nvidia-smi reports once the state is completed
    clique_id: int | None
    cluster_uuid: str | None
    health_summary: str | None  # nvidia-smi's Health Summary (Healthy, Unhealthy), where it prints one


class NvLink(TypedDict):
    gpu: int
    link: int
    active: bool
    speed_gbps: float | None  # nvidia-smi nvlink -s only
    errors: dict[str, int | None] | None  # replay, recovery, crc_flit, crc_data (NVML, or nvidia-smi nvlink -e)


class _FabricInfo(TypedDict):
    nvswitch_count: int  # NVSwitch PCI functions on the host
    fabric_manager: FabricManager
    gpus: list[GpuFabric]
    nvlinks: list[NvLink]


class FabricInfo(_FabricInfo, total=False):
    nvlink_all_down: list[int]  # schema 3 on: GPUs with NVLink hardware and no link up ("all links are inActive")


class PcieLink(TypedDict):
    speed_gts: float | None  # current_link_speed, e.g. 32.0 (GT/s: 16 is Gen4, 32 Gen5)
    width: int | None  # current_link_width, lanes
    max_speed_gts: float | None  # max_link_speed
    max_width: int | None  # max_link_width


class _PciDevice(TypedDict):
    pci: str  # e.g. 0000:1b:00.0
    kind: Literal["gpu", "nic", "nvswitch"]
    name: str | None  # the RDMA device name of a NIC, e.g. mlx5_0
    numa_node: int | None
    root: str | None  # the PCI root complex, e.g. pci0000:00
    path: list[str]  # the bridges from the root port down to the device


class PciDevice(_PciDevice, total=False):
    pcie_link: PcieLink | None  # schema 3 on: a NIC's PCIe link from sysfs; None for GPUs (NVML has theirs), NVSwitches


class PciBridge(TypedDict):
    pci: str
    config_bytes: int  # how much of its config space could be read (64 without root, the standard header only: no extended capabilities)
    acs_ctl: list[str] | None  # ACS control flags set (lspci's names); None: no ACS capability, or not readable


class IommuInfo(TypedDict):
    groups: int | None  # /sys/kernel/iommu_groups entries; 0: no IOMMU in use
    cmdline: list[str] | None  # iommu=, intel_iommu=, amd_iommu= on the kernel command line
    gpu_domain: str | None  # the first GPU's IOMMU group type: identity (passthrough), DMA, DMA-FQ


class Topology(TypedDict):
    devices: list[PciDevice]
    bridges: list[PciBridge]  # every bridge above a GPU or NIC
    iommu: IommuInfo
    numa_balancing: int | None  # /proc/sys/kernel/numa_balancing
    peermem_loaded: bool | None  # nvidia_peermem (or the older nv_peer_mem) is loaded
    nvidia_open_module: bool | None  # the open NVIDIA kernel module (dmabuf GPUDirect RDMA on kernel 5.12+)


class ProbeInfo(TypedDict):
    schema: int
    started_unix_s: float  # host wall clock when the probe started (for clock skew)
    elapsed_s: float


class _HostFacts(TypedDict):
    probe: ProbeInfo
    host: HostInfo
    torch: TorchInfo
    nccl: NcclInfo
    gpu: GpuInfo
    resources: ResourceInfo
    net: NetInfo


class HostFacts(_HostFacts, total=False):
    """One host's facts. The sections added by facts schema 2 are absent from facts of schema 1 (in older reports)."""

    kernel_log: KernelLog
    fabric: FabricInfo
    topology: Topology
