"""Per-host checks. Each reads one host's facts and the spec, and says what it found."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterator

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from preflight.checks.registry import ClusterView, HostRecord, host_check
from preflight.facts import HostFacts, Interface
from preflight.findings import Finding, Status
from preflight.spec import Backend, HostSpec, PreflightConfig

# The version each pinnable component has, as the probe reports it.
COMPONENTS: dict[str, Callable[[HostFacts], str | None]] = {
    "driver": lambda f: f["gpu"]["driver_version"],
    "cuda_driver": lambda f: f["gpu"]["cuda_driver_version"],
    "torch": lambda f: f["torch"]["version"],
    "torch_cuda": lambda f: f["torch"]["cuda"],
    "nccl": lambda f: f["torch"]["nccl_version"],
}
GPU_COMPONENTS = ("driver", "cuda_driver", "torch_cuda", "nccl")
LABELS = {
    "driver": "NVIDIA driver",
    "cuda_driver": "CUDA (driver API)",
    "torch": "torch",
    "torch_cuda": "torch's CUDA",
    "nccl": "the NCCL torch loads",
}
PIN_CODES = {"driver": "PF101", "cuda_driver": "PF103", "torch": "PF104", "torch_cuda": "PF105", "nccl": "PF107"}


def parse_version(text: str | None) -> Version | None:
    """A PEP 440 version, or None when absent or unparsable."""
    if not text:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        return None


def matches(specifier: str, version: Version) -> bool:
    """Whether a version satisfies a specifier; pre-releases and local tags count."""
    return SpecifierSet(specifier, prereleases=True).contains(version)


def gib(n: int) -> str:
    """Bytes as a short human size."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{n}B"


def _finding(code: str, status: Status, record: HostRecord, message: str, remedy: str = "",
             workaround: dict[str, str] | None = None) -> Finding:
    return Finding(code=code, status=status, host=record.host.name, message=message, remedy=remedy, workaround=workaround or {})


def _uses_gpus(view: ClusterView) -> bool:
    return view.backend == Backend.nccl


def _has_driver(facts: HostFacts) -> bool:
    return facts["gpu"]["source"] != "none"


