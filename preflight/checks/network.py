"""Per-host checks of the network (PF3xx): the hostname's resolution, the socket interface, InfiniBand ports."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

from preflight.checks.registry import ClusterView, host_check, host_finding
from preflight.findings import Finding, Status
from preflight.records import HostRecord, find_interface


@host_check("PF301", "PF302")
def hostname_resolution(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """A rendezvous on a name that resolves to loopback binds to 127.0.0.1."""
    host = record.facts["host"]
    if not host["resolves_to"]:
        yield host_finding("PF302", Status.warn, record, f"hostname {host['hostname']!r} does not resolve: {host['resolve_error']}",
                           "add it to /etc/hosts or DNS, or give torchrun --local-addr with this host's IP")
        return
    loopback = [a for a in host["resolves_to"] if ipaddress.ip_address(a.split("%")[0]).is_loopback]
    if loopback and len(view.config.cluster.hosts) > 1:
        yield host_finding("PF301", Status.warn, record,
                           f"hostname {host['hostname']!r} resolves to {', '.join(loopback)}: a rendezvous on it binds to loopback",
                           "map the hostname to the cluster interface's address in /etc/hosts, "
                           "or set GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME")
    elif loopback:
        yield host_finding("PF301", Status.passed, record,
                           f"hostname {host['hostname']!r} resolves to {', '.join(loopback)} (harmless on one host)")
    else:
        yield host_finding("PF301", Status.passed, record, f"hostname {host['hostname']!r} resolves to {', '.join(host['resolves_to'])}")


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
