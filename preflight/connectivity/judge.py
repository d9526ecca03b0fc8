"""The connectivity test's verdict: every host's mesh output, read into findings that name the exact host, port, pair
or size, and the report's connectivity section. Pure: no I/O.

Faults are blamed by majority (preflight.connectivity.blame): a host most of whose paths one way fail, while most of
the others' paths pass, is the finding (PF610 on a destination no tester reaches or a source that reaches no one, PF611
on a host that receives less than its peers send or sends more than its path carries, PF612 on the lossy host), and
the hosts that merely tested it are not failed. What no one host explains is named as the path itself, on the
cluster; a fault on every path is one cluster-wide finding. With rails, each rail is judged on its own paths (rail r of
every host to its peers' rail r), as a network of its own: its findings name the host and the rail, e.g. "h3 rail 1
(eth2)", and a fault of one rail blames no other.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

from preflight.connectivity.blame import Tested, blame
from preflight.connectivity.contracts import ConnectivitySection, LossPath, MtuPath, PathResult, RailPaths, TcpPath
from preflight.connectivity.plan import MeshPlan
from preflight.connectivity.wire import MeshOutput
from preflight.findings import CLUSTER, Finding, Status
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
class RailEnd:
    """A host's end of one rail, as the judge names and measures it."""

    label: str  # how a finding names the rail, e.g. rail 1 (eth2 / mlx5_1:1)
    interface: str
    mtu: int | None  # its MTU, as the host's facts say


@dataclass(frozen=True)
class MeshRun:
    """What the stage ran: the plan, the master's rendezvous port, each host's output or why there is none; and as the
    judge sees one network of it (view), how findings name each host on it."""

    plan: MeshPlan
    master: str
    port: int
    mtu: Mapping[str, int | None]  # each host's interface MTU, as its facts say (with rails: on the network in view)
    outputs: Mapping[str, MeshOutput]
    problems: Mapping[str, str]  # host -> why the test could not run there
    elapsed_s: float
    rails: Mapping[str, Mapping[int, RailEnd]] = field(default_factory=dict)  # host -> its rails; empty: no rails
    labels: Mapping[str, str] = field(default_factory=dict)  # host -> how findings name it on the network in view
    scope: str = ""  # what a finding on the whole network in view begins with, e.g. "rail 1: "


def _who(run: MeshRun, host: str) -> str:
    return run.labels.get(host, host)


def view(run: MeshRun, rail: int) -> MeshRun:
    """The run as rail r alone: its rows of every host's output, its MTUs, each host named with the rail."""
    outputs = {}
    for name, out in run.outputs.items():
        mine = out.copy()
        mine["tcp"] = [row for row in out["tcp"] if row["rail"] == rail]
        mine["loss"] = [row for row in out["loss"] if row["rail"] == rail]
        mine["mtu"] = [row for row in out["mtu"] if row["rail"] == rail]
        outputs[name] = mine
    ends = {name: mine[rail] for name, mine in run.rails.items() if rail in mine}
    return replace(run, outputs=outputs, mtu={name: end.mtu for name, end in ends.items()},
                   labels={name: f"{name} {end.label}" for name, end in ends.items()}, scope=f"rail {rail}: ")


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
    if len(failed) >= 2 and len(failed) * 2 > len(tried):
        # Most hosts cannot register: the master's port (its firewall, its listener) is the fault, not theirs.
        kind = failed[0]["result"] if len({f["result"] for f in failed}) == 1 else "error"
        state = {"filtered": "is filtered", "refused": "refuses connections", "no-route": "has no route from any host"}.get(kind, "fails")
        whom = (f"none of the {len(tried)} hosts got through (" if len(failed) == len(tried)
                else f"{len(failed)} of the {len(tried)} hosts did not get through ({_names(f['source'] for f in failed)}: ")
        return [Finding("PF609", Status.fail, run.master,
                        f"the rendezvous port {where} {state}: {whom}{failed[0]['detail']}); {CAUSES.get(kind, '')}",
                        f"open TCP port {run.port} on {run.master} to every host of the job (or set network.master_port to one "
                        "that is open)")], failed
    return [Finding("PF609", Status.fail, f["source"],
                    f"{f['source']} -> {where}: {f['result']} ({f['detail']}); {CAUSES.get(f['result'], '')}",
                    f"open TCP port {run.port} on {run.master} to {f['source']}, and check its route to {address}")
            for f in failed], failed


