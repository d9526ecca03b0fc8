"""Run commands on hosts over SSH with Fabric: verified host keys, bounded fan-out, hard deadlines.

One Fabric ``Connection`` per host, opened on its first command and kept for every later run of
the same transport. Host keys come from the system and user known_hosts files plus
``ssh.known_hosts``; an unknown key is refused (strict) or recorded (accept-new), a changed key
is always refused. Every wait is bounded: paramiko's connect, banner, auth and channel timeouts,
a ``timeout`` wrapper on the host, a local deadline per command, and one for the whole run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import paramiko
from fabric import Config, Connection
from paramiko.ssh_exception import ChannelException

from preflight.errors import InputError, one_line
from preflight.spec import HostKeyPolicy, HostSpec, SshConfig
from preflight.transport.base import CommandResult, RemoteCommand
from preflight.transport.ssh_alive import AliveWatch, WatchedTransport
from preflight.transport.ssh_channel import collect, command_output, remote_command_line, send_stdin
from preflight.transport.ssh_keys import (
    REASON_LIMIT,
    SYSTEM_KNOWN_HOSTS,
    USER_KNOWN_HOSTS,
    AcceptNewPolicy,
    KnownHosts,
    StrictPolicy,
)
from preflight.transport.ssh_reasons import connect_reason, where

# The local deadline trails the host's own, so a command the host ended reports its exit 124
# rather than racing it; the local one only matters when the host or the network hangs.
LOCAL_GRACE_S = 1.0
# The watchdog trails the local deadline, so it fires only when a blocking paramiko call
# (exec_command waits for the server's reply without a timeout) is stuck, never mid-read.
WATCHDOG_MARGIN_S = 0.5
TIMED_OUT_EXIT = 124  # GNU timeout's status when the deadline ended the command

# paramiko logs every failed handshake at ERROR from its own threads; with no handler configured,
# Python would print those to stderr over the CLI's output, although each is already a result's
# reason. A NullHandler stops only that fallback: an application's own logging still gets them.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


class _HostFailure(Exception):
    """A host could not run the command; the message is the result's reason, in one line."""


class _StaleConnection(_HostFailure):
    """A kept connection no longer opens sessions (the host's sshd restarted, say): reconnect."""


class _SharedConfig(Config):  # type: ignore[misc]  # Fabric is untyped
    """The one Fabric/invoke configuration every connection of a transport reads, and none may write.

    invoke's Config rebuilds itself on every write (``merge()`` empties its data, then refills it), so a
    connection being built in another thread meanwhile finds no ``gateway`` or ``authentication`` at all.
    A write here is a bug to see at once, never a race to meet one run in three."""

    def _modify(self, keypath: tuple[str, ...], key: str, value: object) -> None:
        raise TypeError(f"the SSH transport's shared config is read-only (a write to {'.'.join((*keypath, key))})")

    def _remove(self, keypath: tuple[str, ...], key: str) -> None:
        raise TypeError(f"the SSH transport's shared config is read-only (a removal of {'.'.join((*keypath, key))})")

    def clone(self, into: type[Config] | None = None) -> Config:
        """A private, writable copy: Fabric clones the config for each ProxyJump hop it builds."""
        return super().clone(into=into or Config)


class _Connection(Connection):  # type: ignore[misc]  # Fabric is untyped
    """A Fabric Connection that keeps its settings to itself.

    Fabric declares every attribute its ``__init__`` sets at class level, so that setting one stays on the
    connection, except ``inline_ssh_env``: that one goes into the Config given, which all connections share."""

    inline_ssh_env: bool | None = None


def _run_deadline_reason(run_timeout_s: float) -> str:
    return f"run deadline of {run_timeout_s:g} s passed"


def _chain(conn: Any) -> list[Any]:
    """A connection followed by its gateway connections, nearest first."""
    chain = [conn]
    while isinstance(chain[-1].gateway, Connection):
        chain.append(chain[-1].gateway)
    return chain


@dataclass
class _Job:
    """One command of a run, with the connection to close if the run gives up on it (its deadline, a lost peer)."""

    command: RemoteCommand
    abandoned: threading.Event = field(default_factory=threading.Event)
    conn: Any = None
    why: str = ""  # why it was abandoned: its result's reason

    def transport(self) -> paramiko.Transport | None:
        """The job's connection's paramiko transport, once it has one."""
        return self.conn.client.get_transport() if self.conn is not None else None

    def abandon(self, why: str) -> None:
        """Give up on the job: close its connection, which ends whatever its thread waits on (and, when its channel
        closes, a command that watches its output's reader, as the collective's supervisor does)."""
        self.why = why
        self.abandoned.set()
        if self.conn is not None:
            # The client, not Connection.close(): Fabric only closes what has finished opening.
            # Closing the transport also closes its channels, which wakes a thread in poll().
            self.conn.client.close()


