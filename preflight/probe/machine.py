"""The kernel log, the fabric manager and NVSwitch fabric, and the PCI topology."""

from __future__ import annotations

import os
import re

from preflight.hostlib.files import read_int, read_text
from preflight.probe.constants import (
    FABRIC_MANAGER_UNITS,
    JOURNAL_TIMEOUT_S,
    KERNEL_LOG_LOOKBACK_S,
    KERNEL_LOG_TAIL_BYTES,
    KMSG_MAX_RECORDS,
    SMI_TIMEOUT_S,
)
from preflight.probe.gpu import first_line, run_commands
from preflight.probe.host import which
from preflight.probe.readings import parse_fabric_manager_version, pci_acs_control, xid_events

# typing costs milliseconds to import on a plain python, and annotations here are never evaluated.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def boot_time(proc: str = "/proc") -> float | None:
    """The boot time in unix seconds (/proc/stat btime), which /dev/kmsg's stamps count from."""
    text = read_text(os.path.join(proc, "stat")) or ""
    for line in text.splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return None


def read_kmsg(path: str = "/dev/kmsg") -> list[str]:
    """Every record of the kernel's ring buffer, read without blocking (what dmesg reads); raises OSError when the
    host refuses (dmesg_restrict=1 without CAP_SYSLOG)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    records = []
    try:
        for _ in range(KMSG_MAX_RECORDS):
            try:
                chunk = os.read(fd, 8192)  # one record per read
            except BlockingIOError:
                break  # the end of the buffer
            except BrokenPipeError:
                continue  # a record was overwritten while reading: the next read resumes at the oldest one left
            if not chunk:
                break
            records.append(chunk.decode("utf-8", "replace").split("\n", 1)[0])
    finally:
        os.close(fd)
    return records


def read_tail(path: str, size: int) -> list[str]:
    """The last size bytes of a text file as lines (the first, likely cut, left out); raises OSError."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        length = f.tell()
        f.seek(max(0, length - size))
        lines = f.read().decode("utf-8", "replace").splitlines()
    return lines[1:] if length > size else lines


def kernel_log(now_unix_s: float) -> dict[str, Any]:
    """KernelLog: the Xid/SXid events of the last KERNEL_LOG_LOOKBACK_S, from the first source this host lets us
    read: the ring buffer (/dev/kmsg), the journal (journalctl -k), /var/log/kern.log. Reading none is a fact."""
    since = now_unix_s - KERNEL_LOG_LOOKBACK_S
    boot = boot_time()
    problems = []
    try:
        lines, source = read_kmsg(), "kmsg"
    except OSError as e:
        problems.append(f"/dev/kmsg: {e.strerror or e}")
        lines, source = None, None
    if lines is None and which("journalctl"):
        ((status, out, err),) = run_commands([["journalctl", "-k", "-o", "short-unix", "--no-pager", "-q", "-n", "100000",
                                               "--since", f"-{KERNEL_LOG_LOOKBACK_S}s"]], JOURNAL_TIMEOUT_S)
        if status == 0 and out.strip():
            lines, source = out.splitlines(), "journal"
        else:
            problems.append("journalctl -k: " + (first_line(err, out) or f"exit status {status}, no lines"))
    if lines is None:
        for path in ("/var/log/kern.log", "/var/log/messages"):
            try:
                lines, source = read_tail(path, KERNEL_LOG_TAIL_BYTES), path
                break
            except OSError as e:
                problems.append(f"{path}: {e.strerror or e}")
    if lines is None:
        return {"source": None, "error": "; ".join(problems), "lookback_s": KERNEL_LOG_LOOKBACK_S, "events": [], "truncated": False}
    events, truncated = xid_events(lines, boot, now_unix_s, since)
    return {"source": source, "error": None, "lookback_s": KERNEL_LOG_LOOKBACK_S, "events": events, "truncated": truncated}


def fabric_manager(proc: str = "/proc") -> dict[str, Any]:
    """FabricManager: whether nvidia-fabricmanager is installed (its unit or binary) and whether nv-fabricmanager
    runs, read from /proc rather than systemctl (a process start on every host for one word)."""
    installed = any(os.path.exists(unit) for unit in FABRIC_MANAGER_UNITS) or which("nv-fabricmanager") is not None
    running = None
    if installed:
        running = False
        try:
            pids = [p for p in os.listdir(proc) if p.isdigit()]
        except OSError:
            pids = []
        for pid in pids[:100_000]:
            if (read_text(os.path.join(proc, pid, "comm")) or "").startswith("nv-fabricmanage"):  # comm is cut at 15
                running = True
                break
    version = None
    binary = which("nv-fabricmanager") if installed else None
    if binary is not None:  # only NVSwitch hosts have it: one short command there, none elsewhere
        ((status, out, err),) = run_commands([[binary, "--version"]], SMI_TIMEOUT_S)
        version = parse_fabric_manager_version(out + err) if status == 0 else None
    return {"installed": installed, "running": running, "version": version}

