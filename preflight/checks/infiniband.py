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
# The IB spec's PortCounters widths: a counter at its ceiling stops counting, so a change can no longer be seen.
SATURATED_AT = {"link_downed": 255, "link_error_recovery": 255, "symbol_error": 65535, "port_rcv_errors": 65535,
                "port_xmit_discards": 65535, "local_link_integrity_errors": 15, "excessive_buffer_overrun_errors": 15}
# hw_counters (mlx5) that count transport trouble: drops for want of receive buffers, retransmission timeouts,
# sequence errors and RoCE's adaptive retransmissions; the CNP counters count congestion signals, said, not judged.
HW_ERROR_COUNTERS = ("out_of_buffer", "out_of_sequence", "local_ack_timeout_err", "packet_seq_err", "implied_nak_seq_err",
                     "rnr_nak_retry_err", "req_cqe_error", "resp_cqe_error", "roce_adp_retrans", "roce_adp_retrans_to",
                     "roce_slow_restart")
CONGESTION_COUNTERS = ("np_cnp_sent", "rp_cnp_handled", "np_ecn_marked_roce_packets")


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
            errors.append(f"{_name(port)} " + " ".join(f"{k}={v}{' (saturated)' if _saturated(k, v) else ''}"
                                                      for k, v in nonzero.items()))
    if errors:
        yield host_finding("PF832", Status.warn, record, "RDMA port error counters: " + "; ".join(errors[:8]),
                           "counters add up since the driver loaded: watch whether they grow (`perfquery -x`); a growing "
                           "symbol_error or link_error_recovery is a bad cable or transceiver; a saturated counter counts no "
                           "more until reset (`perfquery -R`)")
    else:
        yield host_finding("PF832", Status.passed, record, f"no error counted on {len(counted)} RDMA ports")
    before = view.previous.get(record.host.name)
    if before is None:
        return
    earlier = {_name(p): p for p in before["net"]["infiniband"]}
    flapped, blind = [], []
    for port in counted:
        then, now = _downs(earlier.get(_name(port))), _downs(port)
        if then is None or now is None or then[0] != now[0]:
            continue  # a counter the last report did not read cannot say what happened since
        counter, (was, count) = now[0], (then[1], now[1])
        if count > was:
            flapped.append(f"{_name(port)} {counter} {was} -> {count}")
        elif counter == "link_downed" and _saturated(counter, count):
            blind.append(_name(port))
    if flapped:
        yield host_finding("PF833", Status.fail, record, "RDMA links went down since the last check (flapping): " + "; ".join(flapped[:8]),
                           "drain the node; replace the cable or transceiver of the port, or check its switch port")
    elif blind:
        yield host_finding("PF833", Status.unknown, record,
                           f"link_downed is saturated at {SATURATED_AT['link_downed']} on {', '.join(blind[:8])} and the port has "
                           "no network device's carrier_down_count: a new flap cannot be seen",
                           "reset the port counters (`perfquery -R -a`); on Linux 4.16+ the port's netdev (IPoIB or RoCE) "
                           "counts carrier downs without a ceiling")
    else:
        yield host_finding("PF833", Status.passed, record, "no RDMA link went down since the last check")


def _saturated(counter: str, value: int) -> bool:
    return value >= SATURATED_AT.get(counter, 1 << 64)


def _downs(port: InfinibandPort | None) -> tuple[str, int] | None:
    """How often a port's link went down: its network device's carrier_down_count where it has one (no ceiling), else
    the 8-bit counters/link_downed."""
    if port is None:
        return None
    extended = port.get("carrier_down_count")
    if extended is not None:
        return "carrier_down_count", extended
    basic = port.get("counters", {}).get("link_downed")
    return None if basic is None else ("link_downed", basic)


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


@host_check("PF836")
def transport_counters(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """No RDMA port counts transport errors in hw_counters (receive-buffer drops, ACK timeouts, sequence errors,
    RoCE retransmissions); congestion notifications are said beside them."""
    ports = [p for p in record.facts["net"]["infiniband"] if p.get("hw_counters")]
    if not ports:
        return
    errors, congestion = [], []
    for port in ports:
        counters = port["hw_counters"]
        nonzero = {k: counters[k] for k in HW_ERROR_COUNTERS if counters.get(k)}
        if nonzero:
            errors.append(f"{_name(port)} " + " ".join(f"{k}={v}" for k, v in nonzero.items()))
        cnps = {k: counters[k] for k in CONGESTION_COUNTERS if counters.get(k)}
        if cnps:
            congestion.append(f"{_name(port)} " + " ".join(f"{k}={v}" for k, v in cnps.items()))
    note = f" (congestion notifications: {'; '.join(congestion[:4])})" if congestion else ""
    if errors:
        yield host_finding("PF836", Status.warn, record, "RDMA transport error counters: " + "; ".join(errors[:6]) + note,
                           "see `preflight explain PF836`: out_of_buffer is a receiver too slow to post buffers, "
                           "local_ack_timeout_err and retransmissions are lost packets (PFC/ECN on RoCE, cabling on IB)")
    else:
        yield host_finding("PF836", Status.passed, record, f"no transport error counted on {len(ports)} RDMA ports{note}")


@cross_check("PF835")
def same_hca_firmware(records: Sequence[HostRecord], view: ClusterView) -> Iterator[Finding]:
    """Every HCA of one board (board_id, the PSID) runs the same firmware, on every host."""
    seen: dict[str, dict[str, list[str]]] = {}  # board -> firmware -> host:device
    for record in records:
        for port in record.facts["net"]["infiniband"]:
            board, firmware = port.get("board_id"), port.get("fw_ver")
            if board and firmware:
                where = f"{record.host.name}:{port['device']}"
                places = seen.setdefault(board, {}).setdefault(firmware, [])
                if where not in places:
                    places.append(where)
    if not seen:
        return
    drift = {board: versions for board, versions in seen.items() if len(versions) > 1}
    for board, versions in sorted(drift.items()):
        common = max(versions, key=lambda v: len(versions[v]))
        odd = "; ".join(f"{v} on {', '.join(places[:4])}" for v, places in sorted(versions.items()) if v != common)
        yield Finding("PF835", Status.warn, CLUSTER,
                      f"HCA firmware differs across {board} boards: {odd} (the others run {common}, "
                      f"{len(versions[common])} HCAs)",
                      "flash every HCA of one board to the same firmware (`mlxfwmanager --query`, `mlxfwmanager -u`); mixed "
                      "firmware changes RDMA behaviour between ranks")
    if not drift:
        boards = ", ".join(f"{board} {next(iter(v))}" for board, v in sorted(seen.items()))
        yield Finding("PF835", Status.passed, CLUSTER, f"one firmware per HCA board: {boards}")
