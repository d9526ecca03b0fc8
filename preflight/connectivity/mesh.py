"""preflight's mesh test: run on every host at once, it proves the paths the job will use before torchrun does.

Sent to each host as text, joined after the shared helpers (preflight.bundle.MESH), and run as ``python3 - CONFIG_JSON``
(standard library only). Every host listens on an ephemeral TCP and UDP port of each of its ``networks`` (the job's
interface, or with rails each rail's interface), as gloo and NCCL do; the master also serves a registry on the
rendezvous port, as torchrun's c10d store does, where every host registers and gets the table of all. Then each host,
at once and on every network (rail r to its peers' rail r): connects over TCP to ``tcp_peers`` (ok, filtered, refused,
no route); sends do-not-fragment datagrams at
its MTU, at common smaller sizes and at the loss datagrams' size to ``tcp_peers``, and searches between the largest
that passes and the smallest that does not for the size the path carries (a path-MTU blackhole hangs NCCL on large
messages only); sends small datagrams to ``loss_peers`` and counts the echoes.

It listens until the master says every host is done, prints one JSON object and exits 0; it reports and never judges
(preflight.connectivity does). Every wait has a deadline inside ``total_s``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import socket
import struct
import sys
import threading
import time

from preflight.hostlib.wire import read_config, write_output

# typing costs milliseconds to import on a plain python, and annotations here are never evaluated: the types of this
# script's config and output live in preflight/connectivity/wire.py, for the type checker and for the connectivity
# stage.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from preflight.connectivity.wire import Endpoint, LossRow, MeshConfig, MeshOutput, MtuRow, Network, Registered, Registration
    # Here, and only in annotations: Python 3.8, which a host may run this with, cannot subscript tuple at run time.
    Connected = tuple[str, str, float | None, socket.socket | None]  # result, detail, milliseconds, the socket
    Key = tuple[str, int | None]  # a connect's target: the peer, and the network (rail) it is reached on

IP_MTU_DISCOVER = getattr(socket, "IP_MTU_DISCOVER", 10)
IP_PMTUDISC_DO = getattr(socket, "IP_PMTUDISC_DO", 2)
IP_AND_UDP_HEADERS = 28  # an IPv4 header without options and a UDP header: the datagram of an MTU-sized packet
MAGIC = b"PFM1"
PROBE = struct.Struct("!4sBHI")  # magic, kind (0 loss, 1 mtu), peer index, sequence (mtu: the packet size)
ATTEMPTS_PER_TARGET = 3  # parallel connects per target: one lost SYN (a lossy link) is not "filtered"
MTU_ATTEMPTS = 8  # rounds at most per size: one of them gets through a link losing 30% (all lost: 0.3**8)
MTU_ROUND_S = 0.15  # a round's wait for its echoes before the ones missing are sent again
# The loss datagrams' size, and so the MTU ladder's lowest rung: every IPv4 link carries 68 B, so a path where this
# size fails drops all UDP, and one where it passes has a size the search can start from however small its MTU is.
FLOOR_BYTES = 64
COMMON_MTUS = (9000, 8192, 4096, 1500, 1280)  # the ladder's rungs between a host's MTU and the floor
SEARCH_RUNGS = 15  # sizes tried at once in one phase of the search for a path's MTU
# Phases at most: each narrows a gap 16-fold, and the ladder's widest (4096 -> 8192 B) is narrowed to the byte in 3.
SEARCH_PHASES = 3
RECEIVE_BUFFER = 4 << 20  # asked for each UDP socket (the kernel caps it at net.core.rmem_max): bursts from many peers


now = time.monotonic
RESULTS = {0: "ok", errno.ECONNREFUSED: "refused", errno.EHOSTUNREACH: "no-route", errno.ENETUNREACH: "no-route",
           errno.ETIMEDOUT: "filtered"}


def connect_all(targets: list[tuple[Key, str, int]], timeout_s: float) -> dict[Key, Connected]:
    """TCP connects to every (key, address, port) at once, ATTEMPTS_PER_TARGET sockets each: per key its result, the
    detail, the milliseconds the first success took, and that connected socket (the others are closed)."""
    started = now()
    pending: dict[int, tuple[Key, socket.socket]] = {}
    outcome: dict[Key, Connected] = {}
    errors: dict[Key, list[int]] = {key: [] for key, _, _ in targets}
    poller = select.poll()
    for key, address, port in targets:
        for _ in range(ATTEMPTS_PER_TARGET):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            code = sock.connect_ex((address, port))
            if code not in (0, errno.EINPROGRESS):
                errors[key].append(code)
                sock.close()
                continue
            pending[sock.fileno()] = (key, sock)
            poller.register(sock, select.POLLOUT)
    while pending and (left := started + timeout_s - now()) > 0:
        for fd, _event in poller.poll(left * 1000):
            key, sock = pending.pop(fd)
            poller.unregister(fd)
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code == 0 and key not in outcome:
                sock.setblocking(True)
                outcome[key] = ("ok", "", round((now() - started) * 1000, 2), sock)
            else:
                errors[key].append(code)
                sock.close()
    for key, sock in pending.values():
        sock.close()
        errors[key].append(errno.ETIMEDOUT)
    for key, _, _ in targets:
        if key in outcome:
            continue
        codes = errors[key]
        # One answer of any kind beats silence: a RST or an ICMP says more than a SYN that got none.
        code = next((c for c in codes if c != errno.ETIMEDOUT), errno.ETIMEDOUT)
        detail = f"no answer to a TCP SYN within {timeout_s:g} s" if code == errno.ETIMEDOUT else os.strerror(code)
        outcome[key] = (RESULTS.get(code, "error"), detail, None, None)
    return outcome


def read_line(sock: socket.socket, deadline: float) -> bytes | None:
    """One newline-terminated line from sock by the deadline, None when it closed or the deadline passed."""
    data = b""
    while b"\n" not in data:
        left = deadline - now()
        if left <= 0 or not select.select([sock], [], [], left)[0]:
            return None
        try:
            chunk = sock.recv(65536)
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return data.split(b"\n", 1)[0]


class Served:
    """Sockets a daemon thread serves (serve: one readable socket) until close(), which wakes the thread through a
    socketpair: waited out to a select timeout instead, close() cost a fifth of a second per host in every check."""

    serve: Callable[[socket.socket], None]

    def __init__(self, sockets: list[socket.socket]) -> None:
        self.sockets = sockets
        self.wake_readable, self.wake_writable = socket.socketpair()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            readable = select.select([*self.sockets, self.wake_readable], [], [], 1.0)[0]
            if self.wake_readable in readable:
                return
            for sock in readable:  # an OSError: a peer gone mid-accept, an ICMP error queued (its send counts unanswered)
                with contextlib.suppress(OSError):
                    self.serve(sock)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.wake_writable.send(b"x")
        self.thread.join(1.0)
        for sock in (*self.sockets, self.wake_readable, self.wake_writable):
            sock.close()


class Registry:
    """The master's side: accept every host's registration on the rendezvous port, send the table once all joined
    (or the join deadline passed), then say "end" once all are done (or the deadline passed)."""

    def __init__(self, address: str, port: int, nonce: str, expected: int, join_deadline: float, end_deadline: float) -> None:
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # torchrun's store sets it too: a port left in TIME_WAIT by an earlier run binds again at once.
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind((address, port))
        self.server.listen(1024)
        self.greeting = nonce.encode() + b"\n"
        self.expected = expected
        self.join_deadline = join_deadline
        self.end_deadline = end_deadline
        self.entries: dict[str, Registered] = {}
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        connections: dict[socket.socket, bytes] = {}
        joined: dict[socket.socket, str] = {}
        while len(joined) < self.expected and (left := self.join_deadline - now()) > 0:
            readable = select.select([self.server, *connections], [], [], left)[0]
            for sock in readable:
                if sock is self.server:
                    conn, _ = self.server.accept()
                    with contextlib.suppress(OSError):
                        conn.sendall(self.greeting)
                    connections[conn] = b""
                    continue
                try:
                    chunk = sock.recv(65536)
                except OSError:  # a connect the client dropped (it keeps the first of its parallel ones): reset
                    chunk = b""
                if not chunk:
                    connections.pop(sock)
                    sock.close()
                    continue
                connections[sock] += chunk
                if b"\n" in connections[sock]:
                    try:
                        entry: Registered = json.loads(connections.pop(sock).split(b"\n", 1)[0])
                        self.entries[entry["host"]] = entry
                    except (ValueError, KeyError, TypeError):
                        sock.close()  # not one of this test's hosts
                        continue
                    joined[sock] = entry["host"]
        self.server.close()
        for sock in connections:
            sock.close()
        table = json.dumps({"table": self.entries}).encode() + b"\n"
        for sock in list(joined):
            try:
                sock.sendall(table)
            except OSError:
                joined.pop(sock)
        done: set[socket.socket] = set()
        while len(done) < len(joined) and (left := self.end_deadline - now()) > 0:
            for sock in select.select([s for s in joined if s not in done], [], [], left)[0]:
                with contextlib.suppress(OSError):
                    sock.recv(64)
                done.add(sock)  # "done", or gone: either way nothing more to wait for
        for sock in joined:
            with contextlib.suppress(OSError):
                sock.sendall(b"end\n")
            sock.close()


class Listeners(Served):
    """This host's TCP listener (accepts and closes) and UDP echo (answers each probe with its first bytes)."""

    def __init__(self, address: str) -> None:
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.bind((address, 0))
        self.tcp.listen(1024)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        self.udp.bind((address, 0))
        super().__init__([self.tcp, self.udp])

    def ports(self) -> tuple[int, int]:
        return self.tcp.getsockname()[1], self.udp.getsockname()[1]

    def serve(self, sock: socket.socket) -> None:
        if sock is self.tcp:
            sock.accept()[0].close()
            return
        data, sender = sock.recvfrom(65536)
        if data[:4] == MAGIC:
            sock.sendto(data[:PROBE.size], sender)


