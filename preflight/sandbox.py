"""A test cluster on this machine: N hosts as network namespaces on one Linux bridge (root only).

Layout for prefix ``pf`` and index 0: bridge ``pf-br`` holds 198.18.0.1/24 in this machine's
namespace, so this machine is the controller; host ``hK`` is namespace ``pf-hK`` at 198.18.0.(10+K),
joined to the bridge by veth ``pf-hK-v``. Each host is an *anchor* process (``sleep``) that holds
the host's own UTS and mount namespaces: its hostname, its ``/etc/hosts`` naming every host, its
``/etc/resolv.conf`` with no server, root's own stock ``~/.bashrc``, and optionally a small ``/dev/shm``. They outlive any sshd
restart, as a real machine's do; its sshd, the silent listener and :meth:`Sandbox.run_in` enter
them with ``nsenter``.

Everything else lives in the state folder (``/run/preflight-sandbox/pf``): the client key,
known_hosts, ``state.json`` and one folder per host (host key, sshd_config, authorized_keys,
hosts, logs). Teardown finds what to remove by name, so it also cleans up after a process that
was killed while its sandbox was up.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Literal

import yaml

from preflight.errors import EnvironmentProblem, InputError
from preflight.resources import user_config_dir

DEFAULT_PREFIX = "pf"
DEFAULT_STATE_ROOT = Path("/run/preflight-sandbox")
SUBNETS = ipaddress.ip_network("198.18.0.0/15")  # RFC 2544 benchmarking space: never routed
MAX_HOSTS = 240
CLI_CONFIG_HEADER = "written by `preflight sandbox up`; removed by `preflight sandbox down`"

_FIRST_HOST = 11  # .1 is the bridge (the controller); hosts start at .11
_PREFIX = re.compile(r"^[a-z][a-z0-9]{0,7}$")  # 8 + len("-h240-v") = 15, Linux's interface name limit
_NAME_PREFIX = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
_IFNAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,14}$")
_NETNS_DIR = Path("/run/netns")  # where `ip netns add` pins namespaces
_TOOL_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])
_COMMAND_TIMEOUT_S = 30.0
_START_TIMEOUT_S = 20.0  # one host's anchor or sshd; under load 32 sshds take a few seconds
_STOP_TIMEOUT_S = 10.0
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
# A freshly installed host's root shell rc: a non-interactive shell (an SSH command) returns at once.
_STOCK_BASHRC = "# a sandbox host's own ~/.bashrc, as on a fresh install\ncase $- in *i*) ;; *) return;; esac\n"
# The anchor: $1 hostname, $2 hosts file, $3 resolv.conf, $4 /dev/shm bytes or empty, $5 ready file,
# $6 this host's .bashrc, $7 root's .bashrc on this machine.
_ANCHOR = """
set -e
hostname "$1"
mount --bind "$2" /etc/hosts
if [ -e /etc/resolv.conf ]; then mount --bind "$3" /etc/resolv.conf; fi
if [ -e "$7" ]; then mount --bind "$6" "$7"; fi
if [ -n "$4" ]; then mount -t tmpfs -o "size=$4,mode=1777,nosuid,nodev" shm /dev/shm; fi
: > "$5"
exec sleep infinity
"""


@dataclass(frozen=True)
class HostQuirks:
    """How one host differs from a plain one."""

    ifname: str = "eth0"  # its network interface, e.g. ens5 to reproduce interface drift
    shm_bytes: int | None = None  # size of a tmpfs mounted on its /dev/shm; None: this machine's
    own_name: Literal["address", "missing", "loopback"] = "address"  # what its own /etc/hosts maps its name to
    python: str | None = None  # python of its training environment; None: this one (sys.executable)


@dataclass(frozen=True)
class Host:
    """One host of a sandbox."""

    name: str  # its hostname, and its name in the cluster config
    address: str  # its IPv4 address on the bridge
    netns: str  # its network namespace
    ifname: str  # its interface, the namespace's end of the veth
    veth: str  # the bridge's end of the veth, in this machine's namespace
    python: str  # python for preflight's probe
    quirks: HostQuirks  # how it was built


@dataclass
class _Processes:
    """The processes this process started for one host, and the faults in force."""

    anchor: subprocess.Popen[bytes]
    sshd: subprocess.Popen[bytes] | None = None
    listener: subprocess.Popen[bytes] | None = None
    blackholed: bool = False


_PACKAGES = {
    "ip": "iproute2",
    "sshd": "openssh-server",
    "ssh-keygen": "openssh-client",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "iptables": "iptables",
}


def _tool(name: str) -> str:
    found = shutil.which(name, path=_TOOL_PATH)
    if found is None:
        raise EnvironmentProblem(f"sandbox: `{name}` is not installed (Debian: apt-get install {_PACKAGES[name]})")
    return found


def check_requirements() -> None:
    """Raise EnvironmentProblem unless this machine can build a sandbox: root, ip, sshd, unshare, nsenter, ssh-keygen."""
    if os.geteuid() != 0:
        raise EnvironmentProblem("sandbox: network namespaces need root; run it as root (sudo)")
    for name in ("ip", "sshd", "unshare", "nsenter", "ssh-keygen"):
        _tool(name)
    # Root is not enough in an unprivileged container: try what every host needs.
    try:
        _run([_tool("unshare"), "--net", "--uts", "--mount", "true"])
    except EnvironmentProblem as e:
        raise EnvironmentProblem(f"{e} (namespaces are not allowed here; a container needs --privileged)") from None


def _run(argv: Sequence[str], *, stdin: str | None = None, timeout: float = _COMMAND_TIMEOUT_S) -> str:
    try:
        result = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise EnvironmentProblem(f"sandbox: `{shlex.join(argv)}` did not finish within {timeout:g} s") from e
    if result.returncode != 0:
        detail = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[-1]
        raise EnvironmentProblem(f"sandbox: `{shlex.join(argv)}` failed: {detail}")
    return result.stdout


def _ip_batch(commands: Sequence[str], *, netns: str | None = None, force: bool = False) -> None:
    """Many ip commands in one process: a 32-host sandbox needs ~200 of them."""
    argv = [_tool("ip"), *(["-n", netns] if netns else []), *(["-force"] if force else []), "-batch", "-"]
    if force:
        # Teardown wants every line tried, whatever failed before it.
        subprocess.run(argv, input="\n".join(commands) + "\n", capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S)
    else:
        _run(argv, stdin="\n".join(commands) + "\n")


def _subnet(index: int) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network((int(SUBNETS.network_address) + 256 * index, 24))


def _namespaces(prefix: str) -> list[str]:
    pattern = re.compile(rf"^{re.escape(prefix)}-h[0-9]+$")
    names = os.listdir(_NETNS_DIR) if _NETNS_DIR.is_dir() else []
    return sorted(n for n in names if pattern.match(n))


def _links(prefix: str) -> list[str]:
    pattern = re.compile(rf"^{re.escape(prefix)}-(br|h[0-9]+-v)$")
    return sorted(n for n in os.listdir("/sys/class/net") if pattern.match(n))


def _netns_pids(namespaces: Sequence[str]) -> dict[str, list[int]]:
    """What `ip netns pids` gives, for many namespaces in one pass over /proc."""
    wanted: dict[tuple[int, int], str] = {}
    for ns in namespaces:
        try:
            st = os.stat(_NETNS_DIR / ns)
        except FileNotFoundError:
            continue
        wanted[(st.st_dev, st.st_ino)] = ns
    found: dict[str, list[int]] = {ns: [] for ns in namespaces}
    if not wanted:
        return found
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:  # gone, or a zombie, which has no namespaces left
            continue
        ns_name = wanted.get((st.st_dev, st.st_ino))
        if ns_name is not None:
            found[ns_name].append(int(entry))
    return found


def leftovers(prefix: str = DEFAULT_PREFIX, *, state_root: Path | str = DEFAULT_STATE_ROOT) -> list[str]:
    """What exists of sandbox `prefix`: namespaces, interfaces, processes and its state folder; [] when it is all gone."""
    state_root = Path(state_root)
    namespaces = _namespaces(prefix)
    found = [f"namespace {ns}" for ns in namespaces] + [f"interface {link}" for link in _links(prefix)]
    found += [f"process {pid} in {ns}" for ns, pids in _netns_pids(namespaces).items() for pid in pids]
    if (state_root / prefix).exists():
        found.append(f"folder {state_root / prefix}")
    return found


def _kill_namespaces(namespaces: Sequence[str]) -> None:
    """SIGKILL every process in the namespaces, until none is left (sshd may fork while we kill)."""
    deadline = time.monotonic() + _STOP_TIMEOUT_S
    for _ in range(200):
        pids = [pid for ns_pids in _netns_pids(namespaces).values() for pid in ns_pids]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    raise EnvironmentProblem(f"sandbox: processes {pids} in {', '.join(namespaces)} survive SIGKILL")


def _teardown(prefix: str, state_root: Path, children: Sequence[subprocess.Popen[bytes]] = ()) -> list[str]:
    """Remove everything of sandbox `prefix`, whoever built it; returns what was there."""
    # A second Ctrl-C during teardown must not leave half a sandbox: the signals wait until it is done.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
    try:
        return _remove(prefix, state_root, children)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _remove(prefix: str, state_root: Path, children: Sequence[subprocess.Popen[bytes]]) -> list[str]:
    found = leftovers(prefix, state_root=state_root)
    namespaces = _namespaces(prefix)
    _kill_namespaces(namespaces)
    for child in children:  # reap them: they were in the namespaces
        try:
            child.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(timeout=_STOP_TIMEOUT_S)
    links = _links(prefix)
    if links or namespaces:
        # Deleting the veth first removes both ends now; a deleted namespace frees its end later.
        _ip_batch([f"link del {link}" for link in links] + [f"netns del {ns}" for ns in namespaces], force=True)
    state_dir = state_root / prefix
    for config in _recorded_configs(state_dir):
        config.unlink(missing_ok=True)
    shutil.rmtree(state_dir, ignore_errors=True)
    deadline = time.monotonic() + _STOP_TIMEOUT_S
    for _ in range(200):
        remaining = leftovers(prefix, state_root=state_root)
        if not remaining:
            return found
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    raise EnvironmentProblem(f"sandbox: could not remove {'; '.join(remaining)}")


def _recorded_configs(state_dir: Path) -> list[Path]:
    try:
        state = json.loads((state_dir / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [Path(p) for p in state.get("configs", [])]


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


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)


def _keygen(paths: Sequence[Path], comments: Sequence[str]) -> None:
    """ed25519 keys, generated in parallel."""
    keygen = _tool("ssh-keygen")
    procs = [
        subprocess.Popen([keygen, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for path, comment in zip(paths, comments, strict=True)
    ]
    errors = []
    try:
        for proc in procs:
            try:
                _, err = proc.communicate(timeout=_COMMAND_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                err = b"timed out"
            if proc.returncode != 0:
                errors.append(err.decode(errors="replace").strip())
    finally:
        for proc in procs:  # none may write into a state folder that teardown is removing
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if errors:
        raise EnvironmentProblem(f"sandbox: ssh-keygen failed: {errors[0]}")


def _port_open(address: str, port: int = 22) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


class Sandbox:
    """A running sandbox cluster, made by Sandbox.up; use it as a context manager, or call down()."""

    def __init__(self, prefix: str, index: int, state_root: Path, hosts: Sequence[Host]) -> None:
        self.prefix = prefix  # names its namespaces, interfaces and state folder
        self.index = index  # which /24 of 198.18.0.0/15 it uses
        self.state_dir = state_root / prefix  # keys, known_hosts, per-host files, state.json
        self.subnet = _subnet(index)
        self.bridge = f"{prefix}-br"  # joins the hosts; holds the subnet's .1, this machine's address
        self.hosts = tuple(hosts)  # h1 (the master), h2, ...
        self._state_root = state_root
        self._procs: dict[str, _Processes] = {}
        self._configs: list[str] = []

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
    ) -> Sandbox:
        """Build n hosts (quirks keyed by host number, 1 = master) on subnet 198.18.0.0/15's index-th /24."""
        check_requirements()
        quirks = dict(quirks or {})
        state_root = Path(state_root)
        _validate(n, prefix, index, quirks, name_prefix)
        present = leftovers(prefix, state_root=state_root)
        if present:
            how = "`preflight sandbox down`" if prefix == DEFAULT_PREFIX else f"Sandbox.down_prefix({prefix!r})"
            raise InputError(f"sandbox {prefix!r} already exists ({present[0]}, ...); remove it first with {how}")
        subnet = _subnet(index)
        for line in _run([_tool("ip"), "-o", "-4", "addr", "show"]).splitlines():
            fields = line.split()
            if ipaddress.ip_interface(fields[3]).network.overlaps(subnet):
                raise InputError(f"sandbox: subnet {subnet} (index {index}) is in use on {fields[1]}; choose another index")
        hosts = []
        for k in range(1, n + 1):
            q = quirks.get(k, HostQuirks())
            hosts.append(Host(
                name=f"{name_prefix}{k}", address=str(subnet.network_address + _FIRST_HOST + k - 1),
                netns=f"{prefix}-h{k}", ifname=q.ifname, veth=f"{prefix}-h{k}-v", python=q.python or sys.executable, quirks=q,
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
        _keygen([self.identity, *(self._host_dir(h) / "ssh_host_ed25519_key" for h in self.hosts)],
                [f"preflight-sandbox-{self.prefix}", *(h.name for h in self.hosts)])
        client_key = self.identity.with_suffix(".pub").read_text(encoding="utf-8")
        known = []
        for host in self.hosts:
            folder = self._host_dir(host)
            public = (folder / "ssh_host_ed25519_key.pub").read_text(encoding="utf-8").split()
            known.append(f"{host.address},{host.name} {public[0]} {public[1]}\n")
            _write(folder / "authorized_keys", client_key)
            _write(folder / "hosts", self._hosts_file(host))
            _write(folder / "resolv.conf", "# a sandbox host has no name server: every name is in /etc/hosts\n")
            # Its own home's shell rc, not this machine's: every SSH command runs it (bash reads
            # ~/.bashrc when started by sshd), and a development machine's (pyenv, conda) would
            # add its cost to every host.
            _write(folder / "bashrc", _STOCK_BASHRC)
            _write(folder / "sshd_config", self._sshd_config(host))
        _write(self.known_hosts, "".join(known))
        self._build_network()
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder
        for host in self.hosts:
            self._procs[host.name] = _Processes(anchor=self._start_anchor(host))
        self._wait(self.hosts, "anchor", lambda h: (self._host_dir(h) / "ready").exists(), lambda h: self._procs[h.name].anchor)
        for host in self.hosts:
            self._procs[host.name].sshd = self._start_sshd(host)
        self._wait_sshd(self.hosts)

    def _build_network(self) -> None:
        # nf_call_iptables 0: bridged frames skip this machine's FORWARD chain (Docker sets it to DROP).
        # addrgenmode none: no IPv6 link-local chatter; the sandbox speaks 198.18.0.0/15 only.
        root = [f"link add {self.bridge} type bridge nf_call_iptables 0", f"link set {self.bridge} addrgenmode none",
                f"addr add {self.subnet.network_address + 1}/24 dev {self.bridge}", f"link set {self.bridge} up"]
        for host in self.hosts:
            root += [f"netns add {host.netns}", f"link add {host.veth} type veth peer name {host.ifname} netns {host.netns}",
                     f"link set {host.veth} addrgenmode none", f"link set {host.veth} master {self.bridge} up"]
        _ip_batch(root)
        for host in self.hosts:
            _ip_batch(["link set lo up", f"link set {host.ifname} addrgenmode none",
                       f"addr add {host.address}/24 dev {host.ifname}", f"link set {host.ifname} up"], netns=host.netns)

    def _hosts_file(self, me: Host) -> str:
        loopback = " " + me.name if me.quirks.own_name == "loopback" else ""
        lines = [f"# /etc/hosts of sandbox host {me.name}", f"127.0.0.1\tlocalhost{loopback}", "::1\tlocalhost ip6-localhost ip6-loopback"]
        lines += [f"{h.address}\t{h.name}" for h in self.hosts if h is not me or me.quirks.own_name == "address"]
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

    def _host_dir(self, host: Host) -> Path:
        return self.state_dir / "hosts" / host.name

    def _start_anchor(self, host: Host) -> subprocess.Popen[bytes]:
        folder = self._host_dir(host)
        shm = str(host.quirks.shm_bytes) if host.quirks.shm_bytes is not None else ""
        argv = [_tool("ip"), "netns", "exec", host.netns, _tool("unshare"), "--uts", "--mount", "--propagation", "private",
                "sh", "-c", _ANCHOR, "sh", host.name, str(folder / "hosts"), str(folder / "resolv.conf"), shm, str(folder / "ready"),
                str(folder / "bashrc"), os.path.join(pwd.getpwnam("root").pw_dir, ".bashrc")]
        return self._spawn(argv, folder / "anchor.log")

    def _enter(self, host: Host) -> list[str]:
        """The command prefix that runs a program inside the host: its network, hostname and mounts."""
        anchor = self._procs[host.name].anchor.pid
        return [_tool("nsenter"), "--target", str(anchor), "--net", "--uts", "--mount", "--"]

    def _start_sshd(self, host: Host) -> subprocess.Popen[bytes]:
        folder = self._host_dir(host)
        return self._spawn([*self._enter(host), _tool("sshd"), "-D", "-e", "-f", str(folder / "sshd_config")], folder / "sshd.log")

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
        self._wait(hosts, "sshd", lambda h: _port_open(h.address), lambda h: self._procs[h.name].sshd)

    def _save_state(self) -> None:
        state = {"prefix": self.prefix, "index": self.index, "subnet": str(self.subnet), "bridge": self.bridge,
                 "hosts": [asdict(h) for h in self.hosts], "configs": self._configs}
        tmp = self.state_dir / "state.json.tmp"
        _write(tmp, json.dumps(state, indent=2) + "\n", 0o600)
        tmp.replace(self.state_dir / "state.json")

    # --- using -----------------------------------------------------------------------------

    @property
    def identity(self) -> Path:
        """The client's private key, authorized for root on every host."""
        return self.state_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        """known_hosts with every host's key under its address and its name."""
        return self.state_dir / "known_hosts"

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
            "hosts": [{"name": h.name, "address": h.address, "transport": "ssh", "user": "root", "port": 22,
                       "identity": str(self.identity), "python": h.python, "gpus": "0", "interface": h.ifname} for h in self.hosts],
        }
        document = {"cluster": cluster, "ssh": {"known_hosts": str(self.known_hosts)}, "training": {"backend": "gloo"}}
        header = header or f"written by preflight.sandbox (prefix {self.prefix}); removed when that sandbox goes down"
        path.parent.mkdir(parents=True, exist_ok=True)
        self._configs.append(str(path.resolve()))
        self._save_state()
        tmp = path.with_name(path.name + ".tmp")
        _write(tmp, f"# @package _global_\n# {header}\n" + yaml.safe_dump(document, sort_keys=False))
        tmp.replace(path)
        return path

    def run_in(self, name: str, argv: Sequence[str], *, timeout: float = _COMMAND_TIMEOUT_S,
               stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run argv inside host `name` (its network, hostname and mounts); raises subprocess.TimeoutExpired past timeout."""
        return subprocess.run([*self._enter(self.host(name)), *argv], input=stdin, capture_output=True, text=True, timeout=timeout)

    def pids(self, name: str) -> list[int]:
        """The processes living in host `name`'s network namespace, as `ip netns pids` lists them: an idle host has its anchor and sshd."""
        netns = self.host(name).netns
        return _netns_pids([netns])[netns]

    # --- faults: each is undone by heal(name) -------------------------------------------------

    def stop_sshd(self, name: str) -> None:
        """Stop host `name`'s sshd, as `systemctl stop ssh` would: new connections are refused."""
        procs = self._procs[self.host(name).name]
        self._stop(procs.sshd)
        procs.sshd = None

    def blackhole(self, name: str) -> None:
        """Drop every packet arriving on host `name`'s interface: connects to it time out."""
        host = self.host(name)
        if not self._procs[host.name].blackholed:
            _run([_tool("ip"), "netns", "exec", host.netns, _tool("iptables"), "-w", "5", "-I", "INPUT", "-i", host.ifname, "-j", "DROP"])
            self._procs[host.name].blackholed = True

    def deny_auth(self, name: str) -> None:
        """Empty host `name`'s authorized keys: connections get `Permission denied (publickey)`."""
        _write(self._host_dir(self.host(name)) / "authorized_keys", "")

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
        _keygen([key], [f"{host.name}-changed"])
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
        self._wait([host], "listener", lambda h: _port_open(h.address), lambda h: procs.listener)

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
        _write(folder / "authorized_keys", self.identity.with_suffix(".pub").read_text(encoding="utf-8"))
        if procs.blackholed:
            _run([_tool("ip"), "netns", "exec", host.netns, _tool("iptables"), "-w", "5", "-D", "INPUT", "-i", host.ifname, "-j", "DROP"])
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
            proc.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=_STOP_TIMEOUT_S)

    # --- tearing down ----------------------------------------------------------------------

    def down(self) -> list[str]:
        """Remove everything this sandbox made (idempotent); returns what was there."""
        children = [p for procs in self._procs.values() for p in (procs.anchor, procs.sshd, procs.listener) if p is not None]
        removed = _teardown(self.prefix, self._state_root, children)
        self._procs.clear()
        _LIVE.pop(self.prefix, None)  # only now: if teardown failed, atexit tries again
        return removed

    def detach(self) -> None:
        """Leave the sandbox up when this process exits; a later down_prefix removes it."""
        _LIVE.pop(self.prefix, None)

    @staticmethod
    def down_prefix(prefix: str = DEFAULT_PREFIX, *, state_root: Path | str = DEFAULT_STATE_ROOT) -> list[str]:
        """Remove sandbox `prefix`, including the leftovers of a process that was killed; returns what was there."""
        if not _PREFIX.match(prefix):
            raise InputError(f"sandbox: prefix {prefix!r} must be 1 to 8 lowercase letters and digits, starting with a letter")
        live = _LIVE.get(prefix)
        if live is not None and live._state_root == Path(state_root):
            return live.down()
        return _teardown(prefix, Path(state_root))

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.down()


def _validate(n: int, prefix: str, index: int, quirks: Mapping[int, HostQuirks], name_prefix: str) -> None:
    if not 1 <= n <= MAX_HOSTS:
        raise InputError(f"sandbox: the number of hosts must be 1 to {MAX_HOSTS}, not {n}")
    if not _PREFIX.match(prefix):
        raise InputError(f"sandbox: prefix {prefix!r} must be 1 to 8 lowercase letters and digits, starting with a letter")
    if not 0 <= index < SUBNETS.num_addresses // 256:
        raise InputError(f"sandbox: index must be 0 to {SUBNETS.num_addresses // 256 - 1}, not {index}")
    if not _NAME_PREFIX.match(name_prefix):
        raise InputError(f"sandbox: host name prefix {name_prefix!r} must be lowercase letters, digits and '-'")
    for k, q in quirks.items():
        if not 1 <= k <= n:
            raise InputError(f"sandbox: quirks for host {k}, but hosts are 1 to {n}")
        if not _IFNAME.match(q.ifname):
            raise InputError(f"sandbox: interface name {q.ifname!r} of host {k} is not a Linux interface name")
        if q.shm_bytes is not None and q.shm_bytes < 4096:
            raise InputError(f"sandbox: /dev/shm of host {k} must be at least 4096 bytes, not {q.shm_bytes}")
        if q.own_name not in ("address", "missing", "loopback"):
            raise InputError(f"sandbox: own_name of host {k} must be address, missing or loopback, not {q.own_name!r}")


def sandbox_up(n: int) -> str:
    """`preflight sandbox up N`: build n hosts (prefix pf) that stay up, write cluster config `sandbox`; returns a summary."""
    sandbox = Sandbox.up(n)
    try:
        config = sandbox.write_cluster_config(user_config_dir() / "cluster" / "sandbox.yaml", header=CLI_CONFIG_HEADER)
    except BaseException:
        sandbox.down()
        raise
    sandbox.detach()
    last = sandbox.hosts[-1]
    return "\n".join([
        f"sandbox up: {n} host{'s' if n > 1 else ''} {sandbox.master.name}..{last.name} "
        f"({sandbox.master.address}..{last.address}) on bridge {sandbox.bridge}",
        f"cluster config: {config}",
        "check it:  preflight check cluster=sandbox",
        "remove it: preflight sandbox down",
    ])


def sandbox_down() -> str:
    """`preflight sandbox down`: remove everything `sandbox up` made, even after a crash; returns a summary."""
    check_requirements()
    removed = Sandbox.down_prefix(DEFAULT_PREFIX)
    config = user_config_dir() / "cluster" / "sandbox.yaml"
    try:
        ours = config.read_text(encoding="utf-8").splitlines()[1:2] == [f"# {CLI_CONFIG_HEADER}"]
    except OSError:
        ours = False
    if ours:  # outlived its state folder: /run is emptied at boot
        config.unlink()
        removed.append(f"file {config}")
    if not removed:
        return "sandbox down: nothing to remove"
    counts = Counter(item.split()[0] for item in removed)
    plural = {"process": "processes"}
    return "sandbox down: removed " + ", ".join(
        f"{count} {kind if count == 1 else plural.get(kind, kind + 's')}" for kind, count in counts.items()
    )
