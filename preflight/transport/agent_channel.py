"""The agents' channel: a key-value store of their own over TCP, in the standard library alone, served by rank 0's agent.

``preflight agent`` needs from its launcher only who it is (rank, world size) and where rank 0 is (MASTER_ADDR). torch's
c10d store would carry the rest, but every process that imports torch holds about 150 MB of its own, and a host under
the agents runs two already (torchrun's agent, and in the collective the host's rank): a third on every host, the agent,
is what ran a 64-host launch out of memory. Nor do the agents speak torch's TCPStore protocol without torch: it is no
stable interface (torch 2.1 made every client's first message a validation query of its own, pytorch/pytorch#107607,
and a client without it is cut off), so the agents speak this one, and the agent never imports torch.

Frames: a 4-byte big-endian length, then a JSON object. A client's first frame is a hello naming the protocol and the
launch's run id; the server answers it, or says why not and closes. Then each request gets one answer: ``set``,
``get``, ``check`` (is every key there now?) and ``wait`` (until every key is there or the request's own timeout
passes; the answer says which). The server holds a wait itself, so a waiting client polls nothing. Every client call has
a socket deadline: its own bound plus REPLY_ALLOWANCE_S; a call that fails closes its connection, which never carries a
late answer into the next call.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import socket
import struct
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import TypedDict

PROTOCOL = "preflight-agents/1"
# A frame's largest length: a value is at most a command's captured output; a larger length is not this protocol.
LARGEST_FRAME = 1 << 30
HELLO_S = 10.0  # a connection that has not said hello within this is not an agent's; also a client's bound on the answer
REPLY_ALLOWANCE_S = 10.0  # beyond a call's own bound: the server's host busy, the frame in flight
RETRY_S = 0.2  # between two rounds of attempts to reach a server that is not up yet
CLOSE_S = 5.0  # what closing the server waits for its thread
_LENGTH = struct.Struct(">I")


class ChannelError(ConnectionError):
    """The channel cannot be reached, is gone, or answered with something that is not this protocol."""


class Frame(TypedDict, total=False):
    """One frame, either way: a hello (hello, run) and its answer (hello, or error), a request (op: set, get, check or
    wait, with what the op reads) or its answer (ok, value or present)."""

    hello: str  # the protocol: the client's first frame, and the server's answer when it takes the client
    run: str  # the launch's run id, in the hello: a channel serves one launch
    error: str  # why the server does not take this client
    op: str
    key: str
    value: str | None  # what set stores; get's answer (None: not there)
    keys: list[str]
    timeout_s: float  # a wait's bound, kept by the server
    ok: bool
    present: bool  # check's and wait's answer: every key is there


def _frame(message: Frame) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    return _LENGTH.pack(len(body)) + body


def _parsed(body: bytes) -> Frame:
    message = json.loads(body)
    if not isinstance(message, dict):
        raise ValueError("a frame that is not a JSON object")
    return message  # type: ignore[return-value]  # JSON read for Frame's fields: each is checked where it is used


def _length(header: bytes) -> int:
    (length,) = _LENGTH.unpack(header)
    if length > LARGEST_FRAME:
        raise ValueError(f"a frame of {length} bytes")
    return int(length)


class ChannelClient:
    """One connection to the channel. Its calls take turns: a thread that waits takes a client of its own."""

    def __init__(self, sock: socket.socket, timeout_s: float) -> None:
        self._sock: socket.socket | None = sock
        self._timeout_s = timeout_s

    def __enter__(self) -> ChannelClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _call(self, request: Frame, bound_s: float) -> Frame:
        sock = self._sock
        if sock is None:
            raise ChannelError("this connection to the agents' channel was closed after a failed call")
        try:
            sock.settimeout(bound_s + REPLY_ALLOWANCE_S)
            sock.sendall(_frame(request))
            return _parsed(_receive(sock, _length(_receive(sock, _LENGTH.size))))
        except (OSError, ValueError) as e:
            self.close()
            raise ChannelError(f"the agents' channel: {e}") from None

    def set(self, key: str, value: str) -> None:
        self._call({"op": "set", "key": key, "value": value}, self._timeout_s)

    def get(self, key: str) -> str | None:
        value = self._call({"op": "get", "key": key}, self._timeout_s).get("value")
        return value if isinstance(value, str) else None

    def check(self, keys: Sequence[str]) -> bool:
        return self._call({"op": "check", "keys": list(keys)}, self._timeout_s).get("present") is True

    def wait(self, keys: Sequence[str], timeout_s: float) -> bool:
        """Whether every key is there, once it is or once timeout_s has passed."""
        timeout_s = max(0.0, timeout_s)
        return self._call({"op": "wait", "keys": list(keys), "timeout_s": timeout_s}, timeout_s).get("present") is True

    def get_or_gone(self, key: str) -> str | None:
        """get, with None also where the channel is gone: for a reader that then judges what arrived."""
        try:
            return self.get(key)
        except ChannelError:
            return None

    def wait_or_gone(self, keys: Sequence[str], timeout_s: float) -> bool:
        """wait, with False also where the channel is gone: for a reader that then judges what arrived."""
        try:
            return self.wait(keys, timeout_s)
        except ChannelError:
            return False


def _receive(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("the other side closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def connect(addr: str, ports: Sequence[int], run_id: str, within_s: float, timeout_s: float) -> ChannelClient:
    """A client of the launch's channel at addr, on the first of ports that answers as this launch's, tried again until
    within_s has passed (rank 0 starts serving once its own config is composed, maybe after the others); every call of
    the client is bounded by timeout_s."""
    deadline = time.monotonic() + within_s
    why = "nothing answered"
    while True:
        for port in ports:
            left = deadline - time.monotonic()
            if left <= 0:
                shown = "port " + ", ".join(map(str, ports))
                raise ChannelError(f"no agents' channel at {addr} {shown} within {within_s:g} s ({why})")
            try:
                sock = socket.create_connection((addr, port), timeout=min(left, HELLO_S))
            except OSError as e:
                why = f"port {port}: {e.strerror or e}"
                continue
            try:
                sock.sendall(_frame({"hello": PROTOCOL, "run": run_id}))
                answer = _parsed(_receive(sock, _length(_receive(sock, _LENGTH.size))))
                if answer.get("hello") == PROTOCOL:
                    return ChannelClient(sock, timeout_s)
                why = f"port {port}: {answer.get('error') or 'not an agents channel'}"
            except (OSError, ValueError) as e:
                why = f"port {port} answers, but not as an agents' channel ({e})"
            sock.close()
        time.sleep(max(0.0, min(RETRY_S, deadline - time.monotonic())))


class ChannelServer:
    """The channel, served on a listening socket from a thread of its own until close()."""

    def __init__(self, listener: socket.socket, run_id: str) -> None:
        self.port: int = listener.getsockname()[1]
        self._run_id = run_id
        self._values: dict[str, str] = {}
        self._arrived: dict[str, asyncio.Event] = {}  # a key some wait is waiting for, until it is set
        self._serving: dict[asyncio.Task[None], asyncio.StreamWriter] = {}  # each connection's
        self._closing = False
        self._loop = asyncio.new_event_loop()
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, sock=listener, limit=1 << 20))
        self._thread = threading.Thread(target=self._loop.run_forever, name="preflight-agent-channel", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and close every connection: a client's call fails at once, as when the agent's process ends."""
        if self._loop.is_closed():
            return
        with contextlib.suppress(Exception):  # a loop that cannot end its tasks in time ends with the process
            asyncio.run_coroutine_threadsafe(self._shut(), self._loop).result(timeout=CLOSE_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=CLOSE_S)
        if not self._thread.is_alive():
            self._loop.close()

    async def _shut(self) -> None:
        # Each connection's reads fail and its waits end, so that every task ends of itself.
        self._server.close()
        self._closing = True
        for writer in self._serving.values():
            writer.transport.abort()
        for event in self._arrived.values():
            event.set()
        if self._serving:
            await asyncio.wait(list(self._serving), timeout=CLOSE_S)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._serving[task] = writer
        try:
            hello = await asyncio.wait_for(_read(reader), HELLO_S)
            if hello.get("hello") != PROTOCOL or hello.get("run") != self._run_id:
                await _write(writer, {"error": f"this is run {self._run_id}'s {PROTOCOL}"})
                return
            await _write(writer, {"hello": PROTOCOL})
            while True:
                await _write(writer, await self._answer(await _read(reader)))
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, OSError, ValueError, KeyError, TypeError):
            return  # a client that left, or one that is not an agent: only its own connection ends
        finally:
            writer.close()
            if task is not None:
                self._serving.pop(task, None)

    async def _answer(self, request: Frame) -> Frame:
        op = request["op"]
        if op == "set":
            key, value = request["key"], request["value"]
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError("set takes a key and a value, both text")
            self._values[key] = value
            if (event := self._arrived.pop(key, None)) is not None:
                event.set()
            return {"ok": True}
        if op == "get":
            return {"value": self._values.get(request["key"])}
        if op not in ("check", "wait"):
            raise ValueError(f"no such request: {op!r}")
        keys = [str(k) for k in request["keys"]]
        if op == "wait":
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._all_of(keys), max(0.0, float(request["timeout_s"])))
        return {"present": all(k in self._values for k in keys)}

    async def _all_of(self, keys: list[str]) -> None:
        for key in keys:
            if key not in self._values and not self._closing:
                await self._arrived.setdefault(key, asyncio.Event()).wait()


async def _read(reader: asyncio.StreamReader) -> Frame:
    return _parsed(await reader.readexactly(_length(await reader.readexactly(_LENGTH.size))))


async def _write(writer: asyncio.StreamWriter, answer: Frame) -> None:
    writer.write(_frame(answer))
    await writer.drain()


def serve_channel(ports: Sequence[int], run_id: str) -> ChannelServer:
    """Serve the channel on every interface of this host (IPv6 too where it has both) at the first of ports that no one
    listens on here; OSError when every one is taken, or when listening fails otherwise."""
    dual = socket.has_dualstack_ipv6()
    taken = []
    for port in ports:
        try:
            listener = socket.create_server(("", port), family=socket.AF_INET6 if dual else socket.AF_INET, backlog=socket.SOMAXCONN,
                                            dualstack_ipv6=dual)
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
            taken.append(str(port))
            continue
        return ChannelServer(listener, run_id)
    raise OSError(errno.EADDRINUSE, f"port {', '.join(taken)} taken on this host")
