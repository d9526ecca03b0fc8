"""Finding the culprits of a failing set: the hosts split in halves until a single host fails with any other; and, on
nccl, each host alone rerun with one intra-node transport off at a time, to say which one is broken."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from preflight.collective.run import Collective
from preflight.findings import Finding, Status


@dataclass
class Isolation:
    """What splitting the hosts found."""

    rounds: int
    culprits: list[str]
    healthy: list[str]
    note: str


def isolate(collective: Collective, hosts: Sequence[str], port: int, *, sweep: bool) -> Isolation:
    """Split the failing set in halves, run the halves at once on distinct ports, recurse into
    the failing ones, and confirm each single suspect paired with a known-good host."""
    good: list[str] = []
    culprits: list[str] = []
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
            groups.append((members, port + 1 + k))
        outcomes = collective.run(groups, sweep=sweep)
        failing: list[list[str]] = []
        for group, outcome in zip(pending, outcomes, strict=True):
            if outcome.status == "pass":
                good.extend(group)
            elif len(group) == 1:
                culprits.extend(group)
            else:
                failing.append(group)
        pending = [half for group in failing for half in _halves(group)]
    healthy = [h for h in hosts if h not in culprits]
    note = "" if culprits else "every subset passed: the failure needs the whole set (a port or route between hosts)"
    return Isolation(rounds=rounds, culprits=culprits, healthy=healthy, note=note)


def _halves(hosts: list[str]) -> list[list[str]]:
    middle = (len(hosts) + 1) // 2
    return [part for part in (hosts[:middle], hosts[middle:]) if part]


# Rerun a failed intra-node launch with one NCCL transport off at a time, to say which is broken.
INTRA_NODE_SUSPECTS = (
    ("NCCL_P2P_DISABLE", "GPU peer-to-peer (the 545 driver hang lives here)", "intra-node traffic through host memory: much slower"),
    ("NCCL_SHM_DISABLE", "the shared-memory transport (/dev/shm)", "intra-node traffic through sockets: much slower"),
)


def intra_node_findings(collective: Collective, hosts: Sequence[str], port: int) -> list[Finding]:
    """For each host alone, rerun with P2P off and with SHM off; a run that then passes names the broken transport."""
    findings = []
    for k, host in enumerate(hosts):
        (alone,) = collective.run([([host], port + 3 * k)], sweep=False)
        if alone.status == "pass":
            continue
        for j, (variable, transport, cost) in enumerate(INTRA_NODE_SUSPECTS, start=1):
            (retry,) = collective.run([([host], port + 3 * k + j)], sweep=False, extra_env={variable: "1"})
            if retry.status == "pass":
                findings.append(Finding("PF606", Status.fail, host, f"the intra-node collective fails, and passes with {variable}=1: "
                                        f"{transport} is broken", f"fix the driver/topology; {variable}=1 is a workaround ({cost})",
                                        {variable: "1"}))
                break
        else:
            findings.append(Finding("PF606", Status.fail, host, f"the intra-node collective fails on this host alone: {alone.message}",
                                    "run nccl-tests on this host; check dmesg for Xid errors"))
    return findings
