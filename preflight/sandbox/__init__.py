"""A test cluster on this machine: N hosts as network namespaces on one Linux bridge (root only).

Layout for prefix ``pf`` and index 0: bridge ``pf-br`` holds 198.18.0.1/24 in this machine's
namespace, so this machine is the controller; host ``hK`` is namespace ``pf-hK`` at 198.18.0.(10+K),
joined to the bridge by veth ``pf-hK-v``. With rails, rail r is bridge ``pf-brR`` on the (index + 1 + r)-th /24,
each host's ``eth(R+1)`` joined to it by veth ``pf-hKrR``; the /24 after the rails is left for a misaddressed rail.
Each host is an *anchor* process (``sleep``) that holds
the host's own UTS and mount namespaces: its hostname, its ``/etc/hosts`` naming every host, its
``/etc/resolv.conf`` with no server, root's own stock ``~/.bashrc``, and optionally a small ``/dev/shm``, mounts of its
own over folders of this machine (a private tmpfs, a read-only bind: HostQuirks.mounts) and a training user of its own
``/etc/passwd`` that the cluster config logs in as (HostQuirks.user). They outlive any sshd
restart, as a real machine's do; its sshd, the silent listener and :meth:`Sandbox.run_in` enter
them with ``nsenter``.

Everything else lives in the state folder (``/run/preflight-sandbox/pf``): the client key,
known_hosts, ``state.json`` and one folder per host (host key, sshd_config, authorized_keys,
hosts, logs). Teardown finds what to remove by name, so it also cleans up after a process that
was killed while its sandbox was up.
"""

from preflight.sandbox.cluster import Sandbox
from preflight.sandbox.commands import CLI_CONFIG_HEADER, sandbox_down, sandbox_up
from preflight.sandbox.layout import (
    DEFAULT_PREFIX,
    DEFAULT_STATE_ROOT,
    MAX_HOSTS,
    MAX_RAILS,
    SUBNETS,
    Host,
    HostMount,
    HostQuirks,
    foreign_address,
    subnet_count,
)
from preflight.sandbox.system import check_requirements
from preflight.sandbox.teardown import leftovers

__all__ = [
    "CLI_CONFIG_HEADER",
    "DEFAULT_PREFIX",
    "DEFAULT_STATE_ROOT",
    "MAX_HOSTS",
    "MAX_RAILS",
    "SUBNETS",
    "Host",
    "HostMount",
    "HostQuirks",
    "Sandbox",
    "check_requirements",
    "foreign_address",
    "leftovers",
    "sandbox_down",
    "sandbox_up",
    "subnet_count",
]
