"""What a sandbox is made of: its names, addresses and hosts, and the limits on them."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from preflight.errors import InputError

DEFAULT_PREFIX = "pf"
DEFAULT_STATE_ROOT = Path("/run/preflight-sandbox")
SUBNETS = ipaddress.ip_network("198.18.0.0/15")  # RFC 2544 benchmarking space: never routed
MAX_HOSTS = 240
MAX_RAILS = 8  # NICs per host of a rail-optimized GPU host; each rail takes a /24 (and a bridge) of its own

FIRST_HOST = 11  # .1 is the bridge (the controller); hosts start at .11
PREFIX = re.compile(r"^[a-z][a-z0-9]{0,7}$")  # 8 + len("-h240-v") = 15, Linux's interface name limit
_NAME_PREFIX = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
_IFNAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,14}$")
_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
TRAINING_UID = 4242


# What a host's own /etc/hosts maps its name to: its address, nothing, 127.0.0.1, or an address of its subnet no host has
# (foreign_address: a stale entry from the image it was cloned from)
OwnName = Literal["address", "missing", "loopback", "foreign"]


@dataclass(frozen=True)
class HostMount:
    """A mount of one host's own over a folder this machine has, which every other host sees as it is."""

    target: str  # an absolute folder on this machine
    kind: Literal["tmpfs", "read-only"]  # a private tmpfs there, or the folder bound onto itself read-only
    size_bytes: int = 64 << 20  # the tmpfs's size


@dataclass(frozen=True)
class HostQuirks:
    """How one host differs from a plain one."""

    ifname: str = "eth0"  # its network interface, e.g. ens5 to reproduce interface drift
    shm_bytes: int | None = None  # size of a tmpfs mounted on its /dev/shm; None: this machine's
    own_name: OwnName = "address"  # what its own /etc/hosts maps its name to
    python: str | None = None  # python of its training environment; None: this one (sys.executable)
    mounts: tuple[HostMount, ...] = ()  # its own mounts, e.g. a local tmpfs where the others share a folder
    # Its sshd's soft open-file limit, which every session inherits (at most this machine's hard limit): as an
    # administrator raises it by default; 1024, systemd's default, for PF208.
    nofile: int = 65536
    # A user its own /etc/passwd adds (uid TRAINING_UID, shell /bin/sh) whom the cluster config logs in as instead of
    # root: a training user that a folder's permissions apply to. Its python must be one that user may run.
    user: str | None = None
    # What its ~/.bashrc prints first, before the stock file's return for shells without a terminal: bash reads it for
    # every sshd session, so a welcome line or a module system's notice there comes before every command's output.
    login_banner: str | None = None


@dataclass(frozen=True)
class Host:
    """One host of a sandbox."""

    name: str  # its hostname, and its name in the cluster config
    address: str  # its IPv4 address on the bridge
    netns: str  # its network namespace
    ifname: str  # its interface, the namespace's end of the veth
    veth: str  # the bridge's end of the veth, in this machine's namespace
    python: str  # python for preflight's probe
    quirks: HostQuirks  # how it was built
    rail_addresses: tuple[str, ...] = ()  # its address on each rail (rail r: interface rail_ifname(r), rail_subnet(index, r))


def subnet_at(index: int) -> ipaddress.IPv4Network:
    """The index-th /24 of SUBNETS."""
    return ipaddress.IPv4Network((int(SUBNETS.network_address) + 256 * index, 24))


def rail_subnet(index: int, rail: int) -> ipaddress.IPv4Network:
    """Rail r's subnet of the sandbox at index: the /24s after its own, one per rail."""
    return subnet_at(index + 1 + rail)


def astray_subnet(index: int, rails: int) -> ipaddress.IPv4Network:
    """The /24 after a sandbox's rails, which no rail uses: where Faults.misaddress_rail puts a rail."""
    return subnet_at(index + 1 + rails)


def subnet_count(rails: int) -> int:
    """The /24s a sandbox takes from its index on: its own, and with rails one per rail and the astray one."""
    return 1 + (rails + 1 if rails else 0)


def foreign_address(index: int) -> str:
    """The address a host with own_name "foreign" maps its name to: the last of its sandbox's /24, which no host and not
    the bridge holds (hosts start at FIRST_HOST and are at most MAX_HOSTS)."""
    return str(subnet_at(index).broadcast_address - 1)


def rail_ifname(rail: int) -> str:
    """A host's interface on rail r: eth1 for rail 0, as a GPU host's rail NICs follow its front-end NIC."""
    return f"eth{rail + 1}"


def validate(n: int, prefix: str, index: int, quirks: Mapping[int, HostQuirks], name_prefix: str, rails: int = 0) -> None:
    """Raise InputError unless Sandbox.up can build these hosts under these names."""
    if not 1 <= n <= MAX_HOSTS:
        raise InputError(f"sandbox: the number of hosts must be 1 to {MAX_HOSTS}, not {n}")
    if not PREFIX.match(prefix):
        raise InputError(f"sandbox: prefix {prefix!r} must be 1 to 8 lowercase letters and digits, starting with a letter")
    if not 0 <= rails <= MAX_RAILS:
        raise InputError(f"sandbox: rails must be 0 to {MAX_RAILS}, not {rails}")
    last = SUBNETS.num_addresses // 256 - subnet_count(rails)
    if not 0 <= index <= last:
        with_rails = f" with {rails} rails (a /24 each, and one spare, after it)" if rails else ""
        raise InputError(f"sandbox: index must be 0 to {last}{with_rails}, not {index}")
    if not _NAME_PREFIX.match(name_prefix):
        raise InputError(f"sandbox: host name prefix {name_prefix!r} must be lowercase letters, digits and '-'")
    for k, q in quirks.items():
        if not 1 <= k <= n:
            raise InputError(f"sandbox: quirks for host {k}, but hosts are 1 to {n}")
        if not _IFNAME.match(q.ifname):
            raise InputError(f"sandbox: interface name {q.ifname!r} of host {k} is not a Linux interface name")
        if q.ifname in {rail_ifname(r) for r in range(rails)}:
            raise InputError(f"sandbox: interface name {q.ifname!r} of host {k} is the name of one of its rails")
        if q.shm_bytes is not None and q.shm_bytes < 4096:
            raise InputError(f"sandbox: /dev/shm of host {k} must be at least 4096 bytes, not {q.shm_bytes}")
        if q.user is not None and (not _USER.match(q.user) or q.user == "root"):
            raise InputError(f"sandbox: user {q.user!r} of host {k} must be a lowercase user name other than root")
        for mount in q.mounts:
            if not (Path(mount.target).is_absolute() and Path(mount.target).is_dir()) or mount.kind not in ("tmpfs", "read-only"):
                raise InputError(f"sandbox: mount {mount.kind!r} of host {k} must be tmpfs or read-only on a folder, not {mount.target!r}")
            if mount.kind == "tmpfs" and mount.size_bytes < 4096:
                raise InputError(f"sandbox: the tmpfs of host {k} at {mount.target} must be at least 4096 bytes")
        if q.own_name not in get_args(OwnName):
            raise InputError(f"sandbox: own_name of host {k} must be one of {', '.join(get_args(OwnName))}, not {q.own_name!r}")
