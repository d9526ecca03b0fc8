"""This machine's tools for a sandbox: finding and running them, and the files and keys they make."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

from preflight.errors import EnvironmentProblem

_TOOL_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])
COMMAND_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
# The bound on a whole teardown (kill, reap, delete, confirm), whatever the sandbox's size: 128 hosts go in about 3 s on
# a 2-core VM; the rest is room for a kernel that is busy freeing other namespaces.
TEARDOWN_TIMEOUT_S = 60.0

_PACKAGES = {
    "ip": "iproute2",
    "sshd": "openssh-server",
    "ssh-keygen": "openssh-client",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "prlimit": "util-linux",
    "iptables": "iptables",
    "tc": "iproute2",
}


def tool(name: str) -> str:
    """The path of tool `name`; EnvironmentProblem, naming its Debian package, when it is not installed."""
    found = shutil.which(name, path=_TOOL_PATH)
    if found is None:
        raise EnvironmentProblem(f"sandbox: `{name}` is not installed (Debian: apt-get install {_PACKAGES[name]})")
    return found


def check_requirements() -> None:
    """Raise EnvironmentProblem unless this machine can build a sandbox: root, ip, sshd, unshare, nsenter, prlimit,
    ssh-keygen."""
    if os.geteuid() != 0:
        raise EnvironmentProblem("sandbox: network namespaces need root; run it as root (sudo)")
    for name in ("ip", "sshd", "unshare", "nsenter", "prlimit", "ssh-keygen"):
        tool(name)
    # Root is not enough in an unprivileged container: try what every host needs.
    try:
        run([tool("unshare"), "--net", "--uts", "--mount", "true"])
    except EnvironmentProblem as e:
        raise EnvironmentProblem(f"{e} (namespaces are not allowed here; a container needs --privileged)") from None


def run(argv: Sequence[str], *, stdin: str | None = None, timeout: float = COMMAND_TIMEOUT_S) -> str:
    """argv's stdout; EnvironmentProblem, with its last line of stderr, when it fails or outlives timeout."""
    try:
        result = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise EnvironmentProblem(f"sandbox: `{shlex.join(argv)}` did not finish within {timeout:g} s") from e
    if result.returncode != 0:
        detail = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[-1]
        raise EnvironmentProblem(f"sandbox: `{shlex.join(argv)}` failed: {detail}")
    return result.stdout


def ip_batch(commands: Sequence[str], *, netns: str | None = None, force: bool = False,
             timeout: float = COMMAND_TIMEOUT_S) -> None:
    """Many ip commands in one process: a 32-host sandbox needs ~200 of them."""
    argv = [tool("ip"), *(["-n", netns] if netns else []), *(["-force"] if force else []), "-batch", "-"]
    if force:
        # Teardown wants every line tried, whatever failed before it.
        subprocess.run(argv, input="\n".join(commands) + "\n", capture_output=True, text=True, timeout=timeout)
    else:
        run(argv, stdin="\n".join(commands) + "\n", timeout=timeout)


# The kernel's neighbour (ARP) table is one for every network namespace, with one limit for them all (gc_thresh3, 1024 by
# default); a real host holds only its own peers. Every host of a sandbox that reaches every other needs n*(n-1) entries.
_NEIGHBOUR_LIMITS = Path("/proc/sys/net/ipv4/neigh/default")


def room_for_neighbours(hosts: int) -> None:
    """Raise (never lower) the kernel's neighbour table limits so that `hosts` hosts can each reach every other."""
    wanted = {"gc_thresh1": hosts * hosts // 2, "gc_thresh2": hosts * hosts, "gc_thresh3": 2 * hosts * hosts + 1024}
    for name, value in wanted.items():
        path = _NEIGHBOUR_LIMITS / name
        try:
            if int(path.read_text(encoding="utf-8")) < value:
                path.write_text(str(value), encoding="utf-8")
        except (OSError, ValueError) as e:
            raise EnvironmentProblem(f"sandbox: cannot raise {path} to {value} for {hosts} hosts: {e}") from None


def write(path: Path, text: str, mode: int = 0o644) -> None:
    """Write text to path and give it mode."""
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)


def keygen(paths: Sequence[Path], comments: Sequence[str]) -> None:
    """ed25519 keys, generated in parallel."""
    keygen = tool("ssh-keygen")
    procs = [
        subprocess.Popen([keygen, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for path, comment in zip(paths, comments, strict=True)
    ]
    errors = []
    try:
        for proc in procs:
            try:
                _, err = proc.communicate(timeout=COMMAND_TIMEOUT_S)
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


def port_open(address: str, port: int = 22) -> bool:
    """Whether a TCP connection to address:port succeeds within half a second."""
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False
