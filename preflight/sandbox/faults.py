"""Faults injected into a sandbox's hosts, as methods Sandbox inherits: `sandbox.blackhole("h2")`."""

from __future__ import annotations

import subprocess
import sys

from preflight.sandbox.hosts import SandboxHosts
from preflight.sandbox.layout import Host
from preflight.sandbox.system import STOP_TIMEOUT_S, keygen, port_open, run, tool, write

_SILENT_LISTENER = """
import select, socket, sys, time
deadline = time.monotonic() + float(sys.argv[1])
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", 22))
server.listen(128)
held = []
while (left := deadline - time.monotonic()) > 0:
    if select.select([server], [], [], left)[0]:
        held.append(server.accept()[0])
"""


class Faults(SandboxHosts):
    """The faults of a sandbox's hosts: each is undone by heal(name)."""

    def stop_sshd(self, name: str) -> None:
        """Stop host `name`'s sshd, as `systemctl stop ssh` would: new connections are refused."""
        procs = self._procs[self.host(name).name]
        self._stop(procs.sshd)
        procs.sshd = None

    def blackhole(self, name: str) -> None:
        """Drop every packet arriving on host `name`'s interface: connects to it time out."""
        host = self.host(name)
        if not self._procs[host.name].blackholed:
            run([tool("ip"), "netns", "exec", host.netns, tool("iptables"), "-w", "5", "-I", "INPUT", "-i", host.ifname, "-j", "DROP"])
            self._procs[host.name].blackholed = True

    def deny_auth(self, name: str) -> None:
        """Empty host `name`'s authorized keys: connections get `Permission denied (publickey)`."""
        write(self._host_dir(self.host(name)) / "authorized_keys", "")

    def change_host_key(self, name: str) -> None:
        """Give host `name` a new host key that known_hosts does not know: `Host key verification failed`."""
        host = self.host(name)
        key = self._host_dir(host) / "ssh_host_ed25519_key"
        original = key.with_name(key.name + ".orig")
        if not original.exists():
            key.replace(original)
            key.with_suffix(".pub").replace(original.with_name(original.name + ".pub"))
        else:
            key.unlink()
            key.with_suffix(".pub").unlink()
        keygen([key], [f"{host.name}-changed"])
        self._restart_sshd(host)

    def silence(self, name: str, *, lifetime_s: float = 300) -> None:
        """Replace host `name`'s sshd by a listener that accepts and never sends a banner (exits after lifetime_s)."""
        host = self.host(name)
        procs = self._procs[host.name]
        self._stop(procs.sshd)
        procs.sshd = None
        self._stop(procs.listener)
        argv = [*self._enter(host), sys.executable, "-I", "-S", "-c", _SILENT_LISTENER, str(lifetime_s)]
        procs.listener = self._spawn(argv, self._host_dir(host) / "listener.log")
        self._wait([host], "listener", lambda h: port_open(h.address), lambda h: procs.listener)

    def heal(self, name: str) -> None:
        """Undo every fault on host `name`: original key and authorized keys, no DROP rule, sshd running."""
        host = self.host(name)
        procs = self._procs[host.name]
        folder = self._host_dir(host)
        self._stop(procs.listener)
        procs.listener = None
        key = folder / "ssh_host_ed25519_key"
        original = key.with_name(key.name + ".orig")
        restart = original.exists()
        if restart:
            original.replace(key)
            original.with_name(original.name + ".pub").replace(key.with_suffix(".pub"))
        write(folder / "authorized_keys", self.identity.with_suffix(".pub").read_text(encoding="utf-8"))
        if procs.blackholed:
            run([tool("ip"), "netns", "exec", host.netns, tool("iptables"), "-w", "5", "-D", "INPUT", "-i", host.ifname, "-j", "DROP"])
            procs.blackholed = False
        if restart or procs.sshd is None or procs.sshd.poll() is not None:
            self._restart_sshd(host)

    def _restart_sshd(self, host: Host) -> None:
        procs = self._procs[host.name]
        self._stop(procs.sshd)
        procs.sshd = self._start_sshd(host)
        self._wait_sshd([host])

    @staticmethod
    def _stop(proc: subprocess.Popen[bytes] | None) -> None:
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT_S)
