"""Faults injected into a sandbox's hosts, as methods Sandbox inherits: `sandbox.blackhole("h2")`."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from collections.abc import Iterable
from typing import Literal

from preflight.errors import InputError
from preflight.sandbox import cgroups
from preflight.sandbox.hosts import SandboxHosts
from preflight.sandbox.layout import Host, astray_subnet, rail_ifname
from preflight.sandbox.system import STOP_TIMEOUT_S, ip_batch, keygen, port_open, run, tool, write
from preflight.sandbox.teardown import netns_pids

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

    def pull_link(self, name: str) -> None:
        """Take host `name`'s link down at the bridge, as a pulled cable or a host that lost its power: nothing crosses
        either way, and nothing answers what was under way (no RST, no ICMP); its processes run on, cut off."""
        host = self.host(name)
        run([tool("ip"), "link", "set", "dev", host.veth, "down"])
        self._procs[host.name].link_pulled = True

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

    def rate_limit(self, name: str, rate: str = "20mbit", burst: str = "32kbit", latency: str = "50ms",
                   direction: Literal["both", "send", "receive"] = "both", rail: int | None = None) -> None:
        """Limit host `name`'s link to rate, as a NIC negotiated down or a rate-limited port would: a tbf qdisc on its own
        interface (what it sends) and on the bridge's end of its veth (what it receives); direction "send" or "receive"
        limits that way alone (a bad transmit lane, an asymmetric port) and leaves the other as it was. rail: its NIC on
        that rail instead (an HCA trained at half width, a rail switch port at a lower speed)."""
        host = self.host(name)
        veth, ifname = host.veth, host.ifname
        if rail is not None:
            _, ifname = self._rail(name, rail)
            veth = self.rail_veth(host, rail)
            self._procs[host.name].rails_changed.add(rail)  # heal builds the rail afresh, without its qdiscs
        else:
            self._procs[host.name].rate_limited = True
        tbf = ["root", "tbf", "rate", rate, "burst", burst, "latency", latency]
        if direction in ("both", "receive"):
            run([tool("tc"), "qdisc", "replace", "dev", veth, *tbf])
        if direction in ("both", "send"):
            run([tool("ip"), "netns", "exec", host.netns, tool("tc"), "qdisc", "replace", "dev", ifname, *tbf])

    def throttle_cpu(self, name: str, percent: float | None = 10.0, pids: Iterable[int] | None = None) -> list[int]:
        """Put host `name`'s processes in a CPU cgroup with a quota of percent of one CPU (CFS bandwidth control), as a
        host whose CPUs are throttled; the processes moved. By default its sshd and every process in its namespace, so
        that everything started through sshd from now on is in it too; or only the processes given. percent None: in
        the cgroup without a quota, for set_cpu_quota to throttle later (a host that throttles once under load)."""
        host = self.host(name)
        path = cgroups.throttle(host.netns, percent)
        self._procs[host.name].throttled = True
        if pids is None:
            sshd = self._procs[host.name].sshd
            pids = [*([sshd.pid] if sshd is not None else []), *netns_pids([host.netns])[host.netns]]
        return cgroups.move(path, pids)

    def throttle_io(self, name: str, folder: str, bytes_per_s: int) -> list[int]:
        """Limit what host `name`'s processes read from and write to the block device under folder (on this machine) to
        bytes_per_s, as a host with a slow disk or a slow link to its storage; the processes moved (its sshd and every
        process in its namespace, so everything started through sshd from now on)."""
        host = self.host(name)
        device = os.stat(folder).st_dev
        path = cgroups.throttle_io(host.netns, f"{os.major(device)}:{os.minor(device)}", bytes_per_s)
        self._procs[host.name].io_throttled = True
        sshd = self._procs[host.name].sshd
        return cgroups.move(path, [*([sshd.pid] if sshd is not None else []), *netns_pids([host.netns])[host.netns]])

    def set_cpu_quota(self, name: str, percent: float | None) -> None:
        """Change the quota of host `name`'s CPU cgroup (made by throttle_cpu): percent of one CPU, or None for none."""
        cgroups.throttle(self.host(name).netns, percent)

    def remove_rail(self, name: str, rail: int) -> None:
        """Take host `name`'s interface on rail r away, as a NIC that did not come up after a reboot: it is not there."""
        host, _ = self._rail(name, rail)
        self._procs[host.name].rails_changed.add(rail)
        ip_batch([f"link del {self.rail_veth(host, rail)}"])  # both ends of the veth go

    def rail_down(self, name: str, rail: int) -> None:
        """Take host `name`'s interface on rail r down on the host, as `ip link set down` or a NIC without its link."""
        host, ifname = self._rail(name, rail)
        self._procs[host.name].rails_changed.add(rail)
        ip_batch([f"link set {ifname} down"], netns=host.netns)

    def misaddress_rail(self, name: str, rail: int) -> None:
        """Address host `name`'s interface on rail r on another subnet than its rail peers (the sandbox's astray /24), as
        a mistyped address or a NIC configured for another switch."""
        host, ifname = self._rail(name, rail)
        # Its place in the astray /24 is its place in its own: no two hosts misaddressed collide.
        offset = int(ipaddress.ip_address(host.address)) - int(self.subnet.network_address)
        address = astray_subnet(self.index, self.rails).network_address + offset
        self._procs[host.name].rails_changed.add(rail)
        ip_batch([f"addr flush dev {ifname}", f"addr add {address}/24 dev {ifname}"], netns=host.netns)

    def _rail(self, name: str, rail: int) -> tuple[Host, str]:
        if not 0 <= rail < self.rails:
            raise InputError(f"sandbox {self.prefix!r} has rails 0 to {self.rails - 1}, not {rail}")
        return self.host(name), rail_ifname(rail)

    def heal(self, name: str) -> None:
        """Undo every fault on host `name`: original key and authorized keys, no DROP rule, no rate limit, no CPU quota,
        its link up, its rails as built, sshd running."""
        host = self.host(name)
        procs = self._procs[host.name]
        for rail in sorted(procs.rails_changed):
            # Built afresh: a removed rail has no veth left, a changed one loses what was done to it.
            ip_batch([f"link del {self.rail_veth(host, rail)}"], force=True)
            self._add_rail(host, rail)
        procs.rails_changed.clear()
        if procs.link_pulled:
            run([tool("ip"), "link", "set", "dev", host.veth, "up"])
            procs.link_pulled = False
        if procs.rate_limited:
            # A way rate_limit left unlimited (its direction) has no tbf to delete.
            for enter, dev in (([], host.veth), ([tool("ip"), "netns", "exec", host.netns], host.ifname)):
                if " tbf " in run([*enter, tool("tc"), "qdisc", "show", "dev", dev, "root"]):
                    run([*enter, tool("tc"), "qdisc", "del", "dev", dev, "root"])
            procs.rate_limited = False
        if procs.throttled:
            cgroups.release(cgroups.group_path(host.netns))
            procs.throttled = False
        if procs.io_throttled:
            cgroups.release(cgroups.io_root()[0] / cgroups.group_path(host.netns).name)
            procs.io_throttled = False
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
