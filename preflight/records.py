"""What the facts stage hands on: for each host a record of its facts, or why it has none; and the readings of those
facts that the checks, the launch and emit-launch share.

It sits on the ground floor, beside the facts it holds: every stage above may import it, and it imports none of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from preflight.facts import HostFacts, InfinibandPort, Interface
from preflight.findings import Finding
from preflight.spec import Backend, HostSpec, PreflightConfig


@dataclass(frozen=True)
class HostRecord:
    """One reached host: its spec, its facts, and bounds on its clock's offset from ours."""

    host: HostSpec
    facts: HostFacts
    # (low, high) bounds on host clock minus local clock, from the probe's timestamp and
    # the command's round trip; None when the transport measured no round trip.
    clock_offset_s: tuple[float, float] | None = None


@dataclass(frozen=True)
class HostOutcome:
    """The facts stage's result for one host: a record to check, or why there is none."""

    host: HostSpec
    record: HostRecord | None
    problem: Finding | None  # PF001/PF002 when record is None


def has_driver(facts: HostFacts) -> bool:
    """Whether the host's NVIDIA driver could be read at all."""
    return facts["gpu"]["source"] != "none"


# NVML_ERROR_LIB_RM_VERSION_MISMATCH as nvidia-ml-py words it, and as libnvidia-ml's nvmlErrorString does for
# nvidia-smi (tests/data/messages/nvml.yaml, nvidia-driver-libraries.yaml): the kernel module refused the libraries,
# being another driver version - a driver upgraded without a reboot (PF731). The module loads only where it finds an
# NVIDIA GPU, so the host has GPUs that nothing can use until it is rebooted.
DRIVER_LIBRARY_MISMATCH = ("NVML/RM version mismatch", "Driver/library version mismatch")


def _driver_refused(facts: HostFacts, texts: tuple[str, ...]) -> bool:
    """Whether the driver could not be read, for a reason the probe's error words as one of texts."""
    error = facts["gpu"]["error"] or ""
    return not has_driver(facts) and any(text in error for text in texts)


def driver_mismatched(facts: HostFacts) -> bool:
    """Whether the host's NVIDIA kernel module refused its driver libraries as another version (its GPUs unreadable)."""
    return _driver_refused(facts, DRIVER_LIBRARY_MISMATCH)


# NVML_ERROR_UNKNOWN at nvmlInit, as the probe words it (its "NVML: " and nvidia-ml-py's text for 999), which the probe
# only asks where a driver's /proc entry or device node is there. NVIDIA's notice (NVIDIA/nvidia-docker#1730) gives it as
# a container whose cgroup lost the NVIDIA device rules (PF732): the host has GPUs this process may not open.
NVML_REFUSED_DEVICES = ("NVML: Unknown Error",)


def gpus_denied(facts: HostFacts) -> bool:
    """Whether NVML could not start with its Unknown Error where the driver is loaded: the GPUs' device nodes denied."""
    return _driver_refused(facts, NVML_REFUSED_DEVICES)


def find_interface(facts: HostFacts, name: str) -> Interface | None:
    """An interface of the host by name."""
    return next((i for i in facts["net"]["interfaces"] if i["name"] == name), None)


def ipv4_addresses(facts: HostFacts) -> set[str]:
    """Every IPv4 address the host's interfaces hold, without its prefix length."""
    return {a.split("/")[0] for iface in facts["net"]["interfaces"] for a in iface["ipv4"]}


def configured_interface_name(host: HostSpec, config: PreflightConfig) -> str | None:
    """The socket interface the config names for a host, or None for auto."""
    name = host.interface if host.interface != "auto" else config.network.socket_ifname
    return None if name == "auto" else name


def rails_declared(config: PreflightConfig) -> bool:
    """Whether the config names rails (network.interfaces or a host's interfaces): only then are rails checked one by
    one, since a one-rail host's interface is the socket interface, checked as such (PF303)."""
    return bool(config.network.interfaces) or any(h.interfaces for h in config.cluster.hosts)


