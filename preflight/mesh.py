"""preflight's mesh test: run on every host at once, it proves the paths the job will use before torchrun does.

Sent to each host as text and run as ``python3 - CONFIG_JSON`` (standard library only, like the probe). Every host
listens on an ephemeral TCP port and an ephemeral UDP port of the job's interface address, as gloo and NCCL do. The
master also holds the rendezvous port and serves a small registry there, as torchrun's c10d store does: every host
(the master too) connects to it, registers its ports, and gets back the table of every host that registered. Then each
host, at once:

- opens TCP connections to the peers it was given (``tcp_peers``): ok, filtered (no answer to a SYN), refused (RST),
  no route (ICMP unreachable);
- sends small UDP datagrams to ``loss_peers`` and counts the echoes (packet loss and round-trip time);
- sends do-not-fragment UDP datagrams at its interface's MTU (and smaller sizes) to ``tcp_peers``: a size that never
  comes back while a smaller one does is a path-MTU blackhole, the fault that hangs NCCL on large messages only.

It keeps its listeners up until the master says every host is done (or the deadline passes), prints one JSON object and
exits 0; it reports and never judges (preflight.connectivity does). Every wait has a deadline inside ``total_s``.
"""

from __future__ import annotations

import sys

# Run as `python3 -`, the first import path is the remote shell's folder; nothing there may shadow the standard library.
if __name__ == "__main__" and sys.path and not sys.flags.isolated and not getattr(sys.flags, "safe_path", False):
    del sys.path[0]

import contextlib
import errno
import json
import os
import select
import socket
import struct
import threading
import time

# typing costs milliseconds to import on a plain python, and annotations here are never evaluated: the types of this
# script's config and output live in preflight/mesh_wire.py, for the type checker and for preflight.connectivity.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from preflight.mesh_wire import Endpoint, LossRow, MeshConfig, MeshOutput, MtuRow, Registration
    # Here, and only in annotations: Python 3.8, which a host may run this with, cannot subscript tuple at run time.
    Connected = tuple[str, str, float | None, socket.socket | None]  # result, detail, milliseconds, the socket

IP_MTU_DISCOVER = getattr(socket, "IP_MTU_DISCOVER", 10)
IP_PMTUDISC_DO = getattr(socket, "IP_PMTUDISC_DO", 2)
IP_AND_UDP_HEADERS = 28  # an IPv4 header without options and a UDP header: the datagram of an MTU-sized packet
MAGIC = b"PFM1"
PROBE = struct.Struct("!4sBHI")  # magic, kind (0 loss, 1 mtu), peer index, sequence (mtu: the packet size)
ATTEMPTS_PER_TARGET = 3  # parallel connects per target: one lost SYN (a lossy link) is not "filtered"
MTU_ATTEMPTS = 8  # rounds at most per size: one of them gets through a link losing 30% (all lost: 0.3**8)
MTU_ROUND_S = 0.15  # a round's wait for its echoes before the ones missing are sent again
RECEIVE_BUFFER = 4 << 20  # asked for each UDP socket (the kernel caps it at net.core.rmem_max): bursts from many peers


def now() -> float:
    return time.monotonic()


def classify(code: int) -> str:
    if code == 0:
        return "ok"
    if code == errno.ECONNREFUSED:
        return "refused"
    if code in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return "no-route"
    if code == errno.ETIMEDOUT:
        return "filtered"
    return "error"


def connect_all(targets: list[tuple[str, str, int]], timeout_s: float) -> dict[str, Connected]:
    """TCP connects to every (key, address, port) at once, ATTEMPTS_PER_TARGET sockets each: per key its result, the
    detail, the milliseconds the first success took, and that connected socket (the others are closed)."""
    started = now()
    pending: dict[int, tuple[str, socket.socket]] = {}
    outcome: dict[str, Connected] = {}
    errors: dict[str, list[int]] = {key: [] for key, _, _ in targets}
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
        outcome[key] = (classify(code), detail, None, None)
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
        self.entries: dict[str, Endpoint] = {}
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
                        entry: Endpoint = json.loads(connections.pop(sock).split(b"\n", 1)[0])
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
                try:
                    chunk = sock.recv(64)
                except OSError:
                    chunk = b""
                done.add(sock)  # "done", or gone: either way nothing more to wait for
        for sock in joined:
            with contextlib.suppress(OSError):
                sock.sendall(b"end\n")
            sock.close()


