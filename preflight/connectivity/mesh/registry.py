"""The mesh test's registry: the master serves it on the rendezvous port, where every host registers its listening
endpoints and gets the table of all; the listeners every host keeps open for its peers' connects."""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
import time

from preflight.connectivity.mesh.sockets import MAGIC, PROBE, RECEIVE_BUFFER, connect_all, now, read_line

# The types, for the type checker only: typing is not imported (see sockets.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from preflight.connectivity.wire import Endpoint, MeshConfig, Registered, Registration


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
