"""The mesh test's sockets: its constants, the parallel TCP connects to every target, and a line read by a deadline."""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import time

# typing costs milliseconds to import on a plain python, and annotations here are never evaluated: the types of this
# script's config and output live in preflight/connectivity/wire.py, for the type checker and for the connectivity
# stage.
TYPE_CHECKING = False
if TYPE_CHECKING:
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
