"""Transports: how commands reach hosts. ``HostRouter`` picks one per host."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from preflight.spec import SshConfig, TransportKind
from preflight.transport.base import CommandResult, RemoteCommand, Transport
from preflight.transport.local import LocalTransport

__all__ = ["CommandResult", "HostRouter", "RemoteCommand", "Transport"]


class HostRouter:
    """Sends each command through its host's transport; SSH is set up only when a host needs it."""

    def __init__(self, ssh: SshConfig, on_result: Callable[[CommandResult], None] | None = None) -> None:
        self._ssh_config = ssh
        self._on_result = on_result
        self._local = LocalTransport()
        self._ssh: Transport | None = None

    def _ssh_transport(self) -> Transport:
        if self._ssh is None:
            # Imported here: Fabric costs 0.3 s, which a local-only run should not pay.
            from preflight.transport.ssh import SshTransport

            self._ssh = SshTransport(self._ssh_config, on_result=self._on_result)
        return self._ssh

    def run(self, commands: Sequence[RemoteCommand], *, all_at_once: bool = False) -> list[CommandResult]:
        """Run every command on its own host's transport; results in the order given."""
        local = [c for c in commands if c.host.transport == TransportKind.local]
        remote = [c for c in commands if c.host.transport == TransportKind.ssh]
        results: dict[int, CommandResult] = {}
        with ThreadPoolExecutor(max_workers=1) as pool:
            remote_results = pool.submit(self._ssh_transport().run, remote, all_at_once=all_at_once) if remote else None
            for command, result in zip(local, self._local.run(local, all_at_once=all_at_once), strict=True):
                results[id(command)] = result
                if self._on_result is not None:
                    self._on_result(result)
            if remote_results is not None:
                results.update((id(c), r) for c, r in zip(remote, remote_results.result(), strict=True))
        return [results[id(c)] for c in commands]

    def close(self) -> None:
        """Close every SSH connection."""
        if self._ssh is not None:
            self._ssh.close()
