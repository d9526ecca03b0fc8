"""Dead-peer detection for SSH connections, as OpenSSH's ServerAliveInterval and ServerAliveCountMax.

A host that is powered off or whose cable is pulled sends no RST: TCP only gives up after its retransmissions (about
15 minutes), and a command waits on the connection all that while. paramiko's own keepalive only sends (a global
request that asks for no reply), so it can keep a NAT open but cannot tell a dead host from a quiet one.

Here, each connection's transport notes when it last received a packet (StampedPacketizer). When nothing was sent for
an interval, its transport thread asks the host for a reply (a ``keepalive@openssh.com`` global request with
want-reply, which OpenSSH's sshd answers with a request-failure, as OpenSSH's client does). A watcher thread closes
every connection that received nothing for interval x count and says why (WatchedTransport.lost): closing it ends the
command waiting on it at once.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any, cast

import paramiko
from paramiko.common import cMSG_GLOBAL_REQUEST
from paramiko.packet import Packetizer

PROBE_REQUEST = "keepalive@openssh.com"
# How often the watcher looks at every connection: the loss is seen at most this long after interval x count.
WATCH_TICK_S = 0.25


class StampedPacketizer(Packetizer):
    """paramiko's packetizer, noting when it last read a whole packet (every reply, channel data and window change)."""

    def __init__(self, socket: Any) -> None:  # a socket, or a channel of a jump host's connection
        super().__init__(socket)
        self.received_at = time.monotonic()

    def read_message(self) -> tuple[int, paramiko.Message]:
        message: tuple[int, paramiko.Message] = super().read_message()
        self.received_at = time.monotonic()
        return message


class WatchedTransport(paramiko.Transport):
    """A paramiko transport whose packets are stamped as they arrive; ``lost`` says why the watcher closed it."""

    lost: str | None = None

    def __init__(self, sock: Any, **kwargs: Any) -> None:  # what SSHClient.connect gives a transport_factory
        super().__init__(sock, packetizer_class=StampedPacketizer, **kwargs)

    @property
    def received_at(self) -> float:
        """When the last packet from the host arrived (time.monotonic())."""
        return cast(StampedPacketizer, self.packetizer).received_at

    @property
    def silent_s(self) -> float:
        """Seconds since the last packet from the host."""
        return time.monotonic() - self.received_at


def _probe(ref: weakref.ReferenceType[WatchedTransport]) -> None:
    """Ask the host for a reply, never inside a key exchange, and never blocking: paramiko's keepalive hook calls it in
    the transport's own thread, and a user thread that holds the send lock is itself sending (the probe then waits for
    the next interval)."""
    transport = ref()
    if transport is None or not transport.clear_to_send.is_set():
        return
    message = paramiko.Message()
    message.add_byte(cMSG_GLOBAL_REQUEST)
    message.add_string(PROBE_REQUEST)
    message.add_boolean(True)  # want-reply: the answer, not the asking, is what proves the host is there
    if transport.clear_to_send_lock.acquire(blocking=False):
        try:
            transport.packetizer.send_message(message)
        finally:
            transport.clear_to_send_lock.release()


class AliveWatch:
    """Watches a transport's open connections; one daemon thread, started with the first and stopped by stop()."""

    def __init__(self, interval_s: float, count_max: int) -> None:
        self.interval_s = interval_s
        self.count_max = count_max
        self._lock = threading.Lock()
        self._watched: dict[WatchedTransport, str] = {}  # transport -> the host, as the reason names it
        self._waiting: list[tuple[WatchedTransport, float, Callable[[], None]]] = []  # when_heard's: (transport, asked at, then)
        self._running: threading.Event | None = None  # the watcher thread's stop signal, while one runs

    @property
    def deadline_s(self) -> float:
        """Silence after which a host is lost."""
        return self.interval_s * self.count_max

    def watch(self, transport: object, where: str) -> None:
        """Probe and watch an open connection's transport (a WatchedTransport: SshTransport connects with one)."""
        if not isinstance(transport, WatchedTransport) or not transport.is_active():
            return
        # A weak reference: the packetizer keeps the callback, and the transport keeps the packetizer.
        transport.packetizer.set_keepalive(self.interval_s, partial(_probe, weakref.ref(transport)))
        with self._lock:
            self._watched[transport] = where
            if self._running is None:
                self._running = threading.Event()
                threading.Thread(target=self._run, args=(self._running,), name="preflight-ssh-alive", daemon=True).start()

    def when_heard(self, transport: object, then: Callable[[], None]) -> None:
        """Call then() once the host answers anything sent after now (a probe sent now asks it to), in the watcher's
        thread; at once when the transport is not a watched one. A host that does not answer is lost at its own deadline
        instead, and then() is never called: of hosts that went silent together, each is found lost, not ended early."""
        if isinstance(transport, WatchedTransport) and transport.lost:
            return
        if isinstance(transport, WatchedTransport) and transport.is_active():
            asked = time.monotonic()
            with self._lock:
                watched = transport in self._watched
                if watched:
                    self._waiting.append((transport, asked, then))
            if watched:
                _probe(weakref.ref(transport))
                return
        then()

    def stop(self) -> None:
        """Stop watching every connection (the thread ends within a tick); a later watch() starts again."""
        with self._lock:
            if self._running is not None:
                self._running.set()
            self._running = None
            self._watched.clear()
            self._waiting.clear()

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(min(WATCH_TICK_S, self.interval_s / 4)):
            with self._lock:
                watched = list(self._watched.items())
            for transport, where in watched:
                silent = transport.silent_s
                if transport.is_active() and silent < self.deadline_s:
                    continue
                with self._lock:
                    self._watched.pop(transport, None)
                if transport.is_active():
                    transport.lost = (f"{where} stopped answering: nothing received for {silent:.1f} s "
                                      f"(a reply asked every {self.interval_s:g} s, {self.count_max} intervals allowed)")
                    # Closing the transport closes its channels, which wakes the command's thread in poll(). In a thread
                    # of its own: a jump host's channel closes through that host's connection, which may block.
                    threading.Thread(target=transport.close, name="preflight-ssh-lost", daemon=True).start()
            with self._lock:
                waiting, self._waiting = self._waiting, []
                # Answered since asked: then(); still silent: wait on (a lost one is dropped with its connection).
                heard = [then for transport, asked, then in waiting if transport.is_active() and transport.received_at > asked]
                self._waiting = [(t, asked, then) for t, asked, then in waiting if t.is_active() and t.received_at <= asked]
            for then in heard:
                then()