def rail_interfaces(host: HostSpec, config: PreflightConfig) -> list[str]:
    """The host's rails' interfaces in rail order: its interfaces, else network.interfaces, else its one configured
    socket interface; [] where that one is auto (found from the facts: the interface routing to the master)."""
    if host.interfaces:
        return list(host.interfaces)
    if config.network.interfaces:
        return list(config.network.interfaces)
    name = configured_interface_name(host, config)
    return [name] if name is not None else []


@dataclass(frozen=True)
class Rail:
    """One rail of a host: its interface and the RDMA port that carries it, as the connectivity, bandwidth and launch
    of a rail-optimized job take them (local rank r on rail r: NCCL_SOCKET_IFNAME=interface, NCCL_IB_HCA=hca)."""

    index: int  # r, from 0, in the config's rail order; rail r of every host shares one switch and subnet
    interface: str  # this host's interface on the rail
    hca: str | None  # its RDMA port as NCCL_IB_HCA names one, e.g. mlx5_1:1; None: none is tied to it (a TCP rail)
    tied_by: str | None  # how the port was tied: "netdev" (the port carries the interface) or "order" (NCCL_IB_HCA's)


def host_rails(host: HostSpec, facts: HostFacts, config: PreflightConfig) -> list[Rail]:
    """The host's rails in rail order, each tied to the RDMA port whose network device is the rail's interface; a rail
    whose interface no port carries (IPoIB without its device, a port the probe could not read) takes the port in its
    place of the HCA order (network.ib_hca, else the host's NCCL_IB_HCA), as NCCL pairs GPU r with the r-th HCA."""
    names = rail_interfaces(host, config)
    ports = facts["net"]["infiniband"]
    by_netdev = {p["netdev"]: p for p in ports if p.get("netdev")}
    order = _hca_order(config.network.ib_hca or _nccl_ib_hca(facts), ports)
    # A port known to carry another interface is that interface's, whatever its place in the order.
    untied = {_port_name(p) for p in ports if not p.get("netdev")}
    rails = []
    for index, name in enumerate(names):
        port = by_netdev.get(name)
        if port is not None:
            rails.append(Rail(index, name, _port_name(port), "netdev"))
        elif index < len(order) and order[index] in untied:
            rails.append(Rail(index, name, order[index], "order"))
        else:
            rails.append(Rail(index, name, None, None))
    return rails


def _port_name(port: InfinibandPort) -> str:
    return f"{port['device']}:{port['port']}"


def _nccl_ib_hca(facts: HostFacts) -> list[str]:
    """NCCL_IB_HCA's list as the host sets it (environment, then nccl.conf); [] where it excludes (^) or is unset."""
    value = facts["nccl"]["env"].get("NCCL_IB_HCA")
    for settings in facts["nccl"]["conf_files"].values():
        value = value or settings.get("NCCL_IB_HCA")
    if not value or value.startswith("^"):
        return []
    return [entry for entry in value.lstrip("=").split(",") if entry]


def _hca_order(entries: Sequence[str], ports: Sequence[InfinibandPort]) -> list[str]:
    """Each entry (mlx5_0, or mlx5_0:1) as the port the host has: a device alone is its first port."""
    found = []
    for entry in entries:
        device, _, number = entry.partition(":")
        mine = sorted((p for p in ports if p["device"] == device and (not number or str(p["port"]) == number)), key=lambda p: p["port"])
        if mine:
            found.append(_port_name(mine[0]))
    return found


def resolve_backend(records: Sequence[HostRecord], config: PreflightConfig) -> Backend:
    """``auto`` means nccl where any reached host has a GPU, else gloo. A host whose kernel module refused the driver's
    libraries has GPUs too, and so has one whose GPUs NVML may not open: read as a CPU cluster, a whole cluster upgraded
    without a reboot, or containers that lost their GPUs, would pass on gloo."""
    if config.training.backend != Backend.auto:
        return config.training.backend
    has_gpu = any(r.facts["gpu"]["devices"] or driver_mismatched(r.facts) or gpus_denied(r.facts) for r in records)
    return Backend.nccl if has_gpu else Backend.gloo
