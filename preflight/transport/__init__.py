"""Transports: how commands reach hosts. ``HostRouter`` picks one per host."""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace

from preflight.spec import HostSpec, SshConfig, TransportKind
from preflight.transport.base import CommandResult, RemoteCommand, Transport
from preflight.transport.local import LocalTransport
from preflight.transport.reap import TAG_VARIABLE, Cleanup, read_cleanup, reap_command

__all__ = ["Cleanup", "CommandResult", "HostRouter", "RemoteCommand", "Transport"]


class HostRouter:
    """Sends each command through its host's transport; SSH is set up only when a host needs it.

    Every command runs with ``PREFLIGHT_TAG=<tag>`` in its environment (see preflight.transport.reap), so that stop()
    can end whatever the router's commands started on any host."""

    # Whether its hosts are already ranks of one launch (preflight agent's AgentRouter): a collective then starts its
    # ranks on them directly, with no launcher of its own.
    in_launch = False

    def __init__(self, ssh: SshConfig, on_result: Callable[[CommandResult], None] | None = None, *,
                 keep_connections: bool = True) -> None:
        self._ssh_config = ssh
        self._keep_connections = keep_connections  # false: a host's SSH connection closes when its command ends
        self._on_result = on_result
        self._local = LocalTransport()
        self._ssh: Transport | None = None
        self.tag = uuid.uuid4().hex[:12]
        self._lock = threading.Lock()
        self._hosts: dict[str, HostSpec] = {}
        self._pending: Counter[str] = Counter()  # commands sent to a host whose result has not come back
        self._reached: set[str] = set()  # hosts where a command ran
        self._stopping = False
        self._file_folders: tuple[str, ...] = ()  # where the run leaves files named for its tag (the storage stage's)

    def _ssh_transport(self) -> Transport:
        if self._ssh is None:
            # Imported here: Fabric costs 0.3 s, which a local-only run should not pay.
            from preflight.transport.ssh import SshTransport

            self._ssh = SshTransport(self._ssh_config, on_result=self._report, keep_connections=self._keep_connections)
        return self._ssh

    def _report(self, result: CommandResult) -> None:
        if self._on_result is not None and not self._stopping:
            self._on_result(result)

    def run(self, commands: Sequence[RemoteCommand], *, all_at_once: bool = False) -> list[CommandResult]:
        """Run every command on its own host's transport, tagged; results in the order given."""
        with self._lock:
            for command in commands:
                self._hosts.setdefault(command.host.name, command.host)
                self._pending[command.host.name] += 1
        results = self._dispatch([replace(c, argv=["env", f"{TAG_VARIABLE}={self.tag}", *c.argv]) for c in commands], all_at_once)
        with self._lock:
            for result in results:
                self._pending[result.host] -= 1
                if result.reached:
                    self._reached.add(result.host)
        return results

    def _dispatch(self, commands: Sequence[RemoteCommand], all_at_once: bool) -> list[CommandResult]:
        local = [c for c in commands if c.host.transport == TransportKind.local]
        remote = [c for c in commands if c.host.transport == TransportKind.ssh]
        # The local commands run beside the SSH ones, which run in this thread: an interrupt lands in the SSH transport's
        # wait, which then starts no more of them, and the local ones are stopped here.
        beside = self._local.begin(local, all_at_once=all_at_once)
        try:
            remote_results = self._ssh_transport().run(remote, all_at_once=all_at_once) if remote else []
        except BaseException:
            beside.stop()
            raise
        # A group's commands stand or fall together: a lost SSH host ends the local commands of its group too.
        lost = {c.group for c, r in zip(remote, remote_results, strict=True) if r.lost and c.group is not None}
        if lost:
            beside.stop(lost)
        local_results = beside.results()
        for result in local_results:
            self._report(result)
        results = {id(c): r for c, r in zip(local, local_results, strict=True)}
        results.update((id(c), r) for c, r in zip(remote, remote_results, strict=True))
        return [results[id(c)] for c in commands]

    def remove_on_stop(self, folders: Sequence[str]) -> None:
        """Have stop() also remove the run's files (``.preflight-<tag>-*``) in these folders, on every host."""
        self._file_folders = tuple(folders)

    def stop(self, within_s: float) -> list[Cleanup]:
        """End everything the router's commands started, on every host where one ran or may still run (children in
        sessions of their own included), and remove their temporary folders; one Cleanup per such host, within within_s
        whatever the hosts do."""
        self._stopping = True  # the cleanup is no progress of the run
        with self._lock:
            hosts = [h for name, h in self._hosts.items() if self._pending[name] > 0 or name in self._reached]
        done: queue.SimpleQueue[tuple[int, CommandResult]] = queue.SimpleQueue()

        def reap(index: int, host: HostSpec) -> None:
            (result,) = self._dispatch([reap_command(host, self.tag, within_s, self._file_folders)], all_at_once=True)
            done.put((index, result))

        # A daemon thread per host: a host that no longer answers (a connect or a session that hangs) must not hold
        # the others' answers, nor the exit.
        for index, host in enumerate(hosts):
            threading.Thread(target=reap, args=(index, host), name="preflight-reap", daemon=True).start()
        deadline = time.monotonic() + within_s
        answers: dict[int, Cleanup] = {}
        while len(answers) < len(hosts):
            try:
                index, result = done.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            answers[index] = read_cleanup(result)
        return [answers.get(index) or Cleanup(host.name, reached=False, reason=f"no answer within {within_s:g} s")
                for index, host in enumerate(hosts)]

    def close(self) -> None:
        """Close every SSH connection."""
        if self._ssh is not None:
            self._ssh.close()