def _mesh(run: MeshRun) -> tuple[list[Finding], list[TcpPath], int]:
    """PF610: every host's connects to its peers' listeners."""
    tested: list[Tested] = []
    failed: list[TcpPath] = []
    for name, out in run.outputs.items():
        for row in out["tcp"]:
            tested.append(Tested(name, row["peer"], row["result"] == "ok"))
            if row["result"] != "ok":
                failed.append({"source": name, "destination": row["peer"], "address": row["address"], "port": row["port"],
                               "rendezvous": False, "result": cast(PathResult, row["result"]), "detail": row["detail"]})
    if not failed:
        scope = "every pair" if run.plan.mode == "full" else "a sample of pairs"
        passed = [Finding("PF610", Status.passed, CLUSTER, f"{run.scope}all {len(tested)} TCP paths between hosts open ({scope})")]
        return passed if tested else [], failed, len(tested)
    verdict = blame(tested)
    first = failed[0]
    if verdict.everywhere:
        return [Finding("PF610", Status.fail, CLUSTER,
                        f"{run.scope}no TCP path between hosts is open: all {len(tested)} failed ({first['result']}: "
                        f"{first['detail']}); gloo and NCCL open a full mesh of TCP connections between hosts on ephemeral ports, so "
                        "init hangs",
                        "accept TCP from the job's hosts on the ephemeral range (/proc/sys/net/ipv4/ip_local_port_range) on "
                        "every host, or on the whole job interface")], failed, len(tested)
    findings: list[Finding] = []
    for host, direction in sorted(verdict.hosts.items()):
        who = _who(run, host)
        if direction in ("to", "both"):
            into = [p for p in failed if p["destination"] == host]
            testers = sum(1 for t in tested if t.destination == host)
            whom = "answers no host" if len(into) == testers else f"does not answer {len(into)} of its {testers} testers"
            findings.append(Finding(
                "PF610", Status.fail, host,
                f"{who}'s mesh port {into[0]['port']} {whom}: {into[0]['result']} from {_names(p['source'] for p in into)} "
                f"({into[0]['detail']}); gloo and NCCL open a full mesh of TCP connections between hosts on ephemeral ports, so "
                "a firewall that admits only known ports hangs init",
                f"on {who}, accept TCP from the job's hosts on the ephemeral range (/proc/sys/net/ipv4/ip_local_port_range), "
                "or on the whole interface"))
        if direction in ("from", "both"):
            outbound = [p for p in failed if p["source"] == host]
            targets = len(run.outputs[host]["tcp"])
            whom = (f"reaches none of its {targets} peers" if len(outbound) == targets
                    else f"fails to reach {len(outbound)} of its {targets} peers")
            findings.append(Finding(
                "PF610", Status.fail, host, f"{who} {whom} over TCP ({outbound[0]['result']}: {outbound[0]['detail']})",
                f"check {who}'s outbound firewall rules and its route on that interface"))
    rest = [failed[i] for i in _failed_indices(tested, verdict.unexplained)]
    for path in rest[:NAMED_PATHS]:
        findings.append(Finding("PF610", Status.fail, CLUSTER,
                                f"{run.scope}{path['source']} -> {path['destination']}:{path['port']} {path['result']} ({path['detail']}); "
                                f"{CAUSES.get(path['result'], '')}; no one host explains it",
                                f"open TCP between {path['source']} and {path['destination']} on the job's interface"))
    if len(rest) > NAMED_PATHS:
        findings.append(Finding("PF610", Status.fail, CLUSTER, f"{run.scope}and {len(rest) - NAMED_PATHS} more TCP paths failed: "
                                "the report's connectivity.tcp_failed lists them", "see the paths named"))
    return findings, failed, len(tested)


def _failed_indices(tested: Sequence[Tested], indices: Sequence[int]) -> list[int]:
    """Indices into the tested paths, as indices into the failed ones (the failed paths, in the order tested)."""
    position = {i: k for k, i in enumerate(i for i, t in enumerate(tested) if not t.ok)}
    return [position[i] for i in indices]


