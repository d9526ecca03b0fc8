"""The connectivity stage: the mesh test (preflight/connectivity/mesh, one file on a host) run on every host at once over the transport,
on the addresses and interfaces the launch will use (with rails, rail r of every host to its peers' rail r, every rail
at once in one process per host), then judged. It takes seconds; the pipeline runs no torchrun after
it fails."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Any, cast

from preflight import bundle
from preflight.checks.rails import rail_label
from preflight.connectivity.contracts import ConnectivitySection
from preflight.connectivity.judge import MeshRun, RailEnd, judge_mesh
from preflight.connectivity.plan import plan_mesh
from preflight.connectivity.wire import MeshConfig, MeshOutput, Network
from preflight.findings import CLUSTER, Finding, Status
from preflight.gather import host_python, outputs_by_host
from preflight.interrupt import Activity, hosts_phrase
from preflight.launch import host_address
from preflight.ports import free_port, port_holder
from preflight.records import HostRecord, configured_interface_name, find_interface, host_rails, rails_declared
from preflight.spec import PreflightConfig
from preflight.stages import StageContext, StageResult
from preflight.transport import CommandResult, RemoteCommand, Transport

# python's start on a busy host and the SSH channel, beyond the mesh test's own deadline.
TRANSPORT_ALLOWANCE_S = 15.0
# After the join, what the test itself needs besides the configured windows: the MTU rounds (1.2 s where a size is
# black-holed, for the interface's MTU and for each of the search's three phases), the connects, the goodbyes.
_AFTER_JOIN_S = 6.5


def mesh_source() -> str:
    """The mesh test's bundle, sent to each host on stdin."""
    return bundle.text(bundle.MESH)


def _total_s(config: PreflightConfig) -> float:
    c = config.connectivity
    return c.join_timeout_s + c.connect_timeout_s + c.loss_window_s + c.echo_grace_s + _AFTER_JOIN_S


def _skipped(config: PreflightConfig, hosts: list[str], message: str) -> ConnectivitySection:
    return {"status": "skipped", "message": message, "master": None, "port": config.network.master_port, "hosts": hosts, "mode": "full",
            "tcp_tested": 0, "tcp_failed": [], "mtu_tested": 0, "mtu_failed": [], "loss_tested": 0, "loss_failed": [],
            "loss_max_percent": None, "rtt_median_ms": None, "elapsed_s": 0.0}


def _rails(record: HostRecord, config: PreflightConfig) -> tuple[list[Network], dict[int, RailEnd]]:
    """The host's rails it can test from (up, with an address: PF306 names the others), and every rail's end as the
    judge names it."""
    networks: list[Network] = []
    ends = {}
    for rail in host_rails(record.host, record.facts, config):
        interface = find_interface(record.facts, rail.interface)
        mtu = interface["mtu"] if interface else None
        ends[rail.index] = RailEnd(rail_label(rail), rail.interface, mtu)
        if interface is not None and interface["ipv4"] and interface["operstate"] in ("up", "unknown"):
            networks.append({"rail": rail.index, "address": interface["ipv4"][0].split("/")[0],
                             "mtu": mtu if config.connectivity.mtu_probe else None})
    return networks, ends


def _parse(result: CommandResult) -> MeshOutput:
    """The mesh test's one JSON line, its last; ValueError when it is not one."""
    lines = result.stdout.strip().splitlines()
    if not lines:
        raise ValueError("the mesh test printed no result")
    data: Any = json.loads(lines[-1])  # raw JSON from a host, checked for the keys the judge reads
    if not isinstance(data, dict) or not all(k in data for k in ("host", "address", "serving", "registry", "tcp", "loss", "mtu")):
        raise ValueError("the mesh test printed an incomplete result")
    return cast(MeshOutput, data)


