"""NCCL's real transport: the collective runs with NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=INIT,NET, and each rank's
lines say which network NCCL chose (NET/IB, NET/Socket or a plugin's), whether GPUDirect RDMA is used and how many
channels it built. A host that has ACTIVE InfiniBand/RoCE ports but whose ranks fell back to sockets fails (PF841), with
the lines that say why; InfiniBand without GPUDirect RDMA warns (PF842); hosts that chose differently fail (PF843).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Literal

from preflight.contracts import RankTransport, TransportSection
from preflight.findings import CLUSTER, Finding, Status
from preflight.records import HostRecord

# What the collective adds to the launch's environment to see NCCL's choice; INIT and NET keep it to a few dozen lines.
NCCL_INFO_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}

# "host:pid:tid [cudaDev] NCCL INFO text", possibly behind torchrun's "[rank] " tee prefix or NCCL's "[time stamp] ".
# A WARN line names its source file before NCCL: "[3] plugin/net.cc:334 NCCL WARN ...".
_LINE = re.compile(r"^(?:\[[^\]]*\]\s*)*(?P<host>[^\s:\[]+):(?P<pid>\d+):\d+ \[(?P<dev>\d+)\] "
                   r"(?:\S+:\d+ )?NCCL (?:INFO|WARN) (?P<text>.*)$")
_VIA = re.compile(r"via NET/(?P<net>[A-Za-z]+)/\d+(?P<gdr>/GDRDMA)?")
_DEVICES = re.compile(r"\[\d+\](\S+?/(?:IB|RoCE))")
_WHY = re.compile(r"NCCL_IB_DISABLE set|NET/IB : No device found|NET/IB.*(?:fail|error|Disabled)|NCCL_NET set|NET/Plugin.*(?:fail|error)"
                  r"|Failed to initialize any NET plugin", re.IGNORECASE)


def _rank(host: str, dev: int) -> RankTransport:
    return {"host": host, "device": dev, "network": None, "devices": [], "gdr": None, "plugin": None, "channels": None,
            "nccl_version": None, "reasons": []}


def parse_nccl_info(text: str, host: str) -> list[RankTransport]:
    """Each NCCL process's transport from its INFO lines in text (one host's output), in the order they first speak."""
    ranks: dict[str, RankTransport] = {}
    version = None
    for raw in text.splitlines():
        line = raw.strip()
        match = _LINE.match(line)
        if match is None:
            loose = re.search(r"NCCL version (\S+)", line)
            version = loose.group(1) if loose else version
            continue
        rank = ranks.setdefault(match.group("pid"), _rank(host, int(match.group("dev"))))
        said = match.group("text")
        if m := re.match(r"Using network (.+)$", said):
            rank["network"] = m.group(1).strip()
        elif m := re.match(r"NET/(IB|Socket) : Using (.*)", said):
            rank["devices"] = _DEVICES.findall(m.group(2)) or rank["devices"]
        elif m := re.search(r"(?:Loaded net plugin|Successfully loaded external plugin) (\S+)", said):
            rank["plugin"] = m.group(1)
        elif m := re.search(r"NCCL version (\S+)", said):
            rank["nccl_version"] = m.group(1)
        elif m := re.match(r"(\d+) coll channels", said):
            rank["channels"] = int(m.group(1))
        if "GPU Direct RDMA Enabled" in said:
            rank["gdr"] = True
        elif "GPU Direct RDMA Disabled" in said and rank["gdr"] is None:
            rank["gdr"] = False
        if via := _VIA.search(said):
            if rank["network"] is None:
                rank["network"] = via.group("net")
            if via.group("gdr"):
                rank["gdr"] = True
            elif via.group("net") == "IB" and rank["gdr"] is None:
                rank["gdr"] = False
        if _WHY.search(said) and said not in rank["reasons"] and len(rank["reasons"]) < 4:
            rank["reasons"].append(said)
    for rank in ranks.values():
        rank["nccl_version"] = rank["nccl_version"] or version
    return list(ranks.values())


def expects_ib(record: HostRecord) -> list[str]:
    """The host's ACTIVE InfiniBand/RoCE ports, unless InfiniBand is switched off for NCCL there; empty: sockets expected."""
    nccl = record.facts["nccl"]
    settings = {**{k: v for conf in nccl["conf_files"].values() for k, v in conf.items()}, **nccl["env"]}
    if settings.get("NCCL_IB_DISABLE", "0").strip() == "1" or settings.get("NCCL_NET", "").lower() == "socket":
        return []
    return [f"{p['device']}:{p['port']}" for p in record.facts["net"]["infiniband"] if p["state"] == "ACTIVE"]