def _mtu(run: MeshRun) -> tuple[list[Finding], list[MtuPath], int]:
    """PF611: do-not-fragment datagrams at the source interface's MTU; the largest size that passed is the path's MTU
    (the mesh test searches between the sizes that passed and failed)."""
    tested: list[Tested] = []
    failed: list[MtuPath] = []
    for name, out in run.outputs.items():
        for row in out["mtu"]:
            if not row["sizes"] or not row["passed"]:
                continue  # no size passed at all: UDP is blocked or lost on this path; PF612 says so
            tested.append(Tested(name, row["peer"], row["sizes"][0] in row["passed"]))
            if row["sizes"][0] not in row["passed"]:
                failed.append({"source": name, "destination": row["peer"], "mtu": row["sizes"][0], "largest_passed": max(row["passed"])})
    if not failed:
        sizes = sorted({m for m in run.mtu.values() if m})
        shown = "/".join(str(s) for s in sizes) or "?"
        return ([Finding("PF611", Status.passed, CLUSTER, f"{run.scope}do-not-fragment datagrams at each interface's MTU ({shown} B) "
                         f"passed on all {len(tested)} paths")] if tested else []), failed, len(tested)
    verdict = blame(tested)
    largest = max(p["largest_passed"] or 0 for p in failed)
    if verdict.everywhere:
        claimed = "/".join(str(m) for m in sorted({p["mtu"] for p in failed}))
        return [Finding("PF611", Status.fail, CLUSTER,
                        f"{run.scope}every path carries at most {largest} B while the interfaces claim MTU {claimed}: do-not-fragment "
                        f"datagrams at the MTU got no answer on all {len(tested)} paths (a path-MTU blackhole: large messages "
                        "hang, small ones pass)",
                        f"set every host's MTU to what the switches carry ({largest}), or enable jumbo frames on every hop")], \
            failed, len(tested)
    findings: list[Finding] = []
    for host, direction in sorted(verdict.hosts.items()):
        if direction in ("to", "both"):
            findings.append(_mtu_into(run, host, [p for p in failed if p["destination"] == host]))
        if direction in ("from", "both"):
            outbound = [p for p in failed if p["source"] == host]
            every = len(outbound) == sum(1 for t in tested if t.source == host)
            whom = f"any of its {len(outbound)} peers" if every else _names(p["destination"] for p in outbound)
            carried = max(p["largest_passed"] or 0 for p in outbound)
            findings.append(Finding(
                "PF611", Status.fail, host,
                f"{_who(run, host)}'s interface claims MTU {outbound[0]['mtu']}, but its path to {whom} carries at most {carried} B: "
                f"do-not-fragment datagrams of {outbound[0]['mtu']} B got no answer while {carried} B did (a path-MTU blackhole: "
                "large messages hang, small ones pass)",
                f"set {_who(run, host)}'s MTU to what the switches carry ({carried}), or enable jumbo frames on every hop between the "
                "hosts"))
    for path in [failed[i] for i in _failed_indices(tested, verdict.unexplained)][:NAMED_PATHS]:
        findings.append(Finding(
            "PF611", Status.fail, CLUSTER,
            f"{run.scope}{path['source']} -> {path['destination']} carries at most {path['largest_passed']} B of {path['source']}'s MTU "
            f"{path['mtu']}: no one host explains it",
            f"set the MTU of every hop between {path['source']} and {path['destination']} to the hosts' MTU"))
    return findings, failed, len(tested)