def pci_place(sys_root: str, bdf: str) -> dict[str, Any]:
    """Where a PCI function sits: its NUMA node, its root complex and the chain of bridges down to it (itself last)."""
    path = os.path.join(sys_root, "bus", "pci", "devices", bdf)
    real = os.path.realpath(path)
    numa = read_int(os.path.join(path, "numa_node"))
    return {"numa_node": numa if numa is not None and numa >= 0 else None,
            "root": next((part for part in real.split(os.sep) if part.startswith("pci")), None),
            "chain": [part for part in real.split(os.sep) if re.match(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", part)]}


def link_speed_gts(text: str | None) -> float | None:
    """A sysfs link speed ("32.0 GT/s PCIe", "8 GT/s") in GT/s, or None ("Unknown", unreadable)."""
    match = re.match(r"([\d.]+) GT/s", text or "")
    return float(match.group(1)) if match else None


def pcie_link(sys_root: str, bdf: str) -> dict[str, Any]:
    """A PCI function's PCIe link as sysfs gives it: current and maximum speed and width."""
    folder = os.path.join(sys_root, "bus", "pci", "devices", bdf)
    return {"speed_gts": link_speed_gts(read_text(os.path.join(folder, "current_link_speed"))),
            "width": read_int(os.path.join(folder, "current_link_width")),
            "max_speed_gts": link_speed_gts(read_text(os.path.join(folder, "max_link_speed"))),
            "max_width": read_int(os.path.join(folder, "max_link_width"))}


def pci_kind(sys_root: str, bdf: str, nics: dict[str, str]) -> str | None:
    """gpu, nvswitch or nic (an RDMA device's function) for the functions the topology is about; None for the rest."""
    if bdf in nics:
        return "nic"
    folder = os.path.join(sys_root, "bus", "pci", "devices", bdf)
    if read_text(os.path.join(folder, "vendor")) != "0x10de":
        return None  # one read for most of a server's hundreds of functions
    klass = read_int(os.path.join(folder, "class")) or 0
    return "gpu" if klass >> 16 == 0x03 else "nvswitch" if klass >> 8 == 0x0680 else None


def read_bytes(path: str, size: int) -> bytes | None:
    """At most size bytes of a file, or None."""
    try:
        with open(path, "rb") as f:
            return f.read(size)
    except OSError:
        return None


def topology(sys_root: str = "/sys", proc: str = "/proc") -> dict[str, Any]:
    """Topology: the GPUs, RDMA NICs and NVSwitches on the PCI tree with their NUMA nodes and bridges, ACS on those
    bridges, the IOMMU, NUMA balancing and the modules GPUDirect RDMA needs."""
    try:
        functions = sorted(os.listdir(os.path.join(sys_root, "bus", "pci", "devices")))
    except OSError:
        functions = []
    nics: dict[str, str] = {}
    ib_root = os.path.join(sys_root, "class", "infiniband")
    try:
        for name in sorted(os.listdir(ib_root)):
            nics.setdefault(os.path.basename(os.path.realpath(os.path.join(ib_root, name, "device"))), name)
    except OSError:
        pass
    devices, bridges = [], set()
    for bdf in functions:
        kind = pci_kind(sys_root, bdf, nics)
        if kind is None:
            continue
        place = pci_place(sys_root, bdf)
        devices.append({"pci": bdf, "kind": kind, "name": nics.get(bdf), "numa_node": place["numa_node"],
                        "root": place["root"], "path": place["chain"][:-1],
                        "pcie_link": pcie_link(sys_root, bdf) if kind == "nic" else None})
        if kind != "nvswitch":
            bridges.update(place["chain"][:-1])
    acs = []
    for bdf in sorted(bridges):
        config = read_bytes(os.path.join(sys_root, "bus", "pci", "devices", bdf, "config"), 4096)
        acs.append({"pci": bdf, "config_bytes": len(config) if config is not None else 0,
                    "acs_ctl": pci_acs_control(config) if config else None})
    cmdline = (read_text(os.path.join(proc, "cmdline")) or "").split()
    gpu_group = next((d["pci"] for d in devices if d["kind"] == "gpu"), None)
    groups_dir = os.path.join(sys_root, "kernel", "iommu_groups")
    try:
        groups = len(os.listdir(groups_dir))
    except OSError:
        groups = 0
    version = read_text(os.path.join(proc, "driver", "nvidia", "version"))
    return {
        "devices": devices,
        "bridges": acs,
        "iommu": {
            "groups": groups,
            "cmdline": [t for t in cmdline if t.split("=")[0] in ("iommu", "intel_iommu", "amd_iommu", "iommu.passthrough")],
            "gpu_domain": read_text(os.path.join(sys_root, "bus", "pci", "devices", gpu_group, "iommu_group", "type"))
            if gpu_group else None,
        },
        "numa_balancing": read_int(os.path.join(proc, "sys", "kernel", "numa_balancing")),
        "peermem_loaded": any(os.path.isdir(os.path.join(sys_root, "module", m)) for m in ("nvidia_peermem", "nv_peer_mem")),
        "nvidia_open_module": None if version is None else "Open Kernel Module" in version,
    }
