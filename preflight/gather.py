"""The facts stage: send the probe to every host, read back validated facts.

A host that cannot be probed is not an error of the run: it becomes an ``unknown`` finding
(PF001 unreachable, PF002 probe failed) and every other host keeps its result.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import jsonschema

from preflight import bundle
from preflight.errors import last_line
from preflight.findings import Finding, Status
from preflight.records import HostOutcome, HostRecord
from preflight.resources import validator
from preflight.spec import HostSpec, PreflightConfig, SshConfig, TransportKind
from preflight.transport import RemoteCommand, Transport
from preflight.transport.base import CommandResult

Output = TypeVar("Output")


def probe_source() -> str:
    """The probe's bundle, sent to each host on stdin: the first script a host runs, so it says when its python is too old."""
    return bundle.version_gated(bundle.FACTS)


def host_python(host: HostSpec) -> str:
    """The training environment's python on a host; ``auto`` is this python here, python3 there."""
    if host.python != "auto":
        return host.python
    return sys.executable if host.transport == TransportKind.local else "python3"


def probe_timeout_s(config: PreflightConfig) -> float:
    """Each probe's deadline: ssh.command_timeout_s, or the playbook's deadline_s when shorter."""
    deadline = config.playbook.deadline_s
    return min(config.ssh.command_timeout_s, deadline) if deadline else config.ssh.command_timeout_s


def run_ssh_config(config: PreflightConfig) -> SshConfig:
    """The SSH settings of a run, its whole-run deadline shortened to the playbook's deadline_s."""
    deadline = config.playbook.deadline_s
    return replace(config.ssh, run_timeout_s=min(config.ssh.run_timeout_s, deadline)) if deadline else config.ssh


def probe_command(host: HostSpec, config: PreflightConfig) -> RemoteCommand:
    """The probe, to run with the host's training python."""
    return RemoteCommand(host=host, argv=[host_python(host), "-"], stdin=probe_source(), timeout_s=probe_timeout_s(config))


def probe_commands(config: PreflightConfig) -> list[RemoteCommand]:
    """One probe command per host of the cluster."""
    return [probe_command(host, config) for host in config.cluster.hosts]


def _unknown(host: HostSpec, code: str, message: str, remedy: str) -> HostOutcome:
    return HostOutcome(host=host, record=None, problem=Finding(code, Status.unknown, host.name, message, remedy))


def read_facts(host: HostSpec, result: CommandResult) -> HostOutcome:
    """Turn one probe result into a checked record, or an unknown finding saying why not."""
    if not result.reached:
        return _unknown(host, "PF001", f"not checked: {result.reason}",
                        "check that the host is up and reachable over SSH (address, port, key, known_hosts)")
    if result.exit_code != 0:
        detail = last_line(result.stderr) or f"exit status {result.exit_code}"
        return _unknown(host, "PF002", f"the probe failed with {host_python(host)}: {detail}",
                        "check the host's `python` in the cluster config (it must be the training environment's)")
    try:
        facts: Any = json.loads(result.stdout)
        validator("facts").validate(facts)
    except json.JSONDecodeError as e:
        return _unknown(host, "PF002", f"the probe printed no JSON: {e.msg}",
                        "run the probe by hand: python3 -m preflight.bundle facts | python3 -")
    except jsonschema.ValidationError as e:
        where = "/".join(str(p) for p in e.absolute_path)
        return _unknown(host, "PF002", f"the probe's facts are malformed at {where}: {e.message}",
                        "use the probe of the same preflight version")
    # The host's clock was read between sending and receiving: its offset lies in this interval.
    started = facts["probe"]["started_unix_s"]
    offset = (started - result.received_unix_s, started - result.sent_unix_s) if result.sent_unix_s else None
    return HostOutcome(host=host, record=HostRecord(host=host, facts=facts, clock_offset_s=offset), problem=None)


def gather_facts(config: PreflightConfig, transport: Transport) -> list[HostOutcome]:
    """Probe every host through the transport; one outcome per host, in config order."""
    commands = probe_commands(config)
    results: Sequence[CommandResult] = transport.run(commands)
    return [read_facts(command.host, result) for command, result in zip(commands, results, strict=True)]


def outputs_by_host(transport: Transport, commands: Sequence[RemoteCommand],
                    parse: Callable[[CommandResult], Output]) -> tuple[dict[str, Output], dict[str, str]]:
    """A shipped script's commands run on their hosts all at once: each host's parsed output, or why there is none (the
    command failed, or parse raised ValueError)."""
    outputs: dict[str, Output] = {}
    problems: dict[str, str] = {}
    for command, result in zip(commands, transport.run(commands, all_at_once=True), strict=True):
        host = command.host.name
        if not result.ok:
            problems[host] = result.reason or last_line(result.stderr) or f"exit status {result.exit_code}"
            continue
        try:
            outputs[host] = parse(result)
        except ValueError as e:
            problems[host] = str(e)
    return outputs, problems
