"""Dead-peer detection for SSH connections, as OpenSSH's ServerAliveInterval and ServerAliveCountMax.

A host that is powered off or whose cable is pulled sends no RST: TCP only gives up after its retransmissions (about
15 minutes), and a command waits on the connection all that while. paramiko's own keepalive only sends (a global
request that asks for no reply), so it can keep a NAT open but cannot tell a dead host from a quiet one.

Here, each connection's transport notes when it last received a packet (StampedPacketizer). When nothing was sent for
an interval, its transport thread asks the host for a reply (a ``keepalive@openssh.com`` global request with
want-reply, which OpenSSH's sshd answers with a request-failure, as OpenSSH's client does). A watcher thread closes
every connection that received nothing for interval x count and says why (WatchedTransport.lost): closing it ends the
command waiting on it at once. The packetizer also counts the probes sent and the replies read: a host answers global
requests in the order asked, so only a reply past the probes already sent proves it there now (when_heard).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any, cast

import paramiko
from paramiko.common import MSG_REQUEST_FAILURE, MSG_REQUEST_SUCCESS, cMSG_GLOBAL_REQUEST
from paramiko.packet import Packetizer

PROBE_REQUEST = "keepalive@openssh.com"
# How often the watcher looks at every connection: the loss is seen at most this long after interval x count.
WATCH_TICK_S = 0.25


class StampedPacketizer(Packetizer):
    """paramiko's packetizer, noting when it last read a whole packet (every reply, channel data and window change), and
    counting the probes it sent and the global requests' replies it read."""

    def __init__(self, socket: Any) -> None:  # a socket, or a channel of a jump host's connection
        super().__init__(socket)
        self.received_at = time.monotonic()
        self.probes_sent = 0  # written by _probe, under the transport's send lock
        self.replies = 0  # request-success or -failure read; the probes are this connection's only global requests

    def read_message(self) -> tuple[int, paramiko.Message]:
        message: tuple[int, paramiko.Message] = super().read_message()
        self.received_at = time.monotonic()
        if message[0] in (MSG_REQUEST_SUCCESS, MSG_REQUEST_FAILURE):
            self.replies += 1
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

    @property
    def probes_sent(self) -> int:
        """How many probes were sent to the host."""
        return cast(StampedPacketizer, self.packetizer).probes_sent

    def answered_after(self, probes_sent: int) -> bool:
        """Whether the host answered a probe sent after the first probes_sent: a reply past those is to a later one."""
        return cast(StampedPacketizer, self.packetizer).replies > probes_sent


def _probe(ref: weakref.ReferenceType[WatchedTransport]) -> None:
    """Ask the host for a reply, never inside a key exchange, and never blocking: paramiko's keepalive hook calls it in
    the transport's own thread, and a user thread that holds the send lock is itself sending (the probe then waits for
    the next interval, or the watcher's next tick for when_heard)."""
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
            cast(StampedPacketizer, transport.packetizer).probes_sent += 1
        except (EOFError, OSError):
            # The connection closed under the probe: the watcher found it lost and closes it in a thread of its own, or
            # the run abandoned it, while a probe for it was on its way (paramiko's packetizer raises EOFError for a
            # closed socket). Its loss is said where it is found; nothing waits on this probe, which was never sent.
            pass
        finally:
            transport.clear_to_send_lock.release()


class AliveWatch:
    """Watches a transport's open connections; one daemon thread, started with the first and stopped by stop()."""

    def __init__(self, interval_s: float, count_max: int) -> None:
        self.interval_s = interval_s
        self.count_max = count_max
        self._lock = threading.Lock()
        self._watched: dict[WatchedTransport, str] = {}  # transport -> the host, as the reason names it
        # when_heard's: (transport, its probes sent before the asking, then)
        self._waiting: list[tuple[WatchedTransport, int, Callable[[], None]]] = []
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
        """Call then() once the host answers a probe sent after now (one is sent now), in the watcher's thread; at once
        when the transport is not a watched one. A host that does not answer is lost at its own deadline instead, and
        then() is never called: of hosts that went silent together, each is found lost, not ended early.

        Not any packet read after now: one the host sent before it went silent may still be on its way, or unread by a
        transport thread that a loaded machine has not run yet."""
        if isinstance(transport, WatchedTransport) and transport.lost:
            return
        if isinstance(transport, WatchedTransport) and transport.is_active():
            with self._lock:
                watched = transport in self._watched
                if watched:
                    self._waiting.append((transport, transport.probes_sent, then))
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
                heard: list[Callable[[], None]] = []
                unasked: list[WatchedTransport] = []
                for t, sent, then in waiting:  # a lost one is dropped with its connection
                    if not t.is_active():
                        continue
                    if t.answered_after(sent):  # asked once per entry: a reply between two reads would drop it
                        heard.append(then)
                        continue
                    self._waiting.append((t, sent, then))
                    if t.probes_sent <= sent:  # its probe could not be sent then (another sender, a key exchange): again
                        unasked.append(t)
            for transport in unasked:
                _probe(weakref.ref(transport))
            for then in heard:
                then()
