"""This machine as its host in the cluster config, and its probe: what `gate` and `agent` share.

Both check the machine they run on, without SSH: the probe starts as a child process before Hydra composes the config
(the two take about as long), and the host is the cluster's entry whose name or address is this machine's.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from preflight.errors import InputError
from preflight.facts import HostFacts
from preflight.records import ipv4_addresses
from preflight.spec import HostSpec, PreflightConfig, TransportKind

if TYPE_CHECKING:
    from preflight.compose import Spec
    from preflight.transport.base import CommandResult


def _names_of_this_machine(facts: HostFacts) -> set[str]:
    host = facts["host"]
    names = {host["hostname"], host["hostname"].split(".")[0], host["fqdn"]}
    return names | ipv4_addresses(facts)


def named_host(config: PreflightConfig, name: str) -> HostSpec:
    """The host of the cluster config called name (--host NAME)."""
    chosen = config.cluster.host(name)
    if chosen is None:
        raise InputError(f"gate --host: {name!r} is not a host of cluster {config.cluster.name} "
                         f"(hosts: {', '.join(h.name for h in config.cluster.hosts)})")
    return chosen


def this_host(config: PreflightConfig, facts: HostFacts | None) -> HostSpec:
    """The cluster's entry for this machine: the host whose name or address is this machine's.

    Without facts (the probe failed) only a cluster of one host names it; otherwise the host is
    this machine's hostname with the cluster's defaults, so that the failure is still reported.
    """
    hosts = config.cluster.hosts
    if facts is None:
        return hosts[0] if len(hosts) == 1 else HostSpec(name=socket.gethostname(), address="127.0.0.1")
    mine = _names_of_this_machine(facts)
    matches = [h for h in hosts if h.name in mine or h.address in mine]
    if len(matches) == 1:
        return matches[0]
    if not matches and len(hosts) == 1 and hosts[0].transport == TransportKind.local:
        return hosts[0]
    which = "several hosts" if matches else "no host"
    raise InputError(f"gate: this machine ({facts['host']['hostname']}) matches {which} of cluster {config.cluster.name} "
                     "by name or address; give --host NAME")


def compose_while_probing(overrides: Sequence[str], config_dir: str | None, env: Mapping[str, str] | None = None,
                          accept: Callable[[Spec], None] | None = None) -> tuple[Spec, CommandResult]:
    """The Spec, and this machine's probe with this python, started before composing: the two take about as long."""
    from preflight.compose import load_spec
    from preflight.gather import probe_source, probe_timeout_s
    from preflight.transport.local import finish_local, start_local, stop_local

    early = start_local([sys.executable, "-"], probe_source(), env)
    try:
        spec = load_spec(overrides, config_dir)
        if accept is not None:
            accept(spec)
    except BaseException:
        stop_local(early)
        raise
    return spec, finish_local(early, "localhost", probe_timeout_s(spec.config))


def probe_as_host(spec: Spec, result: CommandResult, host_name: str | None,
                  env: Mapping[str, str] | None = None) -> tuple[HostSpec, CommandResult]:
    """This machine's host in the config (--host, else by name or address) and its probe with that host's python."""
    from preflight.gather import host_python, probe_command, read_facts
    from preflight.transport.local import run_local

    if host_name is not None:
        host = named_host(spec.config, host_name)
    else:
        first_look = read_facts(HostSpec(name="localhost", address="127.0.0.1", transport=TransportKind.local), result)
        host = this_host(spec.config, first_look.record.facts if first_look.record else None)
    # Probed here, not over SSH: "auto" is this python, the training environment's.
    host = replace(host, transport=TransportKind.local)
    if host_python(host) != sys.executable:
        # The host's training python is another one: its facts (torch, NCCL) are the ones that count.
        result = run_local(probe_command(host, spec.config), env)
    return host, result
