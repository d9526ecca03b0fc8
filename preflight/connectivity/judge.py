"""The connectivity test's verdict: every host's mesh output, read into findings that name the exact host, port, pair
or size, and the report's connectivity section. Pure: no I/O.

A fault is pinned on a host when it explains every failure it touches: a destination that no tester reached holds the
filter (PF610 on it), a source that reached no one has the broken way out, a host whose every loss path loses is the
lossy one, a host whose datagrams at its own MTU reach no peer is the jumbo-frame host behind a smaller path. What no
host explains is named as the path itself (source -> destination:port).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from preflight.connectivity.plan import MeshPlan
from preflight.contracts import ConnectivitySection, LossPath, MtuPath, PathResult, TcpPath
from preflight.findings import CLUSTER, Finding, Status
from preflight.mesh_wire import MeshOutput
from preflight.spec import ConnectivityConfig

# Past this many paths a code's findings name the hosts and count the rest: the report lists every failing path.
NAMED_PATHS = 12
CAUSES: dict[str, str] = {
    "filtered": "a firewall DROP rule (iptables, a security group) on the destination or the path",
    "refused": "a TCP RST although the port listens: a firewall REJECT rule",
    "no-route": "an ICMP unreachable: a wrong interface or subnet, or a REJECT rule",
    "error": "the connect failed",
}


@dataclass(frozen=True)
class MeshRun:
    """What the stage ran: the plan, the master's rendezvous port, each host's output or why there is none."""

    plan: MeshPlan
    master: str
    port: int
    mtu: Mapping[str, int | None]  # each host's interface MTU, as its facts say
    outputs: Mapping[str, MeshOutput]
    problems: Mapping[str, str]  # host -> why the test could not run there
    elapsed_s: float


def _names(hosts: Iterable[str]) -> str:
    hosts = list(hosts)
    return ", ".join(hosts[:8]) + (f" and {len(hosts) - 8} more" if len(hosts) > 8 else "")


def _rendezvous(run: MeshRun) -> tuple[list[Finding], list[TcpPath]]:
    """PF609: every host's registration at the master's rendezvous port."""
    master = run.outputs[run.master]
    address = master["address"]
    failed: list[TcpPath] = []
    for name, out in run.outputs.items():
        answer = out["registry"]
        if answer is not None and answer["result"] != "ok":
            failed.append({"source": name, "destination": run.master, "address": address, "port": run.port, "rendezvous": True,
                           "result": cast(PathResult, answer["result"]), "detail": answer["detail"]})
    tried = [n for n, o in run.outputs.items() if o["registry"] is not None]
    where = f"{run.master}:{run.port}"
    if not failed:
        return [Finding("PF609", Status.passed, CLUSTER, f"every host ({len(tried)}) reached the rendezvous port {where}")], failed
    if len(failed) == len(tried) and len({f["result"] for f in failed}) == 1:
        kind = failed[0]["result"]
        state = {"filtered": "is filtered", "refused": "refuses connections", "no-route": "has no route from any host"}.get(kind, "fails")
        return [Finding("PF609", Status.fail, run.master,
                        f"the rendezvous port {where} {state}: none of the {len(tried)} hosts got through ({failed[0]['detail']}); "
                        f"{CAUSES.get(kind, '')}",
                        f"open TCP port {run.port} on {run.master} to every host of the job (or set network.master_port to one "
                        "that is open)")], failed
    return [Finding("PF609", Status.fail, f["source"],
                    f"{f['source']} -> {where}: {f['result']} ({f['detail']}); {CAUSES.get(f['result'], '')}",
                    f"open TCP port {run.port} on {run.master} to {f['source']}, and check its route to {address}")
            for f in failed], failed


def _mesh(run: MeshRun) -> tuple[list[Finding], list[TcpPath], int]:
    """PF610: every host's connects to its peers' listeners."""
    failed: list[TcpPath] = []
    tested = 0
    for name, out in run.outputs.items():
        for row in out["tcp"]:
            tested += 1
            if row["result"] != "ok":
                failed.append({"source": name, "destination": row["peer"], "address": row["address"], "port": row["port"],
                               "rendezvous": False, "result": cast(PathResult, row["result"]), "detail": row["detail"]})
    if not failed:
        scope = "every pair" if run.plan.mode == "full" else "a sample of pairs"
        passed = [Finding("PF610", Status.passed, CLUSTER, f"all {tested} TCP paths between hosts open ({scope})")]
        return passed if tested else [], failed, tested
    findings: list[Finding] = []
    explained: set[int] = set()
    by_destination: dict[str, list[int]] = {}
    by_source: dict[str, list[int]] = {}
    for index, path in enumerate(failed):
        by_destination.setdefault(path["destination"], []).append(index)
        by_source.setdefault(path["source"], []).append(index)
    for host, indices in sorted(by_destination.items()):
        testers = [n for n in run.outputs if host in [r["peer"] for r in run.outputs[n]["tcp"]]]
        if len(indices) == len(testers) >= 2:
            first = failed[indices[0]]
            sources = _names(failed[i]["source"] for i in indices)
            findings.append(Finding(
                "PF610", Status.fail, host,
                f"{host}'s mesh port {first['port']} answers no host: {first['result']} from {sources} "
                f"({first['detail']}); gloo and NCCL open a full mesh of TCP connections between hosts on ephemeral ports, so a "
                "firewall that admits only known ports hangs init",
                f"on {host}, accept TCP from the job's hosts on the ephemeral range (/proc/sys/net/ipv4/ip_local_port_range), "
                "or on the whole job interface"))
            explained.update(indices)
    for host, indices in sorted(by_source.items()):
        targets = len(run.outputs[host]["tcp"])
        if len(indices) == targets >= 2 and not explained.issuperset(indices):
            findings.append(Finding(
                "PF610", Status.fail, host,
                f"{host} reaches none of its {targets} peers over TCP ({failed[indices[0]]['result']}: {failed[indices[0]]['detail']})",
                f"check {host}'s outbound firewall rules and its route on the job's interface"))
            explained.update(indices)
    rest = [failed[i] for i in range(len(failed)) if i not in explained]
    for path in rest[:NAMED_PATHS]:
        findings.append(Finding("PF610", Status.fail, path["source"],
                                f"{path['source']} -> {path['destination']}:{path['port']} {path['result']} ({path['detail']}); "
                                f"{CAUSES.get(path['result'], '')}",
                                f"open TCP between {path['source']} and {path['destination']} on the job's interface"))
    if len(rest) > NAMED_PATHS:
        findings.append(Finding("PF610", Status.fail, CLUSTER, f"and {len(rest) - NAMED_PATHS} more TCP paths failed: "
                                "the report's connectivity.tcp_failed lists them", "see the paths named"))
    return findings, failed, tested


def _mtu(run: MeshRun) -> tuple[list[Finding], list[MtuPath], int]:
    """PF611: do-not-fragment datagrams at the source interface's MTU."""
    failed: list[MtuPath] = []
    tested = 0
    sources: dict[str, int] = {}
    for name, out in run.outputs.items():
        for row in out["mtu"]:
            if not row["sizes"] or not row["passed"]:
                continue  # no size passed at all: UDP is blocked or lost on this path; PF612 says so
            tested += 1
            sources[name] = sources.get(name, 0) + 1
            if row["sizes"][0] not in row["passed"]:
                failed.append({"source": name, "destination": row["peer"], "mtu": row["sizes"][0], "largest_passed": max(row["passed"])})
    if not failed:
        sizes = sorted({m for m in run.mtu.values() if m})
        shown = "/".join(str(s) for s in sizes) or "?"
        return ([Finding("PF611", Status.passed, CLUSTER, f"do-not-fragment datagrams at each interface's MTU ({shown} B) passed on "
                         f"all {tested} paths")] if tested else []), failed, tested
    findings: list[Finding] = []
    by_source: dict[str, list[MtuPath]] = {}
    for path in failed:
        by_source.setdefault(path["source"], []).append(path)
    for host, paths in sorted(by_source.items()):
        largest = max((p["largest_passed"] or 0) for p in paths)
        every = len(paths) == sources.get(host, 0) and len(paths) >= 2
        whom = f"any of its {len(paths)} peers" if every else _names(p["destination"] for p in paths)
        findings.append(Finding(
            "PF611", Status.fail, host,
            f"{host}'s interface claims MTU {paths[0]['mtu']}, but its path to {whom} carries at most {largest} B: do-not-fragment "
            f"datagrams of {paths[0]['mtu']} B got no answer while {largest} B did (a path-MTU blackhole: large messages hang, "
            "small ones pass)",
            f"set {host}'s MTU to what the switches carry ({largest}), or enable jumbo frames on every hop between the hosts"))
    return findings, failed, tested


