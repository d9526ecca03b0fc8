"""The Sandbox: building one, using it and tearing it down, and the sandboxes this process keeps alive."""

from __future__ import annotations

import atexit
import ipaddress
import json
import math
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from types import FrameType, TracebackType

import yaml

from preflight.errors import InputError
from preflight.sandbox.faults import Faults
from preflight.sandbox.hosts import Processes
from preflight.sandbox.layout import (
    DEFAULT_PREFIX,
    DEFAULT_STATE_ROOT,
    FIRST_HOST,
    PREFIX,
    TRAINING_UID,
    Host,
    HostQuirks,
    foreign_address,
    rail_ifname,
    rail_subnet,
    subnet_at,
    subnet_count,
    validate,
)
from preflight.sandbox.system import COMMAND_TIMEOUT_S, check_requirements, ip_batch, keygen, room_for_neighbours, run, tool, write
from preflight.sandbox.teardown import leftovers, netns_pids, tear_down

# A freshly installed host's root shell rc: a non-interactive shell (an SSH command) returns at once.
_STOCK_BASHRC = "# a sandbox host's own ~/.bashrc, as on a fresh install\ncase $- in *i*) ;; *) return;; esac\n"

_LIVE: dict[str, Sandbox] = {}
_hooks_installed = False


def _down_all() -> None:
    for sandbox in list(_LIVE.values()):
        sandbox.down()


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    # An exception, not a teardown here: it unwinds whatever is running (subprocess.run kills its
    # child on the way), then up()'s cleanup, a with block or atexit tears down, as for Ctrl-C.
    raise SystemExit(128 + signum)


def _install_hooks() -> None:
    """Tear down live sandboxes at exit, and make SIGTERM and SIGHUP exit through atexit as Ctrl-C does."""
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(_down_all)
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers; atexit still covers a normal exit
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is signal.SIG_DFL:  # never replace a handler someone installed
            signal.signal(signum, _exit_on_signal)