def judge_transport(records: Sequence[HostRecord], outputs: Mapping[str, str]) -> tuple[list[Finding], TransportSection]:
    """PF841-PF843 from each host's output of a passing NCCL launch, and the report's account of it."""
    findings: list[Finding] = []
    ranks: list[RankTransport] = []
    chosen: dict[str, str] = {}
    for record in records:
        name = record.host.name
        mine = parse_nccl_info(outputs.get(name, ""), name)
        ranks += mine
        ports = expects_ib(record)
        networks = sorted({r["network"] for r in mine if r["network"]})
        if not networks:
            if ports:
                findings.append(Finding("PF841", Status.warn, name, "NCCL printed no network choice (NCCL_DEBUG=INFO) although "
                                        f"{', '.join(ports)} are ACTIVE",
                                        "run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET and read it"))
            continue
        chosen[name] = "/".join(networks) + (f" plugin {mine[0]['plugin']}" if mine[0]["plugin"] else "")
        detail = _detail(mine)
        if ports and "Socket" in networks:
            reasons = sorted({why for r in mine for why in r["reasons"]})
            findings.append(Finding("PF841", Status.fail, name,
                                    f"NCCL fell back to sockets although {', '.join(ports)} are ACTIVE"
                                    + (f": {'; '.join(reasons[:3])}" if reasons else ""),
                                    "see `preflight explain PF841`: NCCL_IB_DISABLE, a missing libibverbs/rdma-core in the "
                                    "environment, or NCCL_IB_HCA naming no live port"))
        else:
            findings.append(Finding("PF841", Status.passed, name, f"NCCL uses NET/{chosen[name]}{detail}"))
        if "IB" in networks and any(r["gdr"] is False for r in mine) and not any(r["gdr"] for r in mine):
            findings.append(Finding("PF842", Status.warn, name, "NCCL uses InfiniBand without GPUDirect RDMA: every transfer is "
                                    "staged through host memory", "load nvidia_peermem (or use dmabuf), disable ACS, set iommu=pt "
                                    "(PF822-PF824 say which)"))
    if len(set(chosen.values())) > 1:
        detail = ", ".join(f"{host}: {net}" for host, net in sorted(chosen.items())[:8])
        findings.append(Finding("PF843", Status.fail, CLUSTER, f"hosts chose different NCCL networks ({detail})",
                                "make every host's network the same (ports, plugin, NCCL_IB_* settings); mixed transports hang"))
    elif len(chosen) > 1:
        findings.append(Finding("PF843", Status.passed, CLUSTER, f"every host uses NET/{next(iter(chosen.values()))}"))
    expected: Literal["IB", "Socket"] = "IB" if any(expects_ib(r) for r in records) else "Socket"
    message = "; ".join(f"{host}: {net}" for host, net in sorted(chosen.items())[:8]) or "NCCL printed no network choice"
    return findings, {"expected": expected, "message": message, "ranks": ranks}


def _detail(ranks: list[RankTransport]) -> str:
    devices = sorted({d for r in ranks for d in r["devices"]})
    gdr = {r["gdr"] for r in ranks} - {None}
    channels = sorted({r["channels"] for r in ranks if r["channels"] is not None})
    parts = [", ".join(devices[:4])] if devices else []
    if gdr:
        parts.append("GPUDirect RDMA " + ("on" if gdr == {True} else "off" if gdr == {False} else "on some ranks"))
    if channels:
        parts.append(f"{'/'.join(map(str, channels))} coll channels")
    return f" ({'; '.join(parts)})" if parts else ""