def _loss(run: MeshRun, config: ConnectivityConfig) -> tuple[list[Finding], list[LossPath], int, float | None, float | None]:
    """PF612: small datagrams echoed, per path."""
    paths: list[LossPath] = []
    blocked: list[tuple[str, str]] = []
    rtts: list[float] = []
    for name, out in run.outputs.items():
        for row in out["loss"]:
            if not row["sent"]:
                continue
            if not row["echoed"]:
                blocked.append((name, row["peer"]))
                continue
            loss = round(100.0 * (row["sent"] - row["echoed"]) / row["sent"], 1)
            paths.append({"source": name, "destination": row["peer"], "sent": row["sent"], "echoed": row["echoed"],
                          "loss_percent": loss, "rtt_ms": row["rtt_ms"]})
            if row["rtt_ms"] is not None:
                rtts.append(row["rtt_ms"])
    worst = max((p["loss_percent"] for p in paths), default=None)
    median_rtt = round(statistics.median(rtts), 3) if rtts else None
    lossy = [p for p in paths if p["loss_percent"] > config.max_loss_percent]
    findings: list[Finding] = []
    if blocked:
        findings.append(Finding("PF612", Status.warn, CLUSTER,
                                f"no UDP datagram came back on {len(blocked)} path(s) ({_names(f'{s} -> {d}' for s, d in blocked)}): UDP "
                                "is blocked there, so loss and path MTU were not measured on them",
                                "allow UDP between the job's hosts on their interface, or take the TCP results alone"))
    if not lossy:
        if paths:
            findings.append(Finding("PF612", Status.passed, CLUSTER,
                                    f"packet loss at most {worst}% on {len(paths)} paths (threshold {config.max_loss_percent}%), "
                                    f"median round trip {median_rtt} ms"))
        return findings, lossy, len(paths), worst, median_rtt
    involved: dict[str, list[LossPath]] = {}
    for path in paths:
        for host in (path["source"], path["destination"]):
            involved.setdefault(host, []).append(path)
    explained: set[int] = set()
    for host, own in sorted(involved.items()):
        if len(own) >= 2 and all(p["loss_percent"] > config.max_loss_percent for p in own):
            # Every path that touches the host loses while the others' paths do not: the host (its NIC, cable, port).
            median = statistics.median(p["loss_percent"] for p in own)
            findings.append(Finding("PF612", Status.fail, host,
                                    f"{host} loses {median:g}% of packets (median of its {len(own)} paths; others lose "
                                    f"{_others_median(paths, host)}%; threshold {config.max_loss_percent}%)",
                                    f"check {host}'s NIC, cable and switch port counters (ethtool -S, ip -s link); NCCL over a lossy "
                                    "link slows to a crawl or times out"))
            explained.update(id(p) for p in own)
    for path in [p for p in lossy if id(p) not in explained][:NAMED_PATHS]:
        findings.append(Finding("PF612", Status.fail, path["source"],
                                f"{path['source']} -> {path['destination']} loses {path['loss_percent']:g}% of packets "
                                f"({path['sent'] - path['echoed']} of {path['sent']}; threshold {config.max_loss_percent}%)",
                                "check the NICs, cables and switch ports between the two hosts"))
    return findings, lossy, len(paths), worst, median_rtt


