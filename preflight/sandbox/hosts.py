"""A sandbox's hosts: finding them and their files, and starting, entering and waiting for the processes that run them."""

from __future__ import annotations

import functools
import os
import pwd
import resource
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from preflight.errors import EnvironmentProblem, InputError
from preflight.sandbox.layout import Host, rail_ifname, subnet_at
from preflight.sandbox.system import ip_batch, port_open, tool

_START_TIMEOUT_S = 20.0  # one host's anchor or sshd; under load 32 sshds take a few seconds
# The anchor: $1 hostname, $2 hosts file, $3 resolv.conf, $4 /dev/shm bytes or empty, $5 ready file,
# $6 this host's .bashrc, $7 root's .bashrc on this machine, $8 this host's /etc/passwd or empty; then its mounts,
# three arguments each: kind (tmpfs, read-only; cgroup-root, cgroup, cgroup2), folder, tmpfs bytes or cgroup options.
# A cgroup that will not mount leaves the host without it (as a container may be) rather than unstarted.
_ANCHOR = """
set -e
hostname "$1"
mount --bind "$2" /etc/hosts
if [ -e /etc/resolv.conf ]; then mount --bind "$3" /etc/resolv.conf; fi
if [ -e "$7" ]; then mount --bind "$6" "$7"; fi
if [ -n "$4" ]; then mount -t tmpfs -o "size=$4,mode=1777,nosuid,nodev" shm /dev/shm; fi
if [ -n "$8" ]; then mount --bind "$8" /etc/passwd; fi
ready=$5
shift 8
while [ $# -ge 3 ]; do
  case "$1" in
    tmpfs) mount -t tmpfs -o "size=$3,mode=1777,nosuid,nodev" tmpfs "$2" ;;
    read-only) mount --bind "$2" "$2"; mount -o remount,bind,ro "$2" ;;
    cgroup-root) mount -t tmpfs -o mode=755 cgroup_root "$2" || echo "no $2" >&2 ;;
    cgroup) mkdir -p "$2" && mount -t cgroup -o "$3" cgroup "$2" || echo "no $2" >&2 ;;
    cgroup2) mkdir -p "$2" && mount -t cgroup2 cgroup2 "$2" || echo "no $2" >&2 ;;
  esac
  shift 3
done
: > "$ready"
exec sleep infinity
"""