def _mtu_into(run: MeshRun, host: str, into: Sequence[MtuPath]) -> Finding:
    """A host whose inbound paths carry less than its peers send: most often its own interface's MTU, set below theirs."""
    carried = min(p["largest_passed"] or 0 for p in into)
    sent = max(p["mtu"] for p in into)
    own = run.mtu.get(host)
    why = (f"its own interface's MTU is {own}, below its peers' {sent}" if own and own < sent
           else "a hop in front of it carries less than its peers' interfaces")
    who = _who(run, host)
    return Finding(
        "PF611", Status.fail, host,
        f"{who} receives at most {carried} B: do-not-fragment datagrams of {sent} B from {_names(p['source'] for p in into)} got "
        f"no answer while {carried} B did, and the other hosts' paths among themselves pass; {why} (large messages to it hang, "
        "small ones pass)",
        f"set {who}'s MTU to its peers' {sent} (ip link set IFACE mtu {sent}) and its switch port to match, or every host's "
        f"MTU to {min(carried, own) if own else carried}")


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
    limit = config.max_loss_percent
    lossy = [p for p in paths if p["loss_percent"] > limit]
    findings: list[Finding] = []
    if blocked:
        findings.append(Finding("PF612", Status.warn, CLUSTER,
                                f"{run.scope}no UDP datagram came back on {len(blocked)} path(s) "
                                f"({_names(f'{s} -> {d}' for s, d in blocked)}): UDP is blocked there, so loss and path MTU were "
                                "not measured on them",
                                "allow UDP between the job's hosts on their interface, or take the TCP results alone"))
    if not lossy:
        if paths:
            findings.append(Finding("PF612", Status.passed, CLUSTER,
                                    f"{run.scope}packet loss at most {worst}% on {len(paths)} paths (threshold {limit}%), median "
                                    f"round trip {median_rtt} ms"))
        return findings, lossy, len(paths), worst, median_rtt
    # An echo lost says nothing of the way it was lost on: a host is blamed on every path that touches it.
    verdict = blame([Tested(p["source"], p["destination"], p["loss_percent"] <= limit) for p in paths], directed=False)
    if verdict.everywhere:
        median = statistics.median(p["loss_percent"] for p in paths)
        findings.append(Finding("PF612", Status.fail, CLUSTER,
                                f"{run.scope}every path loses packets: {median:g}% (median of {len(paths)} paths; threshold "
                                f"{limit}%), so no one host is to blame",
                                "check the switch or bridge every host shares (its port counters, its buffers), and the hosts' "
                                "common settings; NCCL over a lossy fabric slows to a crawl or times out"))
        return findings, lossy, len(paths), worst, median_rtt
    for host in sorted(verdict.hosts):
        own = [p for p in paths if host in (p["source"], p["destination"])]
        median = statistics.median(p["loss_percent"] for p in own)
        findings.append(Finding("PF612", Status.fail, host,
                                f"{_who(run, host)} loses {median:g}% of packets (median of its {len(own)} paths; others lose "
                                f"{_others_median(paths, host)}%; threshold {limit}%)",
                                f"check {_who(run, host)}'s NIC, cable and switch port counters (ethtool -S, ip -s link); NCCL "
                                "over a lossy link slows to a crawl or times out"))
    pairs: dict[frozenset[str], list[LossPath]] = {}
    for index in verdict.unexplained:
        pairs.setdefault(frozenset((paths[index]["source"], paths[index]["destination"])), []).append(paths[index])
    alone = len(run.outputs) == 2
    for pair in list(pairs.values())[:NAMED_PATHS]:
        ends = sorted({pair[0]["source"], pair[0]["destination"]})
        way = " <-> ".join(ends) if len(pair) == 2 else f"{pair[0]['source']} -> {pair[0]['destination']}"
        lost = ", ".join(f"{p['loss_percent']:g}% ({p['sent'] - p['echoed']} of {p['sent']})" for p in pair)
        why = "with two hosts the test cannot tell which end loses them" if alone else "no one host explains it"
        findings.append(Finding("PF612", Status.fail, CLUSTER, f"{run.scope}{way} loses {lost} of packets (threshold {limit}%); {why}",
                                f"check the NICs, cables and switch ports of {ends[0]} and {ends[1]} (ethtool -S, ip -s link)"))
    return findings, lossy, len(paths), worst, median_rtt


def _others_median(paths: Sequence[LossPath], host: str) -> float:
    rest = [p["loss_percent"] for p in paths if host not in (p["source"], p["destination"])]
    return round(statistics.median(rest), 1) if rest else 0.0


def blamed_hosts(findings: Sequence[Finding], master: str) -> set[str] | None:
    """The hosts the failed connectivity findings blame, when they alone explain the failure: the others' paths are
    proven, so the collective can run on them. None when a failure is the cluster's or the master's."""
    blamed = {f.host for f in findings if f.status == Status.fail}
    return None if CLUSTER in blamed or master in blamed else blamed


@dataclass(frozen=True)
class _Judged:
    """One network's findings and paths: the job's interface, or one rail."""

    findings: list[Finding]
    tcp_failed: list[TcpPath]
    tcp_tested: int
    mtu_failed: list[MtuPath]
    mtu_tested: int
    loss_failed: list[LossPath]
    loss_tested: int
    loss_max: float | None


