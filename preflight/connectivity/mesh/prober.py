"""The mesh test's UDP probes: loss datagrams and the search for each path's MTU, every network at once."""

from __future__ import annotations

import errno
import socket
import time

from preflight.connectivity.mesh.registry import Served
from preflight.connectivity.mesh.sockets import (
    COMMON_MTUS,
    FLOOR_BYTES,
    IP_AND_UDP_HEADERS,
    IP_MTU_DISCOVER,
    IP_PMTUDISC_DO,
    MAGIC,
    MTU_ATTEMPTS,
    MTU_ROUND_S,
    PROBE,
    RECEIVE_BUFFER,
    SEARCH_PHASES,
    SEARCH_RUNGS,
    now,
)

# The types, for the type checker only: typing is not imported (see sockets.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from preflight.connectivity.wire import Endpoint, LossRow, MeshConfig, MtuRow, Network, Registered


class Prober(Served):
    """UDP probes from one socket with do-not-fragment set: loss datagrams to some peers, MTU-sized ones to others;
    a thread collects the echoes."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        self.sock.bind((address, 0))
        self.sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
        self.sent_at: dict[tuple[int, int, int], float] = {}
        self.echoed: dict[tuple[int, int, int], float] = {}
        self.too_big: dict[tuple[int, int], str] = {}
        super().__init__([self.sock])

    def serve(self, sock: socket.socket) -> None:
        data = sock.recv(65536)
        if len(data) >= PROBE.size:
            magic, kind, peer, seq = PROBE.unpack(data[:PROBE.size])
            if magic == MAGIC:
                self.echoed.setdefault((kind, peer, seq), now())

    def send(self, kind: int, peer: int, seq: int, size: int, target: tuple[str, int]) -> None:
        body = PROBE.pack(MAGIC, kind, peer, seq)
        payload = body + b"\0" * max(0, size - IP_AND_UDP_HEADERS - len(body))
        key = (kind, peer, seq)
        # The time is taken before the send: the echo can come back, and the collecting thread stamp it, before
        # sendto returns to this one, which made round trips negative on a loaded host.
        self.sent_at.setdefault(key, now())
        try:
            self.sock.sendto(payload, target)
        except OSError as e:
            del self.sent_at[key]
            if e.errno == errno.EMSGSIZE:
                self.too_big[(peer, size)] = "the kernel refused it: this host's route to the peer has a smaller MTU"

    def answered(self) -> set[tuple[int, int]]:
        """The (peer, size) of the MTU datagrams that came back."""
        return {(peer, seq // MTU_ATTEMPTS) for kind, peer, seq in list(self.echoed) if kind == 1}


def mtu_sizes(mtu: int | None) -> list[int]:
    """The packet sizes to try towards each peer: the interface's MTU, the common MTUs below it, and the floor, so that
    the search always has a size that passed to start from where UDP gets through at all."""
    return [mtu, *(s for s in (*COMMON_MTUS, FLOOR_BYTES) if s < mtu)] if mtu else []


def search_rungs(low: int, high: int) -> list[int]:
    """Sizes strictly between low (passed) and high (failed), evenly spaced, at most SEARCH_RUNGS: tried at once, so
    that SEARCH_PHASES phases narrow a gap of thousands of bytes to the exact size."""
    count = min(SEARCH_RUNGS, high - low - 1)
    return sorted({low + (high - low) * k // (count + 1) for k in range(1, count + 1)})


def next_rungs(sizes: list[int], passed: set[int]) -> list[int]:
    """One path's next phase: the rungs between the largest size that passed and the smallest above it tried; none
    when nothing passed (no UDP gets through) or those two are a byte apart (the path's MTU is found)."""
    low = max([0, *(s for s in sizes if s in passed)])
    high = min([s for s in sizes if s > low], default=0)
    return search_rungs(low, high) if low and high > low + 1 else []


def mtu_rounds(prober: Prober, index: dict[str, int], table: dict[str, Endpoint], pairs: list[tuple[str, int]]) -> None:
    """Do-not-fragment datagrams of each (peer, size), in rounds that resend only what has not come back (one round on
    a healthy path, MTU_ATTEMPTS where a size is black-holed); a size below one that came back needs no resend."""
    for attempt in range(MTU_ATTEMPTS if pairs else 0):
        answered = prober.answered()
        best = {peer: max([0, *(size for p, size in answered if p == index[peer])]) for peer, _ in pairs}
        waiting = [(peer, size) for peer, size in pairs if size > best[peer]]
        if not waiting:
            return
        for peer, size in waiting:
            prober.send(1, index[peer], size * MTU_ATTEMPTS + attempt, size, (table[peer]["address"], table[peer]["udp"]))
        round_end = now() + MTU_ROUND_S
        while now() < round_end:
            time.sleep(0.02)
            if prober.answered().issuperset((index[peer], size) for peer, size in waiting):
                break


def on_network(table: dict[str, Registered], rail: int | None) -> dict[str, Endpoint]:
    """Each registered host's listeners on one network: its rail r for rail r; a host without that rail is absent."""
    return {host: e for host, entry in table.items() for e in entry["networks"] if e["rail"] == rail}


def probe_peers(config: MeshConfig, network: Network, table: dict[str, Endpoint], prober: Prober,
                rows: dict[int | None, tuple[list[LossRow], list[MtuRow]]]) -> None:
    """MTU datagrams first (the ladder of mtu_sizes, then a search between the largest size that passed and the smallest
    that failed), then the loss datagrams, paced, and a grace period for their echoes, so that neither burst swells the
    other's count; the rows of this network (table: the peers' listeners on it) go into rows under its rail."""
    rail = network["rail"]
    index = {name: i for i, name in enumerate(sorted(table))}
    loss_peers = [p for p in config["loss_peers"] if p in table]
    mtu_peers = [p for p in config["tcp_peers"] if p in table]
    tried = {peer: mtu_sizes(network["mtu"]) for peer in mtu_peers}
    mtu_rounds(prober, index, table, [(peer, size) for peer in mtu_peers for size in tried[peer]])
    for _ in range(SEARCH_PHASES):
        answered = prober.answered()
        rungs = {}
        for peer, sizes in tried.items():
            found = next_rungs(sizes, {size for p, size in answered if p == index[peer]})
            if found:
                rungs[peer] = found
                sizes += found
        if not rungs:
            break
        mtu_rounds(prober, index, table, [(peer, size) for peer, sizes in rungs.items() for size in sizes])
    count = config["loss_probes"]
    pace_s = config["loss_window_s"] / max(count, 1)
    for attempt in range(count if loss_peers else 0):
        for peer in loss_peers:
            prober.send(0, index[peer], attempt, FLOOR_BYTES, (table[peer]["address"], table[peer]["udp"]))
        time.sleep(pace_s)
    grace_end = now() + config["echo_grace_s"]
    while now() < grace_end and any(k not in prober.echoed for k in list(prober.sent_at) if k[0] == 0):
        time.sleep(0.02)
    loss: list[LossRow] = []
    for peer in loss_peers:
        sent = [(k, t) for k, t in list(prober.sent_at.items()) if k[0] == 0 and k[1] == index[peer]]
        rtts = sorted(prober.echoed[k] - t for k, t in sent if k in prober.echoed)
        loss.append({"peer": peer, "rail": rail, "sent": len(sent), "echoed": len(rtts),
                     "rtt_ms": round(rtts[len(rtts) // 2] * 1000, 3) if rtts else None})
    mtu: list[MtuRow] = []
    answered = prober.answered()
    for peer, sizes in tried.items():
        passed = [size for size in sizes if (index[peer], size) in answered]
        refused = {str(size): prober.too_big[(index[peer], size)] for size in sizes if (index[peer], size) in prober.too_big}
        mtu.append({"peer": peer, "rail": rail, "sizes": sizes, "passed": passed, "local_refusals": refused})
    rows[rail] = (loss, mtu)