class Sandbox(Faults):
    """A running sandbox cluster, made by Sandbox.up; use it as a context manager, or call down()."""

    # --- building -------------------------------------------------------------------------

    @classmethod
    def up(
        cls,
        n: int,
        *,
        prefix: str = DEFAULT_PREFIX,
        index: int = 0,
        quirks: Mapping[int, HostQuirks] | None = None,
        state_root: Path | str = DEFAULT_STATE_ROOT,
        name_prefix: str = "h",
        rails: int = 0,
    ) -> Sandbox:
        """Build n hosts (quirks keyed by host number, 1 = master) on subnet 198.18.0.0/15's index-th /24; with rails,
        each host also has one interface per rail (eth1, eth2, ...), rail r on a bridge and a /24 of its own (the
        index + 1 + r-th), as a rail-optimized cluster's NIC r of every host meets on rail switch r."""
        check_requirements()
        quirks = dict(quirks or {})
        state_root = Path(state_root)
        validate(n, prefix, index, quirks, name_prefix, rails)
        present = leftovers(prefix, state_root=state_root)
        if present:
            how = "`preflight sandbox down`" if prefix == DEFAULT_PREFIX else f"Sandbox.down_prefix({prefix!r})"
            raise InputError(f"sandbox {prefix!r} already exists ({present[0]}, ...); remove it first with {how}")
        subnet = subnet_at(index)
        subnets = [subnet_at(index + i) for i in range(subnet_count(rails))]
        for line in run([tool("ip"), "-o", "-4", "addr", "show"]).splitlines():
            fields = line.split()
            for taken in subnets:
                if ipaddress.ip_interface(fields[3]).network.overlaps(taken):
                    raise InputError(f"sandbox: subnet {taken} (index {index}{f' with {rails} rails' if rails else ''}) is in use "
                                     f"on {fields[1]}; choose another index")
        hosts = []
        for k in range(1, n + 1):
            q = quirks.get(k, HostQuirks())
            hosts.append(Host(
                name=f"{name_prefix}{k}", address=str(subnet.network_address + FIRST_HOST + k - 1),
                netns=f"{prefix}-h{k}", ifname=q.ifname, veth=f"{prefix}-h{k}-v", python=q.python or sys.executable, quirks=q,
                rail_addresses=tuple(str(rail_subnet(index, r).network_address + FIRST_HOST + k - 1) for r in range(rails)),
            ))
        sandbox = cls(prefix, index, state_root, hosts)
        _install_hooks()
        _LIVE[prefix] = sandbox
        try:
            sandbox._build()
        except BaseException:
            sandbox.down()
            raise
        return sandbox

    def _build(self) -> None:
        self.state_dir.mkdir(parents=True, mode=0o700)
        self._save_state()
        for host in self.hosts:
            self._host_dir(host).mkdir(parents=True)
        keygen([self.identity, *(self._host_dir(h) / "ssh_host_ed25519_key" for h in self.hosts)],
               [f"preflight-sandbox-{self.prefix}", *(h.name for h in self.hosts)])
        client_key = self.identity.with_suffix(".pub").read_text(encoding="utf-8")
        known = []
        for host in self.hosts:
            folder = self._host_dir(host)
            public = (folder / "ssh_host_ed25519_key.pub").read_text(encoding="utf-8").split()
            known.append(f"{host.address},{host.name} {public[0]} {public[1]}\n")
            write(folder / "authorized_keys", client_key)
            write(folder / "hosts", self._hosts_file(host))
            write(folder / "resolv.conf", "# a sandbox host has no name server: every name is in /etc/hosts\n")
            # Its own home's shell rc, not this machine's: every SSH command runs it (bash reads
            # ~/.bashrc when started by sshd), and a development machine's (pyenv, conda) would
            # add its cost to every host.
            banner = f"echo {shlex.quote(host.quirks.login_banner)}\n" if host.quirks.login_banner else ""
            write(folder / "bashrc", banner + _STOCK_BASHRC)
            write(folder / "sshd_config", self._sshd_config(host))
            if host.quirks.user:
                self._add_user(host)
        write(self.known_hosts, "".join(known))
        self._build_network()
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder
        for host in self.hosts:
            self._procs[host.name] = Processes(anchor=self._start_anchor(host))
        self._wait(self.hosts, "anchor", lambda h: (self._host_dir(h) / "ready").exists(), lambda h: self._procs[h.name].anchor)
        for host in self.hosts:
            self._procs[host.name].sshd = self._start_sshd(host)
        self._wait_sshd(self.hosts)

    def _add_user(self, host: Host) -> None:
        """The host's own /etc/passwd with its training user; sshd reads that user's authorized keys as the user, so the
        folders above them become passable (not listable) and the keys readable: they are public keys."""
        folder = self._host_dir(host)
        entry = f"{host.quirks.user}:x:{TRAINING_UID}:{TRAINING_UID}:preflight sandbox training user:/tmp:/bin/sh\n"
        write(folder / "passwd", Path("/etc/passwd").read_text(encoding="utf-8") + entry)
        for passable in (self.state_dir, folder.parent, folder):
            passable.chmod(0o711)

    def _build_network(self) -> None:
        # Every rail is one more network on which each host reaches every other: (1 + rails) * n * n entries at most.
        room_for_neighbours(len(self.hosts) * (math.isqrt(self.rails) + 1))
        # nf_call_iptables 0: bridged frames skip this machine's FORWARD chain (Docker sets it to DROP).
        # addrgenmode none: no IPv6 link-local chatter; the sandbox speaks 198.18.0.0/15 only.
        root = [f"link add {self.bridge} type bridge nf_call_iptables 0", f"link set {self.bridge} addrgenmode none",
                f"addr add {self.subnet.network_address + 1}/24 dev {self.bridge}", f"link set {self.bridge} up"]
        for host in self.hosts:
            root += [f"netns add {host.netns}", f"link add {host.veth} type veth peer name {host.ifname} netns {host.netns}",
                     f"link set {host.veth} addrgenmode none", f"link set {host.veth} master {self.bridge} up"]
        for r in range(self.rails):
            bridge = self.rail_bridge(r)
            root += [f"link add {bridge} type bridge nf_call_iptables 0", f"link set {bridge} addrgenmode none",
                     f"addr add {rail_subnet(self.index, r).network_address + 1}/24 dev {bridge}", f"link set {bridge} up"]
        ip_batch(root)
        for host in self.hosts:
            ip_batch(["link set lo up", f"link set {host.ifname} addrgenmode none",
                      f"addr add {host.address}/24 dev {host.ifname}", f"link set {host.ifname} up"], netns=host.netns)
            for r in range(self.rails):
                self._add_rail(host, r)

    def _hosts_file(self, me: Host) -> str:
        loopback = " " + me.name if me.quirks.own_name == "loopback" else ""
        lines = [f"# /etc/hosts of sandbox host {me.name}", f"127.0.0.1\tlocalhost{loopback}", "::1\tlocalhost ip6-localhost ip6-loopback"]
        lines += [f"{h.address}\t{h.name}" for h in self.hosts if h is not me or me.quirks.own_name == "address"]
        if me.quirks.own_name == "foreign":
            lines.append(f"{foreign_address(self.index)}\t{me.name}")
        return "\n".join(lines) + "\n"

    def _sshd_config(self, host: Host) -> str:
        folder = self._host_dir(host)
        return "\n".join([
            f"# sshd of sandbox host {host.name}",
            "ListenAddress 0.0.0.0:22",
            "AddressFamily inet",
            f"HostKey {folder / 'ssh_host_ed25519_key'}",
            f"PidFile {folder / 'sshd.pid'}",
            f"AuthorizedKeysFile {folder / 'authorized_keys'}",  # per host, so deny_auth hits one host
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "StrictModes no",  # the state folder is not a home folder
            "UsePAM no",
            "PrintMotd no",
            "UseDNS no",
            # preflight fans out 64 connections at once; the default 10:30:100 drops some of them.
            "MaxStartups 256",
            "MaxSessions 64",
            "Subsystem sftp internal-sftp",
        ]) + "\n"

    def _save_state(self) -> None:
        state = {"prefix": self.prefix, "index": self.index, "subnet": str(self.subnet), "bridge": self.bridge,
                 "hosts": [asdict(h) for h in self.hosts], "configs": self._configs}
        tmp = self.state_dir / "state.json.tmp"
        write(tmp, json.dumps(state, indent=2) + "\n", 0o600)
        tmp.replace(self.state_dir / "state.json")

    # --- using -----------------------------------------------------------------------------

    def ssh_argv(self, name: str, *command: str, connect_timeout: float = 5) -> list[str]:
        """An ssh command line into host `name` as root, with strict host keys and no prompts."""
        return ["ssh", "-F", "none", "-i", str(self.identity), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "GlobalKnownHostsFile=none",
                "-o", f"ConnectTimeout={connect_timeout:g}", f"root@{self.host(name).address}", *command]

    def write_cluster_config(self, path: Path | str, *, name: str = "sandbox", header: str | None = None) -> Path:
        """Write preflight's `cluster` config for this sandbox to path; down() removes it."""
        path = Path(path)
        cluster = {
            "name": name,
            "master": self.master.name,
            "hosts": [{"name": h.name, "address": h.address, "transport": "ssh", "user": h.quirks.user or "root", "port": 22,
                       "identity": str(self.identity), "python": h.python, "gpus": "0", "interface": h.ifname,
                       **({"interfaces": [rail_ifname(r) for r in range(self.rails)]} if self.rails else {})} for h in self.hosts],
        }
        document = {"cluster": cluster, "ssh": {"known_hosts": str(self.known_hosts)}, "training": {"backend": "gloo"}}
        header = header or f"written by preflight.sandbox (prefix {self.prefix}); removed when that sandbox goes down"
        path.parent.mkdir(parents=True, exist_ok=True)
        self._configs.append(str(path.resolve()))
        self._save_state()
        tmp = path.with_name(path.name + ".tmp")
        write(tmp, f"# @package _global_\n# {header}\n" + yaml.safe_dump(document, sort_keys=False))
        tmp.replace(path)
        return path

    def run_in(self, name: str, argv: Sequence[str], *, timeout: float = COMMAND_TIMEOUT_S,
               stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run argv inside host `name` (its network, hostname and mounts); raises subprocess.TimeoutExpired past timeout."""
        return subprocess.run([*self._enter(self.host(name)), *argv], input=stdin, capture_output=True, text=True, timeout=timeout)

    def pids(self, name: str) -> list[int]:
        """The processes living in host `name`'s network namespace, as `ip netns pids` lists them: an idle host has its anchor and sshd."""
        netns = self.host(name).netns
        return netns_pids([netns])[netns]

    # --- tearing down ----------------------------------------------------------------------

    def down(self) -> list[str]:
        """Remove everything this sandbox made (idempotent); returns what was there."""
        children = [p for procs in self._procs.values() for p in (procs.anchor, procs.sshd, procs.listener) if p is not None]
        removed = tear_down(self.prefix, self._state_root, children)
        self._procs.clear()
        _LIVE.pop(self.prefix, None)  # only now: if teardown failed, atexit tries again
        return removed

    def detach(self) -> None:
        """Leave the sandbox up when this process exits; a later down_prefix removes it."""
        _LIVE.pop(self.prefix, None)

    @staticmethod
    def down_prefix(prefix: str = DEFAULT_PREFIX, *, state_root: Path | str = DEFAULT_STATE_ROOT) -> list[str]:
        """Remove sandbox `prefix`, including the leftovers of a process that was killed; returns what was there."""
        if not PREFIX.match(prefix):
            raise InputError(f"sandbox: prefix {prefix!r} must be 1 to 8 lowercase letters and digits, starting with a letter")
        live = _LIVE.get(prefix)
        if live is not None and live._state_root == Path(state_root):
            return live.down()
        return tear_down(prefix, Path(state_root))

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.down()
