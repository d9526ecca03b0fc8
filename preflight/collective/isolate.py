"""Finding the culprits of a failing set: the hosts split in halves until a single host fails with any other; and, on
nccl, each host alone rerun with one intra-node transport off at a time, to say which one is broken."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from preflight.collective.judge import LostHost, lost_findings
from preflight.collective.run import Collective
from preflight.findings import Finding, Status
from preflight.spec import alone_port, split_port


@dataclass
class Isolation:
    """What splitting the hosts found."""

    rounds: int
    culprits: list[str]
    healthy: list[str]
    note: str
    lost: list[LostHost] = field(default_factory=list)  # hosts lost under its launches: they and their group are not judged


def isolate(collective: Collective, hosts: Sequence[str], port: int) -> Isolation:
    """Split the failing set in halves, run the halves at once on distinct ports, recurse into
    the failing ones, and confirm each single suspect paired with a known-good host."""
    good: list[str] = []
    culprits: list[str] = []
    lost: list[LostHost] = []
    unjudged: list[str] = []
    pending = _halves(list(hosts))
    rounds = 0
    while pending:
        rounds += 1
        groups: list[tuple[list[str], int]] = []
        partners = iter(good)
        for k, group in enumerate(pending):
            members = list(group)
            if len(members) == 1:
                partner = next(partners, None)
                if partner is not None:
                    # A host alone may pass where it fails with others (a blocked port): pair it.
                    members = [partner, members[0]]
            groups.append((members, split_port(port, k)))
        outcomes = collective.run(groups, derived=True)
        failing: list[list[str]] = []
        for group, outcome in zip(pending, outcomes, strict=True):
            if outcome.status == "pass":
                good.extend(group)
            elif outcome.status == "unknown":
                # A host lost under the launch: the group has no verdict, and none of its hosts is blamed or cleared.
                lost.extend(outcome.lost)
                unjudged.extend(group)
            elif len(group) == 1:
                culprits.extend(group)
            else:
                failing.append(group)
        pending = [half for group in failing for half in _halves(group)]
    healthy = [h for h in hosts if h not in culprits and h not in unjudged]
    note = "" if culprits or unjudged else "every subset passed: the failure needs the whole set (a port or route between hosts)"
    if unjudged:
        note = f"not judged: {', '.join(unjudged)} (lost: {', '.join(h.host for h in lost)})"
    return Isolation(rounds=rounds, culprits=culprits, healthy=healthy, note=note, lost=lost)


def _halves(hosts: list[str]) -> list[list[str]]:
    middle = (len(hosts) + 1) // 2
    return [part for part in (hosts[:middle], hosts[middle:]) if part]


# Rerun a failed intra-node launch with one NCCL transport off at a time, to say which is broken.
INTRA_NODE_SUSPECTS = (
    ("NCCL_P2P_DISABLE", "GPU peer-to-peer (the 545 driver hang lives here)", "intra-node traffic through host memory: much slower"),
    ("NCCL_SHM_DISABLE", "the shared-memory transport (/dev/shm)", "intra-node traffic through sockets: much slower"),
)


def intra_node_findings(collective: Collective, hosts: Sequence[str], port: int) -> list[Finding]:
    """Every host alone, all at once; then the failing ones at once with P2P off, and those still failing with SHM off: a
    run that then passes names the broken transport. Each host on its own ports (spec.alone_port) of the rendezvous port."""
    index = {host: k for k, host in enumerate(hosts)}
    alone = dict(zip(hosts, collective.run([([host], alone_port(port, k)) for k, host in enumerate(hosts)], derived=True),
                     strict=True))
    # A host lost under its run alone has no verdict there.
    failing = [host for host in hosts if alone[host].status not in ("pass", "unknown")]
    unknown = lost_findings([h for host in hosts if alone[host].status == "unknown" for h in alone[host].lost],
                            "during its intra-node run alone")
    named: dict[str, Finding] = {}
    for j, (variable, transport, cost) in enumerate(INTRA_NODE_SUSPECTS, start=1):
        unexplained = [host for host in failing if host not in named]
        if not unexplained:
            break
        retries = collective.run([([host], alone_port(port, index[host], j)) for host in unexplained], extra_env={variable: "1"},
                                 derived=True)
        for host, retry in zip(unexplained, retries, strict=True):
            if retry.status == "pass":
                named[host] = Finding("PF606", Status.fail, host, f"the intra-node collective fails, and passes with {variable}=1: "
                                      f"{transport} is broken", f"fix the driver/topology; {variable}=1 is a workaround ({cost})",
                                      {variable: "1"})
    return unknown + [named.get(host) or Finding("PF606", Status.fail, host, f"the intra-node collective fails on this host alone: "
                                                 f"{alone[host].message}", "run nccl-tests on this host; check dmesg for Xid errors")
                      for host in failing]