def register(config: MeshConfig, listening: list[Endpoint], join_deadline: float
             ) -> tuple[Registration, dict[str, Registered] | None, socket.socket | None]:
    """Connect to the master's rendezvous port (a refusal is retried until the join deadline: its listener may not be up
    yet; silence or no route is final), register, and wait for the table."""
    master = config["master"]
    started = now()
    entry = json.dumps({"host": config["host"], "networks": listening}).encode() + b"\n"
    # A refusal costs a local round trip: retried at once, then less often, so a host waits for the registry by milliseconds.
    pause_s = 0.01
    while True:
        wait_s = min(config["connect_s"], max(join_deadline - now(), 0.1))
        result, detail, ms, sock = connect_all([(("master", None), master["address"], master["port"])], wait_s)[("master", None)]
        if result != "refused" or now() + pause_s >= join_deadline:
            break
        time.sleep(pause_s)
        pause_s = min(pause_s * 2, 0.2)
    answer: Registration = {"result": result, "detail": detail, "ms": ms, "waited_s": round(now() - started, 3)}
    if sock is None:
        return answer, None, None
    line, failure = None, ""
    try:
        if read_line(sock, now() + config["connect_s"]) != config["nonce"].encode():
            # Another service (a job's c10d store, another check) holds the port: its answer is not ours to wait on.
            failure = "something else answers on the rendezvous port, not this test's listener"
        else:
            sock.sendall(entry)
            # The master sends the table when every host joined, or at its join deadline: wait a little past it.
            line = read_line(sock, join_deadline + config["connect_s"] + 2.0)
            failure = "" if line is not None else "the master's registry sent no table"
    except OSError as e:
        failure = f"registering: {e.strerror}"
    if failure or line is None:
        answer["result"], answer["detail"] = "error", failure
        sock.close()
        return answer, None, None
    table: dict[str, Registered] = json.loads(line)["table"]
    return answer, table, sock


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