class SshTransport:
    """Commands over SSH with Fabric; every host gets a result, none waits past its deadline."""

    def __init__(self, ssh: SshConfig, *, on_result: Callable[[CommandResult], None] | None = None,
                 keep_connections: bool = True) -> None:
        self._ssh = ssh
        self._on_result = on_result
        # A run that will not come back to a host closes its connection when its command ends: an idle paramiko
        # transport's thread still wakes ten times a second, and the host's sshd session lingers.
        self._keep_connections = keep_connections
        if ssh.ssh_config is not None:
            path = Path(ssh.ssh_config).expanduser()
            if not path.is_file():
                raise InputError(f"ssh.ssh_config: no such file {path}")
            self._config = _SharedConfig(runtime_ssh_path=str(path))
        else:
            self._config = _SharedConfig()
        extra = [Path(ssh.known_hosts).expanduser()] if ssh.known_hosts else []
        record_to = extra[0] if extra else USER_KNOWN_HOSTS.expanduser()
        self._known = KnownHosts([SYSTEM_KNOWN_HOSTS, USER_KNOWN_HOSTS.expanduser(), *extra], record_to)
        self._policy: paramiko.MissingHostKeyPolicy = (
            AcceptNewPolicy(self._known) if HostKeyPolicy(ssh.host_key_policy) == HostKeyPolicy.accept_new else StrictPolicy()
        )
        timeout = float(ssh.connect_timeout_s)
        self._connect_kwargs: dict[str, object] = {
            "timeout": timeout, "banner_timeout": timeout, "auth_timeout": timeout, "channel_timeout": timeout,
            "compress": False,  # paramiko 5 has no GSSAPI left to turn off
            "transport_factory": WatchedTransport,  # stamps what arrives, for the dead-peer deadline
        }
        self._alive = AliveWatch(float(ssh.keepalive_interval_s), int(ssh.keepalive_count_max))
        self._lock = threading.Lock()
        self._host_locks: dict[tuple[Any, ...], threading.Lock] = {}
        self._connections: dict[tuple[Any, ...], Any] = {}
        self._gateways: dict[tuple[str, str | None], tuple[Any, threading.Lock]] = {}

    def run(self, commands: Sequence[RemoteCommand], *, all_at_once: bool = False) -> list[CommandResult]:
        """Run every command, at most ``ssh.parallelism`` hosts at once unless all_at_once; one result each, in order."""
        for command in commands:
            if not command.argv or command.timeout_s <= 0:
                raise ValueError(f"command for {command.host.name} needs an argv and a positive timeout")
        if not commands:
            return []
        run_timeout = float(self._ssh.run_timeout_s)
        deadline = time.monotonic() + run_timeout
        jobs = [_Job(command) for command in commands]
        todo: queue.SimpleQueue[int] = queue.SimpleQueue()
        for index in range(len(jobs)):
            todo.put(index)
        done: queue.SimpleQueue[tuple[int, CommandResult]] = queue.SimpleQueue()
        stop = threading.Event()

        def work() -> None:
            while not stop.is_set():
                try:
                    index = todo.get_nowait()
                except queue.Empty:
                    return
                done.put((index, self._run_job(jobs[index], deadline)))

        # Daemon threads, not an executor's: the interpreter joins those at exit, and a thread
        # still in a TCP connect to a silent host would hold the CLI there after the deadline.
        workers = len(jobs) if all_at_once else max(1, min(int(self._ssh.parallelism), len(jobs)))
        for _ in range(workers):
            threading.Thread(target=work, name="preflight-ssh", daemon=True).start()
        results: list[CommandResult | None] = [None] * len(jobs)
        try:
            for _ in jobs:
                try:
                    index, result = done.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                results[index] = result
                self._report(result)
                group = jobs[index].command.group
                if result.lost and group is not None:
                    # The others of its group would only wait for it until their own deadlines: each is ended once it
                    # answers, so that one lost with it is found lost too rather than ended early.
                    why = f"ended early: {result.host}, a host of the same group, was lost"
                    for k, other in enumerate(jobs):
                        if results[k] is None and other.command.group == group:
                            self._alive.when_heard(other.transport(), partial(other.abandon, why))
        finally:
            # On an interrupt too: no command may start behind the back of the cleanup that follows it.
            stop.set()
        for index, job in enumerate(jobs):
            if results[index] is None:
                job.abandon(_run_deadline_reason(run_timeout))
                result = CommandResult(host=job.command.host.name, reached=False, reason=_run_deadline_reason(run_timeout))
                results[index] = result
                self._report(result)
        return [r for r in results if r is not None]

    def close(self) -> None:
        """Close every connection; the ``timeout`` wrapper has already bounded what ran on hosts."""
        with self._lock:
            connections = list(self._connections.values())
            gateways = [gateway for gateway, _ in self._gateways.values()]
            self._connections.clear()
            self._gateways.clear()
        self._alive.stop()
        for conn in connections + gateways:
            conn.close()

    def _report(self, result: CommandResult) -> None:
        if self._on_result is not None:
            self._on_result(result)

    def _run_job(self, job: _Job, run_deadline: float) -> CommandResult:
        """One command on one host; never raises, whatever the host does."""
        name = job.command.host.name
        started = time.time()
        began = time.monotonic()
        try:
            conn, connect_s = self._connected(job)
            try:
                return self._execute(conn, job, connect_s, run_deadline)
            except _StaleConnection:
                conn, connect_s = self._connected(job)
                return self._execute(conn, job, connect_s, run_deadline)
            finally:
                if not self._keep_connections:
                    self._forget(job.command.host)
        except _HostFailure as e:
            reason = str(e)
        except Exception as e:  # the contract: a host's failure is a result, never an exception
            reason = f"ssh to {job.command.host.address} failed: {type(e).__name__}: {one_line(e, REASON_LIMIT)}"
        return CommandResult(host=name, reached=False, reason=reason, sent_unix_s=started, received_unix_s=time.time(),
                             timings={"connect_s": time.monotonic() - began})

    @staticmethod
    def _key(host: HostSpec) -> tuple[Any, ...]:
        return host.name, host.address, host.user, host.port, host.identity, host.jump

    def _forget(self, host: HostSpec) -> None:
        """Close the host's kept connection, if it has one."""
        with self._lock:
            conn = self._connections.pop(self._key(host), None)
        if conn is not None:
            conn.close()

    def _connected(self, job: _Job) -> tuple[Any, float]:
        """The host's open connection, opened now if it has none; with the seconds opening took."""
        host = job.command.host
        key = self._key(host)
        with self._lock:
            host_lock = self._host_locks.setdefault(key, threading.Lock())
        with host_lock:
            conn = self._connections.get(key)
            if conn is not None and conn.is_connected:
                job.conn = conn
                return conn, 0.0
            began = time.monotonic()
            conn, jump_lock = self._new_connection(host)
            job.conn = conn
            self._open(conn, jump_lock)
            if job.abandoned.is_set():
                conn.close()
                raise _HostFailure(job.why)
            with self._lock:
                self._connections[key] = conn
            return conn, time.monotonic() - began

    def _kwargs(self, identity: str | None) -> dict[str, object]:
        kwargs = dict(self._connect_kwargs)
        if identity:
            # The agent and ~/.ssh/id_* would only add round trips and key loads before this key.
            kwargs.update(key_filename=[os.path.expanduser(identity)], look_for_keys=False, allow_agent=False)
        return kwargs

    def _guard(self, conn: Any) -> None:
        """Make one Fabric connection verify host keys and honour every timeout."""
        # Fabric truncates connect_timeout to whole seconds (0.5 would mean none at all), and it
        # refuses a timeout given both ways: the float goes in connect_kwargs alone.
        conn.connect_timeout = None
        conn.connect_kwargs = {**conn.connect_kwargs, **self._connect_kwargs}
        # Fabric installs AutoAddPolicy, which would trust any key; this is set on every client.
        conn.client.set_missing_host_key_policy(self._policy)
        self._known.prime(conn.client, conn.host, conn.port)

    def _new_connection(self, host: HostSpec) -> tuple[Any, threading.Lock | None]:
        """A guarded, unopened Connection for the host, and the lock of its shared jump host."""
        gateway, jump_lock = self._jump(host) if host.jump else (None, None)
        conn = _Connection(host.address, user=host.user, port=host.port, config=self._config, gateway=gateway,
                          connect_kwargs=self._kwargs(host.identity))
        # Without HostSpec.jump, gateways come from ssh_config's ProxyJump, one chain per host.
        for hop in [conn] if gateway is not None else _chain(conn):
            self._guard(hop)
        return conn, jump_lock

    def _jump(self, host: HostSpec) -> tuple[Any, threading.Lock]:
        """The jump host's connection, shared by every host behind it so it is opened once."""
        key = (str(host.jump), host.identity)
        with self._lock:
            entry = self._gateways.get(key)
            if entry is None:
                gateway = _Connection(str(host.jump), config=self._config, connect_kwargs=self._kwargs(host.identity))
                for hop in _chain(gateway):
                    self._guard(hop)
                entry = self._gateways[key] = (gateway, threading.Lock())
        return entry

    def _open(self, conn: Any, jump_lock: threading.Lock | None) -> None:
        """Open the gateways, farthest first, then the connection; failures become reasons."""
        timeout = float(self._ssh.connect_timeout_s)
        hops = _chain(conn)[1:]
        with jump_lock or contextlib.nullcontext():
            for hop in reversed(hops):
                if hop.is_connected:
                    continue
                began = time.monotonic()
                try:
                    hop.open()
                except Exception as e:
                    reason = connect_reason(e, hop, timeout, time.monotonic() - began)
                    hop.client.close()  # paramiko leaves a failed handshake's thread and socket running
                    raise _HostFailure(f"jump host {where(hop)}: {reason}") from e
                self._alive.watch(hop.client.get_transport(), f"jump host {where(hop)}")
        began = time.monotonic()
        try:
            conn.open()
        except ChannelException as e:
            conn.client.close()
            raise _HostFailure(f"jump host {where(hops[0])} cannot reach {where(conn)}: {one_line(e.text, REASON_LIMIT)}") from e
        except Exception as e:
            reason = connect_reason(e, conn, timeout, time.monotonic() - began)
            conn.client.close()
            raise _HostFailure(reason) from e
        self._alive.watch(conn.client.get_transport(), where(conn))

    def _execute(self, conn: Any, job: _Job, connect_s: float, run_deadline: float) -> CommandResult:
        """Run the command on an open connection, within its deadline and the run's."""
        command = job.command
        name = command.host.name
        # Cut at the run deadline on the host too, so nothing outlives the run there.
        timeout_s = min(float(command.timeout_s), max(0.001, run_deadline - time.monotonic()))
        local_s = timeout_s + LOCAL_GRACE_S
        try:
            channel = conn.create_session()
        except Exception as e:
            conn.close()
            if job.abandoned.is_set():
                raise _HostFailure(job.why) from e
            failure = _StaleConnection if connect_s == 0.0 else _HostFailure  # 0: a kept connection
            raise failure(f"cannot open a session on {where(conn)}: {one_line(e, REASON_LIMIT)}") from e
        transport = conn.client.get_transport()  # now: abandon() leaves the client without it
        watchdog = threading.Timer(local_s + WATCHDOG_MARGIN_S, channel.close)
        watchdog.daemon = True
        began = time.monotonic()
        sent = time.time()
        try:
            watchdog.start()
            try:
                channel.exec_command(remote_command_line(command.argv, timeout_s))
            except Exception as e:
                if time.monotonic() - began < local_s:
                    conn.close()
                    raise _HostFailure(f"the command could not start on {where(conn)}: {one_line(e, REASON_LIMIT)}") from e
                stdout_b, stderr_b, finished = b"", b"", False  # the watchdog cut a stuck request
            else:
                send_stdin(channel, command.stdin, local_s)
                stdout_b, stderr_b, finished = collect(channel, began + local_s)
        finally:
            watchdog.cancel()
            channel.close()
        received = time.time()
        status = channel.exit_status
        stdout, stderr = command_output(stdout_b).decode(errors="replace"), stderr_b.decode(errors="replace")
        timings = {"connect_s": connect_s, "command_s": time.monotonic() - began}

        def unreached(reason: str, lost: bool = False) -> CommandResult:
            return CommandResult(host=name, reached=False, stdout=stdout, stderr=stderr, reason=reason, lost=lost,
                                 sent_unix_s=sent, received_unix_s=received, timings=timings)

        if isinstance(transport, WatchedTransport) and transport.lost:
            return unreached(transport.lost, lost=True)
        if job.abandoned.is_set():
            return unreached(job.why)
        # A channel closed at the deadline looks ended, with no status: the clock tells it apart.
        timed_out = not finished or (status == -1 and time.monotonic() - began >= local_s)
        if timed_out:
            conn.close()  # a host that did not end the command itself may be hung: reconnect next time
        if timed_out or status == TIMED_OUT_EXIT:
            if timeout_s < command.timeout_s:
                return unreached(_run_deadline_reason(float(self._ssh.run_timeout_s)))
            return unreached(f"command timed out after {timeout_s:g} s")
        if status == -1:
            if not conn.is_connected:
                return unreached(f"connection to {where(conn)} was lost during the command", lost=True)
            return unreached("the command ended without an exit status (killed by a signal)")
        return CommandResult(host=name, reached=True, exit_code=status, stdout=stdout, stderr=stderr,
                             sent_unix_s=sent, received_unix_s=received, timings=timings)