class Listeners:
    """This host's TCP listener (accepts and closes) and UDP echo (answers each probe with its first bytes)."""

    def __init__(self, address: str) -> None:
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.bind((address, 0))
        self.tcp.listen(1024)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        self.udp.bind((address, 0))
        self.stopping = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def ports(self) -> tuple[int, int]:
        return self.tcp.getsockname()[1], self.udp.getsockname()[1]

    def _serve(self) -> None:
        while not self.stopping:
            for sock in select.select([self.tcp, self.udp], [], [], 0.2)[0]:
                try:
                    if sock is self.tcp:
                        sock.accept()[0].close()
                    else:
                        data, sender = sock.recvfrom(65536)
                        if data[:4] == MAGIC:
                            sock.sendto(data[:PROBE.size], sender)
                except OSError:
                    continue

    def close(self) -> None:
        self.stopping = True
        self.thread.join(1.0)
        self.tcp.close()
        self.udp.close()


def register(config: MeshConfig, tcp_port: int, udp_port: int, join_deadline: float
             ) -> tuple[Registration, dict[str, Endpoint] | None, socket.socket | None]:
    """Connect to the master's rendezvous port (a refusal is retried until the join deadline: its listener may not be up
    yet; silence or no route is final), register, and wait for the table."""
    master = config["master"]
    started = now()
    entry = json.dumps({"host": config["host"], "address": config["address"], "tcp": tcp_port, "udp": udp_port}).encode() + b"\n"
    while True:
        left = join_deadline - now()
        outcome = connect_all([("master", master["address"], master["port"])], min(config["connect_s"], max(left, 0.1)))
        result, detail, ms, sock = outcome["master"]
        if result != "refused" or now() + 0.2 >= join_deadline:
            break
        time.sleep(0.2)
    answer: Registration = {"result": result, "detail": detail, "ms": ms, "waited_s": round(now() - started, 3)}
    if sock is None:
        return answer, None, None
    if read_line(sock, now() + config["connect_s"]) != config["nonce"].encode():
        # Another service (a job's c10d store, another check) holds the port: its answer is not ours to wait on.
        answer["result"], answer["detail"] = "error", "something else answers on the rendezvous port, not this test's listener"
        sock.close()
        return answer, None, None
    try:
        sock.sendall(entry)
    except OSError as e:
        answer["result"], answer["detail"] = "error", f"registering: {e.strerror}"
        sock.close()
        return answer, None, None
    # The master sends the table when every host joined, or at its join deadline: wait a little past it.
    line = read_line(sock, join_deadline + config["connect_s"] + 2.0)
    if line is None:
        answer["result"], answer["detail"] = "error", "the master's registry sent no table"
        sock.close()
        return answer, None, None
    table: dict[str, Endpoint] = json.loads(line)["table"]
    return answer, table, sock


class Prober:
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
        self.stopping = False
        self.thread = threading.Thread(target=self._collect, daemon=True)
        self.thread.start()

    def _collect(self) -> None:
        while not self.stopping:
            if not select.select([self.sock], [], [], 0.1)[0]:
                continue
            try:
                data = self.sock.recv(65536)
            except OSError:
                continue  # an ICMP error queued on the socket: the send that caused it is counted unanswered
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

    def close(self) -> None:
        self.stopping = True
        self.thread.join(1.0)
        self.sock.close()


def mtu_sizes(mtu: int | None) -> list[int]:
    """The packet sizes to try towards each peer: the interface's MTU, then smaller steps to tell how much passes."""
    if not mtu:
        return []
    steps = [s for s in (9000, 8192, 4096, 1500, 1280) if s < mtu]
    return [mtu, *steps]


