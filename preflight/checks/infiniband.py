"""Checks of every InfiniBand/RoCE port (PF831-PF834): up and as fast as the host's fastest port of its kind, error
counters, a link that went down since the last kept report (a flapping link), and NCCL's network plugin on every host
or none (a plugin on some hosts only makes ranks pick different transports, and NCCL hangs).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from preflight.checks.registry import ClusterView, cross_check, host_check, host_finding
from preflight.facts import InfinibandPort
from preflight.findings import CLUSTER, Finding, Status
from preflight.records import HostRecord

# Counters of link trouble; the others under counters/ count traffic.
ERROR_COUNTERS = ("link_downed", "symbol_error", "port_rcv_errors", "link_error_recovery", "local_link_integrity_errors",
                  "excessive_buffer_overrun_errors")


def rate_gbps(rate: str | None) -> float | None:
    """The Gb/s of a sysfs rate: "400 Gb/sec (4X NDR)" -> 400.0; None when unreadable."""
    match = re.match(r"\s*([\d.]+)\s*Gb/sec", rate or "")
    return float(match.group(1)) if match else None


def _name(port: InfinibandPort) -> str:
    return f"{port['device']}:{port['port']}"


@host_check("PF831")
def port_speed(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """Every port is ACTIVE/LinkUp and runs at the rate of the host's fastest port of the same link layer (a port at
    half rate or width drags every ring through it)."""
    ports = record.facts["net"]["infiniband"]
    if not ports:
        return
    fastest: dict[str, float] = {}
    for port in ports:
        speed = rate_gbps(port["rate"])
        if port["state"] == "ACTIVE" and speed is not None:
            layer = port["link_layer"] or "?"
            fastest[layer] = max(fastest.get(layer, 0.0), speed)
    down = [f"{_name(p)} {p['state']}/{p['phys_state']}" for p in ports if p["state"] != "ACTIVE" or p["phys_state"] != "LinkUp"]
    slow = [f"{_name(p)} {p['rate']} (fastest {fastest[p['link_layer'] or '?']:g} Gb/sec)"
            for p in ports if p["state"] == "ACTIVE" and (speed := rate_gbps(p["rate"])) is not None
            and speed < fastest[p["link_layer"] or "?"]]
    if down:
        yield host_finding("PF831", Status.warn, record, "RDMA ports not up: " + "; ".join(down[:8]),
                           "check the cable and the subnet manager (`ibstat`); NCCL uses only the ACTIVE ports")
    if slow:
        yield host_finding("PF831", Status.warn, record, "RDMA ports slower than their peers: " + "; ".join(slow[:8]),
                           "reseat or replace the cable or transceiver; a port trained at a lower rate or width halves its rings")
    if not down and not slow:
        rates = ", ".join(f"{layer} {speed:g} Gb/sec" for layer, speed in sorted(fastest.items()))
        yield host_finding("PF831", Status.passed, record, f"{len(ports)} RDMA ports up at full rate ({rates})")


@host_check("PF832", "PF833")
def port_errors(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """No port counts link errors, and none went down since the last kept report of this host."""
    ports = record.facts["net"]["infiniband"]
    counted = [p for p in ports if "counters" in p]
    if not counted:
        return
    errors = []
    for port in counted:
        nonzero = {k: port["counters"][k] for k in ERROR_COUNTERS if port["counters"].get(k)}
        if nonzero:
            errors.append(f"{_name(port)} " + " ".join(f"{k}={v}" for k, v in nonzero.items()))
    if errors:
        yield host_finding("PF832", Status.warn, record, "RDMA port error counters: " + "; ".join(errors[:8]),
                           "counters add up since the driver loaded: watch whether they grow (`perfquery -x`); a growing "
                           "symbol_error or link_error_recovery is a bad cable or transceiver")
    else:
        yield host_finding("PF832", Status.passed, record, f"no error counted on {len(counted)} RDMA ports")
    before = view.previous.get(record.host.name)
    if before is None:
        return
    earlier = {_name(p): p.get("counters", {}).get("link_downed") for p in before["net"]["infiniband"]}
    flapped = []
    for port in counted:
        was, now = earlier.get(_name(port)), port["counters"].get("link_downed")
        if was is not None and now is not None and now > was:
            flapped.append(f"{_name(port)} link_downed {was} -> {now}")
    if flapped:
        yield host_finding("PF833", Status.fail, record, "RDMA links went down since the last check (flapping): " + "; ".join(flapped[:8]),
                           "drain the node; replace the cable or transceiver of the port, or check its switch port")
    else:
        yield host_finding("PF833", Status.passed, record, "no RDMA link went down since the last check")


@cross_check("PF834")
def same_net_plugin(records: Sequence[HostRecord], view: ClusterView) -> Iterator[Finding]:
    """An NCCL network plugin (libnccl-net*.so) is on every host or on none."""
    found = {r.host.name: r.facts["nccl"].get("net_plugins") for r in records}
    known = {host: plugins for host, plugins in found.items() if plugins is not None}
    with_plugin = sorted(host for host, plugins in known.items() if plugins)
    if not with_plugin or len(known) < 2:
        return
    without = sorted(host for host, plugins in known.items() if not plugins)
    if without:
        yield Finding("PF834", Status.fail, CLUSTER,
                      f"an NCCL network plugin on {len(with_plugin)} hosts ({', '.join(with_plugin[:4])}) but not on "
                      f"{', '.join(without[:8])}: ranks choose different transports and NCCL hangs",
                      "install the same libnccl-net plugin on every host, or remove it everywhere (NCCL_NET_PLUGIN=none)")
    else:
        names = sorted({path.rsplit("/", 1)[-1] for host in with_plugin for path in known[host]})
        yield Finding("PF834", Status.passed, CLUSTER, f"NCCL network plugin {', '.join(names)} on all {len(known)} hosts")