def run_connectivity_stage(config: PreflightConfig, transport: Transport, records: Sequence[HostRecord],
                           activity: Activity | None = None) -> tuple[list[Finding], ConnectivitySection]:
    """Run the mesh test across the reached hosts (the master first) and judge it."""
    began = time.monotonic()
    master = config.cluster.master
    ordered = sorted(records, key=lambda r: r.host.name != master)
    names = [r.host.name for r in ordered]
    if not ordered or ordered[0].host.name != master:
        message = "the master could not be checked: no connectivity test"
        return [Finding("PF609", Status.unknown, CLUSTER, message, "fix the master host first")], _skipped(config, names, message)
    findings: list[Finding] = []
    endpoints: dict[str, tuple[HostRecord, str, int | None]] = {}
    for record in ordered:
        ifname = configured_interface_name(record.host, config)
        address, chosen = host_address(record.facts, record.host.address, ifname)
        if address is None:
            findings.append(Finding("PF609", Status.fail, record.host.name, f"{record.host.name} has no IPv4 address to test from",
                                    "give the host an IPv4 address on the job's interface"))
            continue
        interface = find_interface(record.facts, chosen) if chosen else None
        endpoints[record.host.name] = (record, address, interface["mtu"] if interface else None)
    if master not in endpoints:
        return findings, _skipped(config, names, "the master has no IPv4 address: no connectivity test")
    if activity:
        activity.now("connectivity", f"the connectivity test on {hosts_phrase(len(endpoints))}")
    port = config.network.master_port or free_port(transport, endpoints[master][0].host, config.ssh.command_timeout_s)
    if not port:
        message = f"no free port found on {master} for the rendezvous test"
        return [*findings, Finding("PF609", Status.unknown, master, message, "set network.master_port")], _skipped(config, names, message)
    # A port someone holds would fail every host's registration: the collective stage names the holder and stops.
    holder = port_holder(transport, endpoints[master][0].host, port, config.ssh.command_timeout_s) if config.network.master_port else None
    if holder is not None:
        return findings, _skipped(config, names, f"the rendezvous port {master}:{port} is in use by {holder}, so it could not be tested")
    plan = plan_mesh(list(endpoints), config.connectivity, config.collective.seed)
    nonce = f"preflight-mesh-{uuid.uuid4().hex[:12]}"
    c = config.connectivity
    commands = []
    # With rails, the job's interface carries the rendezvous alone: each rank's traffic crosses its own rail.
    rails = {name: _rails(record, config) for name, (record, _, _) in endpoints.items()} if rails_declared(config) else {}
    for name, (record, address, mtu) in endpoints.items():
        networks: list[Network] = rails[name][0] if rails else [{"rail": None, "address": address, "mtu": mtu if c.mtu_probe else None}]
        mesh_config: MeshConfig = {
            "host": name, "address": address, "networks": networks, "is_master": name == master,
            "master": {"host": master, "address": endpoints[master][1], "port": port}, "expected": len(endpoints), "nonce": nonce,
            "tcp_peers": plan.tcp_peers[name], "loss_peers": plan.loss_peers[name], "join_s": c.join_timeout_s,
            "connect_s": c.connect_timeout_s, "total_s": _total_s(config), "loss_probes": c.loss_probes,
            "loss_window_s": c.loss_window_s, "echo_grace_s": c.echo_grace_s}
        argv = [host_python(record.host), "-", json.dumps(mesh_config, separators=(",", ":"))]
        commands.append(RemoteCommand(host=record.host, argv=argv, stdin=mesh_source(), timeout_s=_total_s(config) + TRANSPORT_ALLOWANCE_S))
    outputs, problems = outputs_by_host(transport, commands, _parse)
    run = MeshRun(plan=plan, master=master, port=port, mtu={n: e[2] for n, e in endpoints.items()}, outputs=outputs, problems=problems,
                  elapsed_s=time.monotonic() - began, rails={name: ends for name, (_, ends) in rails.items()})
    more, section = judge_mesh(run, config.connectivity)
    return findings + more, section


class ConnectivityStage:
    """The mesh test between the reached hosts (PF609-PF612); the collective reads its section."""

    name = "connectivity"
    codes = ("PF609", "PF610", "PF611", "PF612")
    needs_records = True
    reads: tuple[str, ...] = ()

    def run(self, context: StageContext) -> StageResult[ConnectivitySection]:
        findings, section = run_connectivity_stage(context.config, context.transport, context.records, context.activity)
        return StageResult(findings, section)


    def text(self, section: ConnectivitySection) -> list[Any]:
        from preflight.connectivity.render import text
        return text(section)

    def html(self, section: ConnectivitySection) -> str:
        from preflight.connectivity.render import html
        return html(section)

STAGE = ConnectivityStage()
