"""Per-rail checks of a rail-optimized cluster (PF306-PF308): each host's NIC r meets every other host's NIC r on rail
switch r, so a rail is judged against its rail peers, and each finding names the host, the rail and its interface.

They run only where the config names rails (network.interfaces or a host's interfaces); a one-rail host's interface
is its socket interface, which PF303 checks.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Iterator, Sequence

from preflight.checks.registry import ClusterView, cross_check, host_check, host_finding
from preflight.findings import CLUSTER, Finding, Status
from preflight.records import HostRecord, Rail, find_interface, host_rails, rails_declared


def rail_label(rail: Rail) -> str:
    """How a finding names a rail: its number, its interface and its RDMA port, e.g. rail 1 (eth1 / mlx5_1:1)."""
    return f"rail {rail.index} ({rail.interface}{f' / {rail.hca}' if rail.hca else ''})"


@host_check("PF306")
def rail_interfaces(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """Every rail's interface exists, is up and has an IPv4 address: a rail without one leaves GPU r without its NIC."""
    if not rails_declared(view.config):
        return
    names = ", ".join(i["name"] for i in record.facts["net"]["interfaces"] if not i["loopback"])
    for rail in host_rails(record.host, record.facts, view.config):
        label = rail_label(rail)
        iface = find_interface(record.facts, rail.interface)
        if iface is None:
            yield host_finding("PF306", Status.fail, record, f"{label} does not exist (this host has: {names or 'none'})",
                               f"find the missing NIC (`ip link`, dmesg), or fix rail {rail.index} in interfaces in the cluster config")
        # "unknown" is what virtual and some bonded links report while passing traffic.
        elif iface["operstate"] not in ("up", "unknown"):
            yield host_finding("PF306", Status.fail, record, f"{label} is {iface['operstate']}",
                               f"bring {rail.interface} up; check its cable and its port on rail switch {rail.index}")
        elif not iface["ipv4"]:
            yield host_finding("PF306", Status.fail, record, f"{label} has no IPv4 address",
                               f"configure {rail.interface}'s address on rail {rail.index}'s subnet")
        else:
            yield host_finding("PF306", Status.passed, record,
                               f"{label} is {iface['operstate']} with {', '.join(iface['ipv4'])}, MTU {iface['mtu']}")


@host_check("PF308")
def rail_ports(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """On a host with RDMA ports, every rail has one and it is ACTIVE: NCCL otherwise sends that rail over sockets."""
    ports = {f"{p['device']}:{p['port']}": p for p in record.facts["net"]["infiniband"]}
    if not rails_declared(view.config) or not ports:
        return
    for rail in host_rails(record.host, record.facts, view.config):
        label = rail_label(rail)
        port = ports.get(rail.hca) if rail.hca else None
        if port is None:
            yield host_finding("PF308", Status.warn, record, f"{label} has no RDMA port: no port carries {rail.interface}",
                               "list the rail's HCA in network.ib_hca (or NCCL_IB_HCA) in rail order, or fix the rail's interface")
        elif port["state"] != "ACTIVE":
            yield host_finding("PF308", Status.fail, record, f"{label} port is {port['state']} ({port['phys_state']})",
                               "check the cable and the subnet manager (`ibstat`): NCCL would leave this rail out or fall back to sockets")
        else:
            how = "its netdev" if rail.tied_by == "netdev" else "the HCA order"
            yield host_finding("PF308", Status.passed, record, f"{label} port ACTIVE ({port['rate'] or 'rate unknown'}), tied by {how}")


def _subnets(record: HostRecord, rail: Rail) -> str | None:
    """The rail interface's IPv4 subnets, e.g. 198.18.1.0/24; None where it has none (PF306 says so)."""
    iface = find_interface(record.facts, rail.interface)
    if iface is None or not iface["ipv4"]:
        return None
    return ", ".join(sorted({str(ipaddress.ip_interface(a).network) for a in iface["ipv4"]}))


@cross_check("PF307")
def rail_subnets(records: Sequence[HostRecord], view: ClusterView) -> Iterator[Finding]:
    """Rail r of every host is on one subnet. Where more than half the hosts agree, each host that differs fails on its
    own (emit-launch can leave it out); with no majority, one failure on the cluster names them."""
    if not rails_declared(view.config):
        return
    rails = {r.host.name: host_rails(r.host, r.facts, view.config) for r in records}
    for index in range(max((len(mine) for mine in rails.values()), default=0)):
        seen = {r.host.name: (rails[r.host.name][index], subnet) for r in records
                if index < len(rails[r.host.name]) and (subnet := _subnets(r, rails[r.host.name][index])) is not None}
        if len(seen) < 2:
            continue
        counts = Counter(subnet for _, subnet in seen.values())
        common, agree = counts.most_common(1)[0]
        if len(counts) == 1:
            yield Finding("PF307", Status.passed, CLUSTER, f"rail {index}: {common} on all {len(seen)} hosts")
            continue
        odd = sorted(name for name, (_, subnet) in seen.items() if subnet != common)
        remedy = f"give every host's rail {index} interface an address on rail {index}'s subnet, and check which switch its cable meets"
        if agree * 2 > len(seen):
            for name in odd:
                rail, subnet = seen[name]
                yield Finding("PF307", Status.fail, name, f"{rail_label(rail)} is on {subnet}; the other {agree} hosts' rail {index} "
                              f"is on {common}", remedy)
        else:
            listed = ", ".join(f"{name} {seen[name][0].interface} on {seen[name][1]}" for name in odd[:8])
            more = f" (+{len(odd) - 8} more)" if len(odd) > 8 else ""
            yield Finding("PF307", Status.fail, CLUSTER, f"rail {index} subnets differ: {listed}{more}; {agree} hosts on {common}",
                          remedy)