def soft_nofile(wanted: int) -> int:
    """The soft open-file limit a host's sshd can be given: wanted, at most this process's hard limit."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


@functools.cache
def cgroup_mounts(mounts: str = "/proc/self/mounts", known: str = "/proc/cgroups") -> tuple[str, ...]:
    """This machine's cgroup file systems under /sys/fs/cgroup, as the anchor's mount arguments (read once: they are the
    same for every host). `ip netns exec` mounts a fresh /sys for a namespace, without them, where a real host has its
    cgroups: its processes' CPU quota is read there. Of a v1 hierarchy's options only its controllers and name are
    given: the same hierarchy, mounted once more."""
    try:
        with open(known, encoding="utf-8") as f:
            controllers = {line.split()[0] for line in f if line.strip() and not line.startswith("#")}
        with open(mounts, encoding="utf-8") as f:
            lines = [line.split() for line in f]
    except OSError:
        return ()
    found: list[str] = []
    for _, target, kind, options, *_ in (fields for fields in lines if len(fields) >= 4):
        if target != "/sys/fs/cgroup" and not target.startswith("/sys/fs/cgroup/"):
            continue
        if kind == "tmpfs" and target == "/sys/fs/cgroup":
            found += ["cgroup-root", target, "-"]
        elif kind == "cgroup":
            chosen = [o for o in options.split(",") if o in controllers or o.startswith("name=")]
            found += ["cgroup", target, ",".join(chosen)] if chosen else []
        elif kind == "cgroup2":
            found += ["cgroup2", target, "-"]
    return tuple(found)


@dataclass
class Processes:
    """The processes this process started for one host, and the faults in force."""

    anchor: subprocess.Popen[bytes]
    sshd: subprocess.Popen[bytes] | None = None
    listener: subprocess.Popen[bytes] | None = None
    blackholed: bool = False
    link_pulled: bool = False  # its veth down at the bridge (Faults.pull_link)
    rate_limited: bool = False  # a tbf qdisc on both ends of its veth (Faults.rate_limit)
    throttled: bool = False  # its processes in a CPU cgroup with a quota (Faults.throttle_cpu)
    io_throttled: bool = False  # its processes in a block I/O cgroup with a limit (Faults.throttle_io)
    rails_changed: set[int] = field(default_factory=set)  # rails removed, taken down or misaddressed (Faults.*_rail)


class SandboxHosts:
    """The hosts of a sandbox, their files, and the processes this process runs in them."""

    def __init__(self, prefix: str, index: int, state_root: Path, hosts: Sequence[Host]) -> None:
        self.prefix = prefix  # names its namespaces, interfaces and state folder
        self.index = index  # which /24 of 198.18.0.0/15 it uses
        self.state_dir = state_root / prefix  # keys, known_hosts, per-host files, state.json
        self.subnet = subnet_at(index)
        self.bridge = f"{prefix}-br"  # joins the hosts; holds the subnet's .1, this machine's address
        self.hosts = tuple(hosts)  # h1 (the master), h2, ...
        self._state_root = state_root
        self._procs: dict[str, Processes] = {}
        self._configs: list[str] = []

    @property
    def identity(self) -> Path:
        """The client's private key, authorized for root on every host."""
        return self.state_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        """known_hosts with every host's key under its address and its name."""
        return self.state_dir / "known_hosts"

    @property
    def rails(self) -> int:
        """How many rails each host has besides its own interface (0: none)."""
        return len(self.hosts[0].rail_addresses)

    def rail_bridge(self, rail: int) -> str:
        """Rail r's bridge, in this machine's namespace: the rail's switch."""
        return f"{self.prefix}-br{rail}"

    @staticmethod
    def rail_veth(host: Host, rail: int) -> str:
        """The bridge's end of host's veth on rail r."""
        return f"{host.netns}r{rail}"

    def _add_rail(self, host: Host, rail: int) -> None:
        """Host's interface on rail r: a veth on the rail's bridge, addressed on the rail's subnet."""
        veth, ifname = self.rail_veth(host, rail), rail_ifname(rail)
        ip_batch([f"link add {veth} type veth peer name {ifname} netns {host.netns}", f"link set {veth} addrgenmode none",
                  f"link set {veth} master {self.rail_bridge(rail)} up"])
        ip_batch([f"link set {ifname} addrgenmode none", f"addr add {host.rail_addresses[rail]}/24 dev {ifname}",
                  f"link set {ifname} up"], netns=host.netns)

    @property
    def master(self) -> Host:
        """The first host, the cluster's master."""
        return self.hosts[0]

    def host(self, name: str) -> Host:
        """The host called `name`."""
        for host in self.hosts:
            if host.name == name:
                return host
        raise InputError(f"sandbox {self.prefix!r} has no host {name!r}")

    def _host_dir(self, host: Host) -> Path:
        return self.state_dir / "hosts" / host.name

    def _start_anchor(self, host: Host) -> subprocess.Popen[bytes]:
        folder = self._host_dir(host)
        shm = str(host.quirks.shm_bytes) if host.quirks.shm_bytes is not None else ""
        passwd = str(folder / "passwd") if host.quirks.user else ""
        mounts = [*cgroup_mounts(), *(arg for m in host.quirks.mounts for arg in (m.kind, m.target, str(m.size_bytes)))]
        argv = [tool("ip"), "netns", "exec", host.netns, tool("unshare"), "--uts", "--mount", "--propagation", "private",
                "sh", "-c", _ANCHOR, "sh", host.name, str(folder / "hosts"), str(folder / "resolv.conf"), shm, str(folder / "ready"),
                str(folder / "bashrc"), os.path.join(pwd.getpwnam("root").pw_dir, ".bashrc"), passwd, *mounts]
        return self._spawn(argv, folder / "anchor.log")

    def _enter(self, host: Host) -> list[str]:
        """The command prefix that runs a program inside the host: its network, hostname and mounts."""
        anchor = self._procs[host.name].anchor.pid
        return [tool("nsenter"), "--target", str(anchor), "--net", "--uts", "--mount", "--"]

    def _start_sshd(self, host: Host) -> subprocess.Popen[bytes]:
        folder = self._host_dir(host)
        # prlimit: the host's own soft open-file limit rather than whatever started this process (a service's 1024), as a
        # real host's sshd has its unit's; the hard limit stays this machine's, which only privilege may raise.
        limit = f"--nofile={soft_nofile(host.quirks.nofile)}:"
        return self._spawn([tool("prlimit"), limit, "--", *self._enter(host), tool("sshd"), "-D", "-e", "-f", str(folder / "sshd_config")],
                           folder / "sshd.log")

    @staticmethod
    def _spawn(argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
        # A session of its own: a Ctrl-C at the terminal must not kill a sandbox that `sandbox up` left running.
        with open(log, "ab") as out:
            return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)

    def _wait(self, hosts: Sequence[Host], what: str, ready: Callable[[Host], bool],
              process: Callable[[Host], subprocess.Popen[bytes] | None]) -> None:
        """Until ready(host) for every host, within _START_TIMEOUT_S; `what` names the process and its log."""
        pending = list(hosts)
        deadline = time.monotonic() + _START_TIMEOUT_S
        for _ in range(10_000):
            for host in list(pending):
                proc = process(host)
                if proc is not None and proc.poll() is not None:
                    log = self._host_dir(host) / f"{what}.log"
                    lines = log.read_text(encoding="utf-8", errors="replace").strip().splitlines() if log.exists() else []
                    raise EnvironmentProblem(f"sandbox: {what} of {host.name} exited with {proc.returncode}: "
                                             f"{lines[-1] if lines else 'no output'}")
                if ready(host):
                    pending.remove(host)
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        if pending:
            raise EnvironmentProblem(f"sandbox: {what} of {', '.join(h.name for h in pending)} not ready within {_START_TIMEOUT_S:g} s")

    def _wait_sshd(self, hosts: Sequence[Host]) -> None:
        self._wait(hosts, "sshd", lambda h: port_open(h.address), lambda h: self._procs[h.name].sshd)