@host_check("PF100")
def driver_present(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """A GPU cluster needs the NVIDIA driver; a gloo cluster does not."""
    gpu = record.facts["gpu"]
    if _has_driver(record.facts):
        yield _finding("PF100", Status.passed, record, f"NVIDIA driver {gpu['driver_version']} read through {gpu['source']}")
    elif _uses_gpus(view):
        yield _finding(
            "PF100", Status.fail, record, f"no NVIDIA driver: {gpu['error']}",
            "install the NVIDIA driver and check `nvidia-smi`; or set training.backend=gloo for a CPU cluster",
        )
    else:
        yield _finding("PF100", Status.passed, record, "no NVIDIA driver; none needed for the gloo backend")


@host_check("PF101", "PF103", "PF104", "PF105", "PF107")
def version_pins(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """Every pinned component's version satisfies its PEP 440 specifier."""
    facts = record.facts
    for component, code in PIN_CODES.items():
        if component in GPU_COMPONENTS and not (_uses_gpus(view) and _has_driver(facts)):
            continue  # no GPU stack to pin (PF100 covers a missing driver on a GPU cluster)
        pin = view.pin(component)
        raw = COMPONENTS[component](facts)
        label = LABELS[component]
        if component == "torch" and not facts["torch"]["installed"]:
            yield _finding(code, Status.fail, record, f"torch is not installed for {facts['host']['python_executable']}",
                           "install torch in the training environment, or point the host's `python` at it")
            continue
        if component == "torch_cuda" and raw is None:
            yield _finding(code, Status.fail, record, f"torch {facts['torch']['version']} is a CPU build; the nccl backend needs CUDA",
                           "install a CUDA build of torch")
            continue
        version = parse_version(raw)
        if version is None:
            yield _finding(code, Status.unknown if pin else Status.passed, record,
                           f"{label} version could not be read ({raw!r})",
                           "check the installation of this component" if pin else "")
        elif not pin:
            yield _finding(code, Status.passed, record, f"{label} {raw} (not pinned)")
        elif matches(pin, version):
            yield _finding(code, Status.passed, record, f"{label} {raw} satisfies {pin}")
        else:
            yield _finding(code, Status.fail, record, f"{label} {raw} does not satisfy {pin}",
                           f"install a {label} version matching {pin}, or change pins.{component}")


@host_check("PF102")
def denylist(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """No component runs a version known to break distributed training."""
    hits = []
    for entry in view.config.pins.denylist:
        version = parse_version(COMPONENTS[entry.component](record.facts))
        if version is not None and matches(entry.specifier, version):
            hits.append(entry)
    for entry in hits:
        raw = COMPONENTS[entry.component](record.facts)
        yield _finding("PF102", Status.fail, record, f"{LABELS[entry.component]} {raw} is denylisted ({entry.specifier}): {entry.reason}",
                       f"move {LABELS[entry.component]} off {entry.specifier}; see `preflight explain PF102`",
                       dict(entry.workaround_env))
    if not hits:
        yield _finding("PF102", Status.passed, record, "no denylisted version")


def _major_minor(text: str | None) -> tuple[int, int] | None:
    version = parse_version(text)
    if version is None:
        return None
    release = (*version.release, 0)
    return release[0], release[1]


@host_check("PF106")
def torch_cuda_vs_driver(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """torch's CUDA must not be newer than the CUDA the driver supports."""
    facts = record.facts
    if not (_uses_gpus(view) and _has_driver(facts)):
        return
    built = _major_minor(facts["torch"]["cuda"])
    supported = _major_minor(facts["gpu"]["cuda_driver_version"])
    if built is None or supported is None:
        return  # PF105 reports a CPU build; a driver without a CUDA version is PF103's
    torch_cuda, driver_cuda = facts["torch"]["cuda"], facts["gpu"]["cuda_driver_version"]
    if built[0] > supported[0]:
        yield _finding("PF106", Status.fail, record,
                       f"torch is built for CUDA {torch_cuda} but the driver supports CUDA {driver_cuda}: CUDA init fails",
                       f"upgrade the driver to one supporting CUDA {torch_cuda}, or install torch built for CUDA {supported[0]}.x")
    elif built > supported:
        yield _finding("PF106", Status.warn, record,
                       f"torch is built for CUDA {torch_cuda}, the driver supports {driver_cuda}: "
                       "minor-version compatibility only (PTX JIT and newer features fail)",
                       f"upgrade the driver to one supporting CUDA {torch_cuda}")
    else:
        yield _finding("PF106", Status.passed, record, f"torch's CUDA {torch_cuda} <= the driver's CUDA {driver_cuda}")


@host_check("PF108")
def nccl_two_answers(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """Say which NCCL torch loads when the system has a different one (information, not a fault)."""
    torch_nccl = record.facts["torch"]["nccl_version"]
    system_nccl = record.facts["nccl"]["system_version"]
    if _uses_gpus(view) and torch_nccl and system_nccl and torch_nccl != system_nccl:
        yield _finding("PF108", Status.passed, record,
                       f"torch loads NCCL {torch_nccl} ({record.facts['torch']['nccl_library']}); "
                       f"the system's libnccl is {system_nccl}: NCCL_VERSION and nccl-tests describe the latter")


@host_check("PF201")
def gpu_count(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """The host has the GPUs the cluster config expects."""
    found = len(record.facts["gpu"]["devices"])
    expected = record.host.gpus
    if expected == "auto":
        if _has_driver(record.facts):
            yield _finding("PF201", Status.passed, record, f"{found} GPU(s) found (none expected in particular)")
        return
    want = int(expected)
    if found == want:
        yield _finding("PF201", Status.passed, record, f"{found} GPU(s), as expected")
    elif _has_driver(record.facts) or want > 0:
        yield _finding("PF201", Status.fail, record, f"{found} GPU(s) found, {want} expected",
                       "check `nvidia-smi -L` and `dmesg` for GPUs that fell off the bus (Xid 79), or fix cluster.hosts[].gpus")


@host_check("PF202")
def memlock(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """With InfiniBand, a limited memlock stops NCCL registering memory."""
    if not record.facts["net"]["infiniband"]:
        return
    limit = record.facts["resources"]["memlock"]
    if limit == "unlimited":
        yield _finding("PF202", Status.passed, record, "memlock is unlimited")
    else:
        shown = "unknown" if limit is None else gib(limit)
        yield _finding("PF202", Status.warn, record, f"memlock limited to {shown} with InfiniBand present",
                       "set `ulimit -l unlimited` (limits.conf, or --ulimit memlock=-1 in containers)")


@host_check("PF203")
def dev_shm(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """/dev/shm holds NCCL's shared-memory buffers and DataLoader batches."""
    size = record.facts["resources"]["dev_shm_bytes"]
    minimum = view.config.thresholds.dev_shm_min_bytes
    if size is None:
        yield _finding("PF203", Status.fail, record, "/dev/shm is missing",
                       "mount a tmpfs on /dev/shm (containers: --shm-size=16g or --ipc=host)")
    elif size < minimum:
        yield _finding("PF203", Status.fail, record, f"/dev/shm {gib(size)} < {gib(minimum)}",
                       "enlarge /dev/shm (Docker: --shm-size=16g or --ipc=host; Kubernetes: an emptyDir with medium Memory)",
                       # NCCL then avoids /dev/shm; a gloo job has no such switch.
                       {"NCCL_SHM_DISABLE": "1"} if _uses_gpus(view) else None)
    else:
        yield _finding("PF203", Status.passed, record, f"/dev/shm {gib(size)} >= {gib(minimum)}")


@host_check("PF204", "PF205")
def gpu_occupancy(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """GPUs start the job empty: no memory held, no other compute processes."""
    limit = view.config.thresholds.gpu_memory_used_max_fraction
    for gpu in record.facts["gpu"]["devices"]:
        used, total = gpu["memory_used_bytes"], gpu["memory_total_bytes"]
        if used is not None and total:
            if used > limit * total:
                yield _finding("PF204", Status.fail, record,
                               f"GPU {gpu['index']}: {gib(used)} of {gib(total)} memory already in use",
                               "stop the process holding it (`nvidia-smi --query-compute-apps=pid,used_memory --format=csv`)")
            else:
                yield _finding("PF204", Status.passed, record, f"GPU {gpu['index']}: {gib(used)} of {gib(total)} in use")
        processes = gpu["processes"]
        if processes:
            listed = ", ".join(f"{p['pid']} ({p['name'] or '?'})" for p in processes[:4])
            yield _finding("PF205", Status.warn, record, f"GPU {gpu['index']}: {len(processes)} other compute process(es): {listed}",
                           "make sure no earlier job is still running on this GPU")


@host_check("PF301", "PF302")
def hostname_resolution(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """A rendezvous on a name that resolves to loopback binds to 127.0.0.1."""
    host = record.facts["host"]
    if not host["resolves_to"]:
        yield _finding("PF302", Status.warn, record, f"hostname {host['hostname']!r} does not resolve: {host['resolve_error']}",
                       "add it to /etc/hosts or DNS, or give torchrun --local-addr with this host's IP")
        return
    loopback = [a for a in host["resolves_to"] if ipaddress.ip_address(a.split("%")[0]).is_loopback]
    if loopback and len(view.config.cluster.hosts) > 1:
        yield _finding("PF301", Status.warn, record,
                       f"hostname {host['hostname']!r} resolves to {', '.join(loopback)}: a rendezvous on it binds to loopback",
                       "map the hostname to the cluster interface's address in /etc/hosts, or set GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME")
    elif loopback:
        yield _finding("PF301", Status.passed, record,
                       f"hostname {host['hostname']!r} resolves to {', '.join(loopback)} (harmless on one host)")
    else:
        yield _finding("PF301", Status.passed, record, f"hostname {host['hostname']!r} resolves to {', '.join(host['resolves_to'])}")


def configured_interface_name(host: HostSpec, config: PreflightConfig) -> str | None:
    """The socket interface the config names for a host, or None for auto."""
    name = host.interface if host.interface != "auto" else config.network.socket_ifname
    return None if name == "auto" else name


def configured_interface(record: HostRecord, view: ClusterView) -> str | None:
    """The socket interface the config names for this host, or None for auto."""
    return configured_interface_name(record.host, view.config)


def find_interface(facts: HostFacts, name: str) -> Interface | None:
    """An interface of the host by name."""
    return next((i for i in facts["net"]["interfaces"] if i["name"] == name), None)


@host_check("PF303", "PF304")
def socket_interface(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """The configured interface exists, is up, has IPv4, and has the expected MTU."""
    name = configured_interface(record, view)
    if name is None:
        return
    iface = find_interface(record.facts, name)
    names = ", ".join(i["name"] for i in record.facts["net"]["interfaces"] if not i["loopback"])
    if iface is None:
        yield _finding("PF303", Status.fail, record, f"interface {name} does not exist (this host has: {names or 'none'})",
                       "fix network.socket_ifname or this host's interface in the cluster config")
        return
    # "unknown" is what virtual and some bonded links report while passing traffic.
    if iface["operstate"] not in ("up", "unknown"):
        yield _finding("PF303", Status.fail, record, f"interface {name} is {iface['operstate']}", f"bring {name} up")
    elif not iface["ipv4"]:
        yield _finding("PF303", Status.fail, record, f"interface {name} has no IPv4 address", f"configure an address on {name}")
    else:
        yield _finding("PF303", Status.passed, record, f"interface {name} is {iface['operstate']} with {', '.join(iface['ipv4'])}")
    expected = view.config.network.mtu
    if expected is not None:
        if iface["mtu"] == expected:
            yield _finding("PF304", Status.passed, record, f"interface {name} MTU {iface['mtu']}")
        else:
            yield _finding("PF304", Status.warn, record, f"interface {name} MTU {iface['mtu']}, expected {expected}",
                           "set the MTU to match on every host and switch port; a mismatch drops large frames and hangs collectives")


@host_check("PF305")
def infiniband_ports(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """Every configured HCA has an ACTIVE port."""
    ports = record.facts["net"]["infiniband"]
    for hca in view.config.network.ib_hca:
        device, _, port = hca.partition(":")
        mine = [p for p in ports if p["device"] == device and (not port or p["port"] == int(port))]
        active = [p for p in mine if p["state"] == "ACTIVE"]
        if active:
            yield _finding("PF305", Status.passed, record, f"{hca} ACTIVE ({active[0]['rate'] or 'rate unknown'})")
        elif mine:
            yield _finding("PF305", Status.fail, record, f"{hca} is {mine[0]['state']} ({mine[0]['phys_state']})",
                           "check the cable and subnet manager (`ibstat`); NCCL would fall back to sockets")
        else:
            yield _finding("PF305", Status.fail, record, f"{hca} not found", "fix network.ib_hca, or load the RDMA drivers")


@host_check("PF401", "PF402", "PF403")
def gpu_memory_health(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """No uncorrected ECC errors and no pending or failed row remapping."""
    for gpu in record.facts["gpu"]["devices"]:
        index = gpu["index"]
        volatile, aggregate = gpu["ecc_uncorrected_volatile"], gpu["ecc_uncorrected_aggregate"]
        if volatile:
            yield _finding("PF401", Status.fail, record, f"GPU {index}: {volatile} uncorrected ECC error(s) since boot",
                           "drain the node; reset the GPU (`nvidia-smi -r`) and run a memory test, RMA if they recur")
        elif aggregate:
            yield _finding("PF401", Status.warn, record, f"GPU {index}: {aggregate} uncorrected ECC error(s) in its lifetime",
                           "watch this GPU; RMA if the count grows")
        elif gpu["ecc_enabled"] is not None:
            yield _finding("PF401", Status.passed, record, f"GPU {index}: no uncorrected ECC errors")
        if gpu["remapped_rows_failed"]:
            yield _finding("PF403", Status.fail, record, f"GPU {index}: a row remapping failed",
                           "the GPU has run out of spare rows: drain the node and RMA the GPU")
        if gpu["remapped_rows_pending"]:
            yield _finding("PF402", Status.fail, record, f"GPU {index}: a row remapping is pending",
                           "reset the GPU (`nvidia-smi -r -i N`, or reboot) to apply it")
        elif gpu["remapped_rows_pending"] is False:
            yield _finding("PF402", Status.passed, record, f"GPU {index}: no row remapping pending")


@host_check("PF404", "PF405", "PF406", "PF407")
def gpu_settings(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """PCIe link width, persistence mode, compute mode and MIG are fit for a distributed job."""
    for gpu in record.facts["gpu"]["devices"]:
        index = gpu["index"]
        width, width_max = gpu["pcie_width_current"], gpu["pcie_width_max"]
        gen, gen_max = gpu["pcie_gen_current"], gpu["pcie_gen_max"]
        if width is not None and width_max is not None and width < width_max:
            yield _finding("PF404", Status.warn, record, f"GPU {index}: PCIe link x{width}, capable of x{width_max}",
                           "reseat the GPU or riser; a narrowed link cuts host-device and GPUDirect bandwidth")
        elif width is not None and gen is not None:
            # The generation drops at idle to save power, so only a narrowed width is a fault.
            yield _finding("PF404", Status.passed, record, f"GPU {index}: PCIe Gen{gen} x{width} (max Gen{gen_max} x{width_max})")
        if gpu["persistence_mode"] is False:
            yield _finding("PF405", Status.warn, record, f"GPU {index}: persistence mode is off",
                           "`nvidia-smi -pm 1` (or run nvidia-persistenced) so the driver does not reinitialise per process")
        if gpu["compute_mode"] == "prohibited":
            yield _finding("PF406", Status.fail, record, f"GPU {index}: compute mode is Prohibited",
                           "`nvidia-smi -c DEFAULT -i N`")
        if gpu["mig_enabled"]:
            yield _finding("PF407", Status.warn, record, f"GPU {index}: MIG is enabled",
                           "NCCL cannot span MIG instances; `nvidia-smi -mig 0` for multi-GPU training")
