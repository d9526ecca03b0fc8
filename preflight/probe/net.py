"""Resources and network: /dev/shm, locked memory, open files, CPUs, the temporary folder, interfaces and InfiniBand
ports."""

from __future__ import annotations

import array
import fcntl
import os
import re
import resource
import socket
import struct

from preflight.hostlib.cgroup import cgroup_cpu_quota
from preflight.hostlib.files import read_int, read_text
from preflight.probe.constants import ARPHRD_LOOPBACK, IB_COUNTERS, IB_HW_COUNTERS, IFF_LOOPBACK, SIOCGIFCONF, SIOCGIFNETMASK
from preflight.probe.parse import sysfs_state

# typing costs milliseconds to import on a plain python, and annotations here are never evaluated.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def soft_limit(which: int) -> int | str | None:
    """A resource limit's soft value as the processes started here get it: a number, "unlimited", or None (unreadable)."""
    try:
        soft, _ = resource.getrlimit(which)
    except (OSError, ValueError):
        return None
    return "unlimited" if soft == resource.RLIM_INFINITY else soft


# Where Python's tempfile looks for the folder it hands every process (tempfile._candidate_tempdir_list, 3.8 to 3.13),
# less its last resort, the working folder, which is the job's and not the probe's.
_TEMP_VARIABLES = ("TMPDIR", "TEMP", "TMP")
_TEMP_FOLDERS = ("/tmp", "/var/tmp", "/usr/tmp")


def temp_folder() -> dict[str, Any] | None:
    """TempFolder: the first of tempfile's candidates that is a folder this user may write in, as torchrun's log folder,
    torch.compile's cache and the job's own temporary files get it, with its free space and inodes; None where there is
    none. Judged by access(2), not by writing a file there as tempfile does, so that the probe leaves nothing behind:
    on a full /tmp tempfile's test write fails and it moves on to /var/tmp, while software that names /tmp fails."""
    for path in [os.environ.get(name) for name in _TEMP_VARIABLES] + list(_TEMP_FOLDERS):
        if not path or not os.path.isdir(path) or not os.access(path, os.W_OK | os.X_OK):
            continue
        try:
            fs = os.statvfs(path)
        except OSError:
            continue
        return {"path": os.path.abspath(path), "free_bytes": fs.f_bavail * fs.f_frsize, "total_bytes": fs.f_blocks * fs.f_frsize,
                "free_inodes": fs.f_favail, "total_inodes": fs.f_files}
    return None


def local_ports() -> dict[str, int] | None:
    """LocalPorts: net.ipv4.ip_local_port_range, the ports of it ip_local_reserved_ports keeps out, and the ports of the
    rest a TCP socket of this network namespace holds, in any state (a listener, a connection, TIME_WAIT); None where
    the range cannot be read."""
    try:
        first, last = (int(v) for v in (read_text("/proc/sys/net/ipv4/ip_local_port_range") or "").split())
    except ValueError:
        return None
    reserved: set[int] = set()
    for part in (read_text("/proc/sys/net/ipv4/ip_local_reserved_ports") or "").split(","):
        low, _, high = part.strip().partition("-")
        if low.isdigit() and (high.isdigit() or not high):
            reserved.update(range(max(first, int(low)), min(last, int(high or low)) + 1))
    held: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in (read_text(table) or "").splitlines()[1:]:
            fields = line.split()  # sl local_address rem_address st ...: local_address is HEXADDR:HEXPORT
            if len(fields) > 1 and ":" in fields[1]:
                port = int(fields[1].rsplit(":", 1)[1], 16)
                if first <= port <= last and port not in reserved:
                    held.add(port)
    return {"first": first, "last": last, "reserved": len(reserved), "in_use": len(held)}


def resource_info() -> dict[str, Any]:
    """ResourceInfo: the size of /dev/shm, the locked-memory limit RDMA needs, the open-file limit, the CPUs this host's
    processes get, the temporary folder's free space, and the local ports left for sockets bound to port 0."""
    try:
        shm = os.statvfs("/dev/shm")
        dev_shm: int | None = shm.f_blocks * shm.f_frsize
    except OSError:
        dev_shm = None
    try:
        cpus: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count()
    return {"dev_shm_bytes": dev_shm, "memlock": soft_limit(resource.RLIMIT_MEMLOCK), "nofile": soft_limit(resource.RLIMIT_NOFILE),
            "cpus": cpus, "cpu_quota": cgroup_cpu_quota(), "tmp": temp_folder(), "local_ports": local_ports()}


