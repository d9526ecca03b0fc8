"""Host keys for the SSH transport: every known_hosts file read once and shared, and the policies for a key no file
knows (strict refuses it, accept-new records it as OpenSSH's accept-new does). A changed key is always refused:
paramiko compares a known key itself before it asks a policy."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import paramiko
from paramiko.hostkeys import InvalidHostKey
from paramiko.ssh_exception import SSHException

from preflight.errors import InputError, one_line

SYSTEM_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")
USER_KNOWN_HOSTS = Path("~/.ssh/known_hosts")
REASON_LIMIT = 300  # characters of a library's error kept in a host's one-line reason


def known_hosts_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


class HostKeyRefused(SSHException):
    """A host key the policy does not accept; the message is the result's reason."""


class KnownHosts:
    """Keys from every known_hosts file, read once and shared by every connection of a transport."""

    def __init__(self, files: Sequence[Path], record_to: Path) -> None:
        self._keys = paramiko.HostKeys()
        for path in files:
            if not path.is_file():
                continue
            try:
                self._keys.load(str(path))
            except (OSError, ValueError, InvalidHostKey) as e:
                raise InputError(f"cannot read known_hosts file {path}: {one_line(e, REASON_LIMIT)}") from e
        self._record_to = record_to
        self._lock = threading.Lock()

    def prime(self, client: paramiko.SSHClient, host: str, port: int) -> None:
        """Give a client the keys known for its host, so paramiko itself compares them."""
        name = known_hosts_name(host, port)
        with self._lock:
            known = self._keys.lookup(name)
            entries = list(known.items()) if known is not None else []
        for keytype, key in entries:
            client.get_host_keys().add(name, keytype, key)

    def record(self, name: str, key: paramiko.PKey) -> None:
        """Append an unknown host's key to the known_hosts file that accept-new writes."""
        path = self._record_to
        line = f"{name} {key.get_name()} {key.get_base64()}\n".encode()
        with self._lock:
            try:
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                with path.open("ab+") as f:
                    if f.tell() > 0:
                        f.seek(-1, os.SEEK_END)
                        if f.read(1) != b"\n":
                            line = b"\n" + line  # a last line without its newline would swallow ours
                    f.write(line)
            except OSError as e:
                raise HostKeyRefused(f"host key for {name} is not known and cannot be recorded in {path}: {e.strerror}") from e
            self._keys.add(name, key.get_name(), key)


class StrictPolicy(paramiko.RejectPolicy):
    """Refuse every host whose key no known_hosts file holds."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> NoReturn:
        """Refuse, with the reason a result reports."""
        raise HostKeyRefused(f"host key for {hostname} is not known (strict host key checking)")


class AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """Record an unknown host's key; paramiko refuses a changed one before asking a policy."""

    def __init__(self, known: KnownHosts) -> None:
        self._known = known

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        """Record the key, or refuse when it cannot be recorded."""
        self._known.record(hostname, key)