def _network(run: MeshRun, config: ConnectivityConfig) -> _Judged:
    mesh, tcp_failed, tcp_tested = _mesh(run)
    mtu, mtu_failed, mtu_tested = _mtu(run)
    loss, loss_failed, loss_tested, worst, _ = _loss(run, config)
    return _Judged(mesh + mtu + loss, tcp_failed, tcp_tested, mtu_failed, mtu_tested, loss_failed, loss_tested, worst)


def _rail_paths(run: MeshRun, rail: int, judged: _Judged) -> RailPaths:
    failed = [f for f in judged.findings if f.status == Status.fail]
    rtts = [row["rtt_ms"] for o in run.outputs.values() for row in o["loss"]
             if row["rail"] == rail and row["sent"] and row["echoed"] and row["rtt_ms"] is not None]
    return {"rail": rail, "interfaces": sorted({mine[rail].interface for mine in run.rails.values() if rail in mine}),
            "hosts": [name for name, out in run.outputs.items() if any(e["rail"] == rail for e in out["listening"])],
            "status": "fail" if failed else "pass", "named": sorted({f.host for f in failed}),
            "tcp_tested": judged.tcp_tested, "tcp_failed": len(judged.tcp_failed), "mtu_tested": judged.mtu_tested,
            "mtu_failed": len(judged.mtu_failed), "loss_tested": judged.loss_tested, "loss_failed": len(judged.loss_failed),
            "loss_max_percent": judged.loss_max, "rtt_median_ms": round(statistics.median(rtts), 3) if rtts else None}


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
    findings += rendezvous
    rails = sorted({r for mine in run.rails.values() for r in mine})
    networks: list[int | None] = [*rails] or [None]
    judged = {network: _network(run if network is None else view(run, network), config) for network in networks}
    for network, one in judged.items():
        findings += one.findings
        if network is not None:
            for tcp in one.tcp_failed:
                tcp["rail"] = network
            for mtu in one.mtu_failed:
                mtu["rail"] = network
            for loss in one.loss_failed:
                loss["rail"] = network
    mesh_tested = sum(one.tcp_tested for one in judged.values())
    section["tcp_failed"] = rendezvous_failed + [p for one in judged.values() for p in one.tcp_failed]
    section["tcp_tested"] = sum(1 for o in run.outputs.values() if o["registry"] is not None) + mesh_tested
    section["mtu_failed"] = [p for one in judged.values() for p in one.mtu_failed]
    section["mtu_tested"] = sum(one.mtu_tested for one in judged.values())
    section["loss_failed"] = [p for one in judged.values() for p in one.loss_failed]
    section["loss_tested"] = sum(one.loss_tested for one in judged.values())
    section["loss_max_percent"] = max((one.loss_max for one in judged.values() if one.loss_max is not None), default=None)
    rtts = [row["rtt_ms"] for o in run.outputs.values() for row in o["loss"] if row["sent"] and row["echoed"] and row["rtt_ms"] is not None]
    section["rtt_median_ms"] = round(statistics.median(rtts), 3) if rtts else None
    if rails:
        section["rails"] = [_rail_paths(run, rail, judged[rail]) for rail in rails]
    failing = [f for f in findings if f.status == Status.fail]
    if failing:
        section["status"] = "fail"
        section["message"] = failing[0].message if len(failing) == 1 else f"{failing[0].message} (and {len(failing) - 1} more)"
    else:
        section["status"] = "unknown" if run.problems else "pass"
        loss_said = (f"loss at most {section['loss_max_percent']}%" if section["loss_max_percent"] is not None
                     else "no path to measure loss on")
        hosts_said = "1 host" if len(run.outputs) == 1 else f"{len(run.outputs)} hosts"
        on_rails = f" on {len(rails)} rails" if rails else ""
        section["message"] = (f"{hosts_said}: rendezvous port {run.master}:{run.port} open; no path between hosts to test"
                              if len(run.outputs) == 1 and not mesh_tested else
                              f"{hosts_said}: rendezvous port {run.master}:{run.port} and {mesh_tested} TCP paths open{on_rails}, "
                              f"MTU passed on {section['mtu_tested']} paths, {loss_said}")
    return findings, section
