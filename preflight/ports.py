"""What listens on a host's port: a port that is free there now, and who holds one that is not. The rendezvous port is
the master's, and a port someone else holds would fail the connectivity test and the collective only after their
deadlines, blaming the network."""

from __future__ import annotations

import re
from collections.abc import Sequence

from preflight.gather import host_python
from preflight.spec import HostSpec
from preflight.transport import RemoteCommand, Transport

# A port the kernel calls free on the host, at most argv[1] (so that the collective's ports derived above it stay ports).
_FREE_PORT = ("import socket, sys\nfor _ in range(50):\n    s = socket.socket()\n    s.bind(('', 0))\n    port = s.getsockname()[1]\n"
              "    s.close()\n    if port <= int(sys.argv[1]):\n        print(port)\n        break\n")
# The port argv[1] when it is free on the host (bound as torchrun's store binds it, SO_REUSEADDR), else one the kernel
# calls free; nothing when it cannot tell.
_FREE_OR_ANOTHER = r"""
import errno, socket, sys
port = int(sys.argv[1])
with socket.socket() as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("", port))
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            sys.exit(0)
        s.close()
        with socket.socket() as other:
            other.bind(("", 0))
            port = other.getsockname()[1]
print(port)
"""
# Where the picked rendezvous port may be at most, unless its derived ports need it lower.
HIGHEST_PICKED_PORT = 64000
# Prints who already listens on the port argv[1] ("PID COMMAND LINE", or "?" for a process it cannot see), nothing when
# the port is free (or cannot be told: torchrun then says why).
_PORT_HOLDER = r"""
import errno, os, socket, sys
port = int(sys.argv[1])
with socket.socket() as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("", port))
        sys.exit(0)
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            sys.exit(0)
listening = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        with open(table) as f:
            rows = [line.split() for line in f.read().splitlines()[1:]]
    except OSError:
        continue
    listening |= {"socket:[%s]" % r[9] for r in rows if r[3] == "0A" and int(r[1].rsplit(":", 1)[1], 16) == port}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if any(os.readlink("/proc/%s/fd/%s" % (pid, fd)) in listening for fd in os.listdir("/proc/%s/fd" % pid)):
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                print(pid, f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:500])
            sys.exit(0)
    except OSError:
        continue
print("?")
"""
_RDZV_ID = re.compile(r"--rdzv[-_]id[= ](preflight-[0-9a-f]+)")


def free_port(transport: Transport, host: HostSpec, timeout_s: float, highest: int = HIGHEST_PICKED_PORT) -> int | None:
    """A port that is free on host now, at most highest; None when none could be found."""
    argv = [host_python(host), "-c", _FREE_PORT, str(highest)]
    (result,) = transport.run([RemoteCommand(host=host, argv=argv, timeout_s=timeout_s)])
    text = result.stdout.strip()
    return int(text) if result.ok and text.isdigit() else None


def free_or_another(transport: Transport, wanted: Sequence[tuple[HostSpec, int]], timeout_s: float) -> list[int]:
    """For each (host, port) at once: the port when it is free on the host (or that cannot be told), else another port
    free there now. A derived port someone holds would fail a healthy group, which the splitting then blames."""
    commands = [RemoteCommand(host=host, argv=[host_python(host), "-c", _FREE_OR_ANOTHER, str(port)], timeout_s=timeout_s)
                for host, port in wanted]
    chosen = []
    for (_, port), result in zip(wanted, transport.run(commands, all_at_once=True), strict=True):
        text = result.stdout.strip()
        chosen.append(int(text) if result.ok and text.isdigit() else port)
    return chosen


def port_holder(transport: Transport, host: HostSpec, port: int, timeout_s: float) -> str | None:
    """Who already listens on port on host, in words; None when the port is free (or it cannot be told)."""
    (result,) = transport.run([RemoteCommand(host=host, argv=[host_python(host), "-c", _PORT_HOLDER, str(port)], timeout_s=timeout_s)])
    answer = result.stdout.strip()
    if not result.ok or not answer:
        return None
    pid, _, command = answer.partition(" ")
    launch = _RDZV_ID.search(command)
    if launch and "torch.distributed.run" in command:
        return f"another preflight check (the torchrun of its launch {launch.group(1)}, pid {pid})"
    if '"is_master":true' in command and '"loss_peers"' in command:
        return f"another preflight check (its connectivity test, pid {pid})"
    return f"pid {pid} ({command[:120]})" if command else "a process preflight cannot see (another user's)"