def ipv4_addresses() -> dict[str, list[str]]:
    """Every interface's IPv4 addresses as "address/prefix", read with ioctls because hosts may lack the ip command."""
    ifreq_size = 40 if struct.calcsize("P") == 8 else 32  # struct ifreq: 16-byte name, then a 24- or 16-byte union
    addresses: dict[str, list[str]] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        size = 32 * ifreq_size
        while True:
            buffer = array.array("B", bytes(size))
            request = struct.pack("iP", size, buffer.buffer_info()[0])  # struct ifconf: length, pointer to the buffer
            used = struct.unpack("iP", fcntl.ioctl(sock.fileno(), SIOCGIFCONF, request))[0]
            if used < size:  # a full buffer may have been cut short
                break
            size *= 2
        data = buffer.tobytes()
        for offset in range(0, used - ifreq_size + 1, ifreq_size):
            ifreq = data[offset:offset + ifreq_size]
            label = ifreq[:16].split(b"\0", 1)[0].decode("utf-8", "replace")
            try:
                # The ifreq as returned carries label and address, so the kernel answers for this very address,
                # not the label's first one.
                mask = fcntl.ioctl(sock.fileno(), SIOCGIFNETMASK, ifreq)
            except OSError:
                continue
            prefix = bin(struct.unpack("!I", mask[20:24])[0]).count("1")
            # An alias label such as eth0:1 is an address of eth0.
            addresses.setdefault(label.split(":", 1)[0], []).append(f"{socket.inet_ntoa(ifreq[20:24])}/{prefix}")
    return addresses


def interfaces() -> list[dict[str, Any]]:
    """Every network interface in /sys/class/net with its state, MTU, speed, MAC and IPv4 addresses."""
    root = "/sys/class/net"
    try:
        names = sorted(n for n in os.listdir(root) if os.path.isdir(os.path.join(root, n)))  # not bonding_masters
    except OSError:
        return []
    try:
        ipv4 = ipv4_addresses()
    except OSError:
        ipv4 = {}
    found = []
    for name in names:
        folder = os.path.join(root, name)
        speed = read_int(os.path.join(folder, "speed"))
        flags = read_int(os.path.join(folder, "flags"))
        found.append({
            "name": name,
            "operstate": read_text(os.path.join(folder, "operstate")) or "unknown",
            "mtu": read_int(os.path.join(folder, "mtu")),
            "speed_mbps": speed if speed is not None and speed >= 0 else None,  # virtual NICs say -1
            "mac": read_text(os.path.join(folder, "address")) or None,
            "ipv4": ipv4.get(name, []),
            "loopback": read_int(os.path.join(folder, "type")) == ARPHRD_LOOPBACK or bool((flags or 0) & IFF_LOOPBACK),
        })
    return found


def infiniband_ports(sys_root: str = "/sys") -> list[dict[str, Any]]:
    """Every port of every RDMA device in /sys/class/infiniband, with its error counters and PCI address."""
    root = os.path.join(sys_root, "class", "infiniband")
    try:
        devices = sorted(os.listdir(root))
    except OSError:
        return []
    ports = []
    for device in devices:
        folder = os.path.join(root, device, "ports")
        try:
            numbers = sorted(int(p) for p in os.listdir(folder) if p.isdigit())
        except OSError:
            continue
        pci = os.path.basename(os.path.realpath(os.path.join(root, device, "device")))
        firmware = read_text(os.path.join(root, device, "fw_ver")) or None
        board = read_text(os.path.join(root, device, "board_id")) or None
        for number in numbers:
            port = os.path.join(folder, str(number))
            counters = {name: read_int(os.path.join(port, "counters", name)) for name in IB_COUNTERS}
            extended = {name: read_int(os.path.join(port, "hw_counters", name)) for name in IB_HW_COUNTERS}
            ports.append({
                "device": device,
                "port": number,
                "state": sysfs_state(read_text(os.path.join(port, "state"))),
                "phys_state": sysfs_state(read_text(os.path.join(port, "phys_state"))),
                "rate": read_text(os.path.join(port, "rate")) or None,
                "link_layer": read_text(os.path.join(port, "link_layer")) or None,
                "pci": pci if re.match(r"^[0-9a-f]{4}:", pci) else None,
                "counters": {k: v for k, v in counters.items() if v is not None},
                "hw_counters": {k: v for k, v in extended.items() if v is not None},
                "fw_ver": firmware,
                "board_id": board,
                "carrier_down_count": port_carrier_downs(os.path.join(root, device, "device", "net"), number),
                "netdev": port_netdev(os.path.join(root, device), number),
            })
    return ports


def port_device_name(net: str, port: int) -> str | None:
    """The network device of an HCA's port among device/net/*: the only one, or the one whose dev_port is port - 1
    (a two-port HCA); None without one."""
    try:
        names = sorted(os.listdir(net))
    except OSError:
        return None
    for name in names:
        if len(names) == 1 or read_int(os.path.join(net, name, "dev_port")) == port - 1:
            return name
    return None


def port_carrier_downs(net: str, port: int) -> int | None:
    """How often the port's network device lost its carrier (/sys/class/net/IF/carrier_down_count, Linux 4.16+): the
    count that does not stop where the 8-bit counters/link_downed does, at 255. None without a device."""
    name = port_device_name(net, port)
    return read_int(os.path.join(net, name, "carrier_down_count")) if name is not None else None


def port_netdev(hca: str, port: int) -> str | None:
    """The interface a port carries (which rail it is): RoCE's gid_attrs/ndevs/0 where the kernel has it (a RoCE bond's
    port names the bond, not a slave), else the HCA's own network device (IPoIB, or a RoCE NIC on an older kernel)."""
    name = read_text(os.path.join(hca, "ports", str(port), "gid_attrs", "ndevs", "0"))
    return name or port_device_name(os.path.join(hca, "device", "net"), port)