def probe_peers(config: MeshConfig, table: dict[str, Endpoint], prober: Prober) -> tuple[list[LossRow], list[MtuRow]]:
    """MTU datagrams first, in rounds that resend only what has not come back (one round on a healthy path, MTU_ATTEMPTS
    where a size is black-holed), then the loss datagrams, paced, and a grace period for their echoes, so that neither
    burst swells the other's count: (loss rows, mtu rows)."""
    names = sorted(table)
    index = {name: i for i, name in enumerate(names)}
    loss_peers = [p for p in config["loss_peers"] if p in table]
    mtu_peers = [p for p in config["tcp_peers"] if p in table]
    sizes = mtu_sizes(config.get("mtu"))
    answered: set[tuple[int, int]] = set()  # (peer, size) that came back
    for attempt in range(MTU_ATTEMPTS if sizes else 0):
        waiting = [(peer, size) for peer in mtu_peers for size in sizes if (index[peer], size) not in answered]
        if not waiting:
            break
        for peer, size in waiting:
            prober.send(1, index[peer], size * MTU_ATTEMPTS + attempt, size, (table[peer]["address"], table[peer]["udp"]))
        round_end = now() + MTU_ROUND_S
        while now() < round_end:
            time.sleep(0.02)
            answered = {(peer, seq // MTU_ATTEMPTS) for kind, peer, seq in list(prober.echoed) if kind == 1}
            if all((index[peer], size) in answered for peer, size in waiting):
                break
    count = config["loss_probes"]
    pace_s = config["loss_window_s"] / max(count, 1)
    for attempt in range(count if loss_peers else 0):
        for peer in loss_peers:
            prober.send(0, index[peer], attempt, 64, (table[peer]["address"], table[peer]["udp"]))
        time.sleep(pace_s)
    grace_end = now() + config["echo_grace_s"]
    while now() < grace_end and any(k not in prober.echoed for k in list(prober.sent_at) if k[0] == 0):
        time.sleep(0.02)
    loss: list[LossRow] = []
    for peer in loss_peers:
        sent = [(k, t) for k, t in list(prober.sent_at.items()) if k[0] == 0 and k[1] == index[peer]]
        rtts = sorted(prober.echoed[k] - t for k, t in sent if k in prober.echoed)
        loss.append({"peer": peer, "sent": len(sent), "echoed": len(rtts),
                     "rtt_ms": round(rtts[len(rtts) // 2] * 1000, 3) if rtts else None})
    mtu: list[MtuRow] = []
    for peer in mtu_peers:
        passed = [size for size in sizes if (index[peer], size) in answered]
        refused = {str(size): prober.too_big[(index[peer], size)] for size in sizes if (index[peer], size) in prober.too_big}
        mtu.append({"peer": peer, "sizes": sizes, "passed": passed, "local_refusals": refused})
    return loss, mtu


def main(argv: list[str]) -> int:
    config: MeshConfig = json.loads(argv[1])
    began = now()
    end_deadline = began + config["total_s"]
    join_deadline = began + config["join_s"]
    out: MeshOutput = {"host": config["host"], "address": config["address"], "serving": None, "registry": None, "joined": [],
                       "ports": {}, "tcp": [], "loss": [], "mtu": [], "error": None, "elapsed_s": 0.0}
    listeners = None
    prober = None
    try:
        listeners = Listeners(config["address"])
        tcp_port, udp_port = listeners.ports()
        out["ports"] = {"tcp": tcp_port, "udp": udp_port}
        if config["is_master"]:
            master = config["master"]
            try:
                Registry(config["address"], master["port"], config["nonce"], config["expected"], join_deadline, end_deadline - 1.0)
                out["serving"] = {"result": "ok", "detail": ""}
            except OSError as e:
                # Someone holds the rendezvous port: the collective says who; there is nothing to test here.
                out["serving"] = {"result": "in-use" if e.errno == errno.EADDRINUSE else "error", "detail": e.strerror or str(e)}
                return finish(out, began)
        answer, table, channel = register(config, tcp_port, udp_port, join_deadline)
        out["registry"] = answer
        if table is None or channel is None:
            return finish(out, began)
        out["joined"] = sorted(table)
        targets = [(p, table[p]["address"], table[p]["tcp"]) for p in config["tcp_peers"] if p in table]
        prober = Prober(config["address"])
        peers, probes = table, prober

        # The UDP probes run while the TCP connects wait on silent peers.
        def probe() -> None:
            out["loss"], out["mtu"] = probe_peers(config, peers, probes)

        sender = threading.Thread(target=probe, daemon=True)
        sender.start()
        outcome = connect_all(targets, config["connect_s"])
        for peer, address, port in targets:
            result, detail, ms, sock = outcome[peer]
            if sock is not None:
                sock.close()
            out["tcp"].append({"peer": peer, "address": address, "port": port, "result": result, "detail": detail, "ms": ms})
        sender.join(max(0.0, end_deadline - now() - 1.0))
        with contextlib.suppress(OSError):
            channel.sendall(b"done\n")
        # Listen on until every host is done testing this one.
        read_line(channel, end_deadline - 0.5)
        channel.close()
    except OSError as e:
        out["error"] = f"{e.strerror or e}"
    finally:
        for part in (prober, listeners):
            if part is not None:
                part.close()
    return finish(out, began)


def finish(out: MeshOutput, began: float) -> int:
    out["elapsed_s"] = round(now() - began, 3)
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