def main(argv: list[str]) -> int:
    config: MeshConfig = read_config(argv)
    began = now()
    end_deadline = began + config["total_s"]
    join_deadline = began + config["join_s"]
    out: MeshOutput = {"host": config["host"], "address": config["address"], "serving": None, "registry": None, "joined": [],
                       "listening": [], "tcp": [], "loss": [], "mtu": [], "error": None, "elapsed_s": 0.0}
    served: list[Served] = []
    try:
        for network in config["networks"]:
            listeners = Listeners(network["address"])
            served.append(listeners)
            tcp_port, udp_port = listeners.ports()
            out["listening"].append({"rail": network["rail"], "address": network["address"], "tcp": tcp_port, "udp": udp_port})
        if config["is_master"]:
            master = config["master"]
            try:
                Registry(config["address"], master["port"], config["nonce"], config["expected"], join_deadline, end_deadline - 1.0)
                out["serving"] = {"result": "ok", "detail": ""}
            except OSError as e:
                # Someone holds the rendezvous port: the collective says who; there is nothing to test here.
                out["serving"] = {"result": "in-use" if e.errno == errno.EADDRINUSE else "error", "detail": e.strerror or str(e)}
                return finish(out, began)
        answer, table, channel = register(config, out["listening"], join_deadline)
        out["registry"] = answer
        if table is None or channel is None:
            return finish(out, began)
        out["joined"] = sorted(table)
        targets: list[tuple[Key, str, int]] = []
        senders = []
        rows: dict[int | None, tuple[list[LossRow], list[MtuRow]]] = {}
        for network in config["networks"]:
            peers = on_network(table, network["rail"])
            targets += [((p, network["rail"]), peers[p]["address"], peers[p]["tcp"]) for p in config["tcp_peers"] if p in peers]
            prober = Prober(network["address"])
            served.append(prober)
            # The UDP probes run while the TCP connects wait on silent peers, every network's at once: rails cost
            # threads, not time.
            senders.append(threading.Thread(target=probe_peers, args=(config, network, peers, prober, rows), daemon=True))
            senders[-1].start()
        outcome = connect_all(targets, config["connect_s"])
        for (peer, rail), address, port in targets:
            result, detail, ms, sock = outcome[(peer, rail)]
            if sock is not None:
                sock.close()
            out["tcp"].append({"peer": peer, "rail": rail, "address": address, "port": port, "result": result, "detail": detail,
                               "ms": ms})
        for sender in senders:
            sender.join(max(0.0, end_deadline - now() - 1.0))
        for network in config["networks"]:
            loss, mtu = rows.get(network["rail"], ([], []))
            out["loss"] += loss
            out["mtu"] += mtu
        with contextlib.suppress(OSError):
            channel.sendall(b"done\n")
        # Listen on until every host is done testing this one.
        read_line(channel, end_deadline - 0.5)
        channel.close()
    except OSError as e:
        out["error"] = f"{e.strerror or e}"
    finally:
        for part in reversed(served):
            part.close()
    return finish(out, began)


def finish(out: MeshOutput, began: float) -> int:
    out["elapsed_s"] = round(now() - began, 3)
    return write_output(out)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