def _others_median(paths: Sequence[LossPath], host: str) -> float:
    rest = [p["loss_percent"] for p in paths if host not in (p["source"], p["destination"])]
    return round(statistics.median(rest), 1) if rest else 0.0


def judge_mesh(run: MeshRun, config: ConnectivityConfig) -> tuple[list[Finding], ConnectivitySection]:
    """Findings and the report section of one connectivity test."""
    section: ConnectivitySection = {
        "status": "pass", "message": "", "master": run.master, "port": run.port, "hosts": run.plan.hosts, "mode": run.plan.mode,
        "tcp_tested": 0, "tcp_failed": [], "mtu_tested": 0, "mtu_failed": [], "loss_tested": 0, "loss_failed": [],
        "loss_max_percent": None, "rtt_median_ms": None, "elapsed_s": round(run.elapsed_s, 3)}
    findings = [Finding("PF609", Status.unknown, name, f"the connectivity test could not run on {name}: {why}",
                        "check the host's python and its interface address") for name, why in run.problems.items()]
    master = run.outputs.get(run.master)
    if master is None:
        section["status"] = "unknown"
        section["message"] = f"the connectivity test could not run on the master {run.master}"
        return findings, section
    serving = master["serving"]
    if serving is not None and serving["result"] == "in-use":
        section["status"] = "skipped"
        section["message"] = f"the rendezvous port {run.master}:{run.port} is in use, so it could not be tested"
        return findings, section
    if serving is None or serving["result"] != "ok":
        detail = serving["detail"] if serving else master["error"] or "no listener"
        section["status"] = "fail"
        section["message"] = f"cannot listen on {master['address']}:{run.port} on {run.master}: {detail}"
        findings.append(Finding("PF609", Status.fail, run.master, section["message"],
                                "check that the master's interface address is its own and the port is a valid one"))
        return findings, section
    rendezvous, rendezvous_failed = _rendezvous(run)
    mesh, mesh_failed, mesh_tested = _mesh(run)
    mtu, section["mtu_failed"], section["mtu_tested"] = _mtu(run)
    loss, section["loss_failed"], section["loss_tested"], section["loss_max_percent"], section["rtt_median_ms"] = _loss(run, config)
    section["tcp_failed"] = rendezvous_failed + mesh_failed
    section["tcp_tested"] = sum(1 for o in run.outputs.values() if o["registry"] is not None) + mesh_tested
    findings += rendezvous + mesh + mtu + loss
    failing = [f for f in findings if f.status == Status.fail]
    if failing:
        section["status"] = "fail"
        section["message"] = failing[0].message if len(failing) == 1 else f"{failing[0].message} (and {len(failing) - 1} more)"
    else:
        section["status"] = "unknown" if run.problems else "pass"
        loss_said = (f"loss at most {section['loss_max_percent']}%" if section["loss_max_percent"] is not None
                     else "no path to measure loss on")
        hosts_said = "1 host" if len(run.outputs) == 1 else f"{len(run.outputs)} hosts"
        section["message"] = (f"{hosts_said}: rendezvous port {run.master}:{run.port} and {mesh_tested} TCP paths open, "
                              f"MTU passed on {section['mtu_tested']} paths, {loss_said}")
    return findings, section
