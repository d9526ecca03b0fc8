"""What became of an SSH connection attempt, in the one line a host's result gives as its reason."""

from __future__ import annotations

import errno
import socket
from typing import Any

from paramiko.ssh_exception import AuthenticationException, BadHostKeyException, NoValidConnectionsError, SSHException

from preflight.errors import one_line
from preflight.transport.ssh_keys import REASON_LIMIT, HostKeyRefused


def where(conn: Any) -> str:  # a Fabric Connection: Fabric is untyped
    """The host and port of a connection as OpenSSH writes them, the port left out when it is 22."""
    if conn.port == 22:
        return str(conn.host)
    return f"[{conn.host}]:{conn.port}" if ":" in conn.host else f"{conn.host}:{conn.port}"


def connect_reason(e: BaseException, conn: Any, timeout_s: float, elapsed_s: float) -> str:
    """Why opening a (Fabric) connection failed, in one line: e is what open() raised, after elapsed_s of timeout_s."""
    at = where(conn)
    if isinstance(e, HostKeyRefused):
        return str(e)
    if isinstance(e, BadHostKeyException):
        return (f"host key CHANGED for {at}: it offers {e.key.get_name()} {e.key.fingerprint}, "
                f"known_hosts has {e.expected_key.get_name()} {e.expected_key.fingerprint}; refusing")
    if isinstance(e, AuthenticationException):
        return f"authentication failed for {conn.user}@{at}: {one_line(e, REASON_LIMIT)}"
    if isinstance(e, NoValidConnectionsError):
        causes = {getattr(err, "errno", None) for err in e.errors.values()}
        if causes == {errno.ECONNREFUSED}:
            return f"connection refused by {at}"
        if causes == {errno.EHOSTUNREACH}:
            return f"no route to {at}"
        return f"cannot connect to {at}: {one_line(e, REASON_LIMIT)}"
    if isinstance(e, socket.gaierror):
        return f"cannot resolve {conn.host}: {e.strerror}"
    if isinstance(e, TimeoutError):
        return f"connect to {at} timed out after {timeout_s:g} s"
    if isinstance(e, OSError):
        if e.filename:
            return f"cannot read {e.filename}: {e.strerror}"
        return f"cannot connect to {at}: {e.strerror or one_line(e, REASON_LIMIT)}"
    if isinstance(e, SSHException) and ("protocol banner" in str(e) or "No existing session" in str(e)):
        # paramiko stops waiting for the handshake at the timeout without saying so, and words a
        # silent server and one that hung up alike: the banner received and the clock tell them apart.
        transport = conn.client.get_transport()
        if transport is not None and transport.remote_version:
            return f"SSH handshake with {at} did not finish within {timeout_s:g} s"
        if elapsed_s >= timeout_s:
            return f"no SSH banner from {at} within {timeout_s:g} s"
        return f"{at} closed the connection before sending an SSH banner"
    if isinstance(e, EOFError):
        return f"{at} closed the connection during the SSH handshake"
    return f"ssh to {at} failed: {type(e).__name__}: {one_line(e, REASON_LIMIT)}"
