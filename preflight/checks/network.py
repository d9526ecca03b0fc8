"""Per-host checks of the network (PF3xx): the hostname's resolution, the socket interface, InfiniBand ports."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

from packaging.version import Version

from preflight.checks.registry import ClusterView, host_check, host_finding
from preflight.checks.versions import parse_version
from preflight.findings import Finding, Status
from preflight.launch import nproc_per_node
from preflight.records import HostRecord, find_interface, ipv4_addresses
from preflight.spec import Backend


@host_check("PF301", "PF302", "PF309")
def hostname_resolution(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """A rendezvous on a name that resolves to loopback binds to 127.0.0.1; gloo, given a name that resolves to no address of
    this host, falls back to 127.0.0.1 itself."""
    host = record.facts["host"]
    if not host["resolves_to"]:
        yield host_finding("PF302", Status.warn, record, f"hostname {host['hostname']!r} does not resolve: {host['resolve_error']}",
                           "add it to /etc/hosts or DNS, or give torchrun --local-addr with this host's IP")
        return
    parsed = {a: ipaddress.ip_address(a.split("%")[0]) for a in host["resolves_to"]}
    loopback = [a for a, ip in parsed.items() if ip.is_loopback]
    foreign = not loopback and _no_address_here(record, parsed)
    if loopback and view.several_hosts:
        yield host_finding("PF301", Status.warn, record,
                           f"hostname {host['hostname']!r} resolves to {', '.join(loopback)}: a rendezvous on it binds to loopback",
                           "map the hostname to the cluster interface's address in /etc/hosts, "
                           "or set GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME")
    elif loopback:
        yield host_finding("PF301", Status.passed, record,
                           f"hostname {host['hostname']!r} resolves to {', '.join(loopback)} (harmless on one host)")
    elif foreign:
        addresses = ", ".join(host["resolves_to"])
        owners = sorted(h.name for h in view.config.cluster.hosts if h.address in host["resolves_to"] and h.name != record.host.name)
        whose = f" ({', '.join(owners)}'s)" if owners else ""
        said = f"hostname {host['hostname']!r} resolves to {addresses}{whose}, an address of no interface of this host"
        ifname = record.facts["nccl"]["env"].get("GLOO_SOCKET_IFNAME")
        if ifname:  # gloo binds that interface's address and never looks the name up
            yield host_finding("PF309", Status.passed, record, f"{said} (harmless: GLOO_SOCKET_IFNAME={ifname})")
        elif view.several_hosts:
            yield host_finding("PF309", Status.warn, record,
                               f"{said}: gloo cannot bind it and falls back to 127.0.0.1, where no other host reaches it",
                               "map the hostname to this host's own address in /etc/hosts or DNS, or set GLOO_SOCKET_IFNAME")
        else:
            yield host_finding("PF309", Status.passed, record, f"{said} (harmless on one host)")
    else:
        yield host_finding("PF301", Status.passed, record, f"hostname {host['hostname']!r} resolves to {', '.join(host['resolves_to'])}")


def _no_address_here(record: HostRecord, resolved: dict[str, ipaddress.IPv4Address | ipaddress.IPv6Address]) -> bool:
    """Whether the hostname resolves only to IPv4 addresses that no interface of the host holds. False where the facts cannot
    tell: an IPv6 answer (the probe reports IPv4 addresses only), or a host that reports no address beyond loopback."""
    here = ipv4_addresses(record.facts)
    if not here - {"127.0.0.1"} or any(ip.version != 4 for ip in resolved.values()):
        return False
    return not here.intersection(resolved)


@host_check("PF303", "PF304")
def socket_interface(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """The configured interface exists, is up, has IPv4, and has the expected MTU."""
    name = view.configured_interface(record)
    if name is None:
        return
    iface = find_interface(record.facts, name)
    names = ", ".join(i["name"] for i in record.facts["net"]["interfaces"] if not i["loopback"])
    if iface is None:
        yield host_finding("PF303", Status.fail, record, f"interface {name} does not exist (this host has: {names or 'none'})",
                           "fix network.socket_ifname or this host's interface in the cluster config")
        return
    # "unknown" is what virtual and some bonded links report while passing traffic.
    if iface["operstate"] not in ("up", "unknown"):
        yield host_finding("PF303", Status.fail, record, f"interface {name} is {iface['operstate']}", f"bring {name} up")
    elif not iface["ipv4"]:
        yield host_finding("PF303", Status.fail, record, f"interface {name} has no IPv4 address", f"configure an address on {name}")
    elif iface["loopback"] and view.several_hosts:
        # gloo and NCCL advertise the socket interface's address to every other rank: 127.0.0.1 here, which each peer
        # connects to on its own host (a run across two sandbox hosts with GLOO_SOCKET_IFNAME=lo: "Gloo connectFullMesh
        # failed ... Connection refused, remote=[127.0.0.1]" on one, "Connect timeout" on the other)
        yield host_finding("PF303", Status.fail, record,
                           f"interface {name} is the loopback ({', '.join(iface['ipv4'])}): gloo and NCCL would advertise it to "
                           "the other hosts, which cannot reach it", "name the interface of the cluster network instead")
    else:
        yield host_finding("PF303", Status.passed, record, f"interface {name} is {iface['operstate']} with {', '.join(iface['ipv4'])}")
    expected = view.config.network.mtu
    if expected is not None:
        if iface["mtu"] == expected:
            yield host_finding("PF304", Status.passed, record, f"interface {name} MTU {iface['mtu']}")
        else:
            yield host_finding("PF304", Status.warn, record, f"interface {name} MTU {iface['mtu']}, expected {expected}",
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
            yield host_finding("PF305", Status.passed, record, f"{hca} ACTIVE ({active[0]['rate'] or 'rate unknown'})")
        elif mine:
            yield host_finding("PF305", Status.fail, record, f"{hca} is {mine[0]['state']} ({mine[0]['phys_state']})",
                               "check the cable and subnet manager (`ibstat`); NCCL would fall back to sockets")
        else:
            yield host_finding("PF305", Status.fail, record, f"{hca} not found", "fix network.ib_hca, or load the RDMA drivers")


# gloo's listeners before the one-listener-per-device change (gloo 31b1f02, pulled into torch by pytorch/pytorch#101472
# "for large distributed training jobs running into ephemeral port exhaustion", May 2023): torch 2.1 is the first release.
ONE_LISTENER_TORCH = Version("2.1")
# The launch's own connections to the store, all to the one master address and port, so each takes a port of its own:
# torchrun's agent holds two, each rank one. Measured (make_logs.py ports-exhausted, torch 2.13, two namespace hosts of
# one rank each): a range of 3 ports failed gloo's bind on both hosts, 4 ran: 2 + 1 + the rank's one listener.
AGENT_STORE_PORTS = 2


def _listeners_per_rank(record: HostRecord, world: int) -> int:
    """The ports bound to port 0 each rank's gloo group takes: one listener, or one per peer before torch 2.1 (an
    unknown or unreadable torch counts as the newer: no warning rests on a guess)."""
    version = parse_version(record.facts["torch"]["version"])
    return max(1, world - 1) if version is not None and version < ONE_LISTENER_TORCH else 1


@host_check("PF310")
def local_ports(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """Enough of the local port range is free for the job's gloo listeners, which bind port 0 (one per rank and gloo
    group; one per peer before torch 2.1), and for the launch's connections to the store, which all go to one address
    and port. A range narrowed, or held by connections in TIME_WAIT, fails "bind: Address already in use" (PF739). A
    gloo job fails there; an NCCL job only where it makes a gloo group too, so it warns. gloo's connections to its peers
    do not count: the kernel gives connections to different peers the same local port. Facts probed before the range
    was read say nothing."""
    groups = view.config.thresholds.local_ports_gloo_groups
    if groups == 0 or "local_ports" not in record.facts["resources"]:
        return
    ports = record.facts["resources"]["local_ports"]
    if ports is None:
        yield host_finding("PF310", Status.warn, record, "the local port range could not be read",
                           "run `sysctl net.ipv4.ip_local_port_range` on the host")
        return
    ranks = nproc_per_node(view.config, view.backend, [record])
    per_rank = _listeners_per_rank(record, ranks * len(view.config.cluster.hosts))
    need = AGENT_STORE_PORTS + ranks * (1 + groups * per_rank)
    size = ports["last"] - ports["first"] + 1 - ports["reserved"]
    free = size - ports["in_use"]
    summary = (f"local ports {ports['first']}-{ports['last']}: {free} free of {size}"
               + (f" ({ports['reserved']} reserved)" if ports["reserved"] else ""))
    listeners = (f"{ranks} rank(s) here, each with its store connection and {per_rank} gloo listener(s) per group"
                 + (" (torch before 2.1: one per peer)" if per_rank > 1 else "") + ", and torchrun's agent")
    if free >= need:
        yield host_finding("PF310", Status.passed, record, f"{summary}, at least {need} for {listeners}")
        return
    status = Status.fail if view.backend == Backend.gloo else Status.warn
    yield host_finding("PF310", status, record,
                       f"{summary}, under {need}: {listeners}, {groups} gloo group(s) (thresholds.local_ports_gloo_groups); "
                       "gloo's listeners would find no port (\"bind: Address already in use\")",
                       "widen net.ipv4.ip_local_port_range, set net.ipv4.tcp_tw_reuse=1, or find what holds the ports "
                       "(`ss -tan state time-wait | wc -l`; `preflight explain PF310`)")
