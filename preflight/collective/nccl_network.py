"""NCCL's real transport: the collective runs with NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=INIT,NET, and each rank's
lines say which network NCCL chose (NET/IB, NET/Socket or a plugin's), whether GPUDirect RDMA is used and how many
channels it built. A host that has ACTIVE InfiniBand/RoCE ports but whose ranks fell back to sockets fails (PF841), with
the lines that say why; InfiniBand without GPUDirect RDMA warns (PF842); hosts that chose differently fail (PF843).
Where every host's NCCL is 2.31 or newer the launch also sets NCCL_RUN_DIAGNOSTICS=1: NCCL then checks its own paths
at communicator init (and NCCL_RUN_RAS_DIAGNOSTICS=1 compares the ranks' setup), and rank 0's process prints "NCCL
DIAG" reports, which PF844 quotes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Literal

from preflight.collective.contracts import NcclDiagnosticLine, NcclDiagnostics, RankTransport, TransportSection
from preflight.findings import CLUSTER, Finding, Status
from preflight.records import HostRecord

# What the collective adds to the launch's environment to see NCCL's choice; INIT and NET keep it to a few dozen lines.
NCCL_INFO_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
# NCCL's own diagnostics at communicator init, off by default, from 2.31 (NVIDIA's NCCL user guide, Troubleshooting >
# Diagnostics and RAS > RAS Diagnostics): the active ones exchange data over the paths NCCL will use (P2P, ib_write_bw
# between nodes), the RAS ones compare GPU inventory, CUDA driver, ECC, NVLink state and NCCL_* settings across ranks.
NCCL_DIAGNOSTICS_ENV = {"NCCL_RUN_DIAGNOSTICS": "1", "NCCL_RUN_RAS_DIAGNOSTICS": "1"}
DIAGNOSTICS_SINCE = (2, 31)

# "host:pid:tid [cudaDev] NCCL INFO text", possibly behind srun's "3: " task label, torchrun's "[rank] " or --tee
# "[default0]:" prefix, Open MPI's --tag-output "[1,12]<stdout>:", or NCCL's "[time stamp] ". A WARN line names its
# source file before NCCL: "[3] plugin/net.cc:334 NCCL WARN ...".
_LINE = re.compile(r"^(?:\d+:\s*)?(?:\[[^\]]*\](?:<std(?:out|err)>)?:?\s*)*(?P<host>[^\s:\[]+):(?P<pid>\d+):\d+ \[(?P<dev>\d+)\] "
                   r"(?:\S+:\d+ )?NCCL (?:INFO|WARN) (?P<text>.*)$")
# "via NET/IB/0/GDRDMA", a plugin's "via NET/IBext_v8/3" or "via NET/AWS Libfabric/0/GDRDMA", and PXN's proxied
# "via NET/IB/0(8)/GDRDMA" (NCCL >= 2.12's net.cc prints the proxy rank in parentheses).
_VIA = re.compile(r"via NET/(?P<net>[A-Za-z][\w ]*?)/\d+(?:\(\d+\))?(?P<gdr>/GDRDMA)?")
# paths.cc: NCCL turns GPUDirect RDMA off for one GPU whose NIC is farther than NCCL_NET_GDR_LEVEL, whatever the HCA says.
_GPU_TOO_FAR = "GPU Direct RDMA Disabled for GPU"
_DEVICES = re.compile(r"\[\d+\](\S+?/(?:IB|RoCE))")
# The lines that say why NCCL chose as it did. NET/Plugin's own lines are not among them: with no external plugin
# installed (most hosts) every NCCL prints one ("NET/Plugin : dlerror=%s No plugin found (%s), using internal
# implementation" in 2.19-2.20, "NET/Plugin: Could not find:%s" from 2.22, "Failed to find ncclNetPlugin_v9 symbol."),
# and the internal IB and Socket transports follow. A plugin that loaded and failed says "Failed to initialize NET plugin
# %s" (2.28) or "Failed to initialize any NET plugin" (2.27).
_WHY = re.compile(r"NCCL_IB_DISABLE set|NET/IB : No device found|NET/IB.*(?:fail|error|Disabled)|NCCL_NET set"
                  r"|GPU Direct RDMA Disabled for GPU"
                  r"|Failed to initialize (?:any )?NET plugin", re.IGNORECASE)


def _rank(host: str, dev: int) -> RankTransport:
    return {"host": host, "device": dev, "network": None, "devices": [], "gdr": None, "plugin": None, "channels": None,
            "nccl_version": None, "reasons": []}


def parse_nccl_info(text: str, host: str) -> list[RankTransport]:
    """Each NCCL process's transport from its INFO lines in text (one host's output), in the order they first speak."""
    ranks: dict[str, RankTransport] = {}
    channels: dict[str, set[bool]] = {}  # per process: whether its IB channels said /GDRDMA
    too_far: set[str] = set()
    version = None
    for raw in text.splitlines():
        line = raw.strip()
        match = _LINE.match(line)
        if match is None:
            loose = re.search(r"NCCL version (\S+)", line)
            version = loose.group(1) if loose else version
            continue
        # One process may drive several GPUs (one thread each): a rank is a process and its device.
        pid = f"{match.group('pid')}/{match.group('dev')}"
        rank = ranks.setdefault(pid, _rank(host, int(match.group("dev"))))
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
        if _GPU_TOO_FAR in said:
            too_far.add(pid)
            rank["gdr"] = False
        elif "GPU Direct RDMA Enabled" in said and pid not in too_far:
            rank["gdr"] = True
        elif "GPU Direct RDMA Disabled" in said and rank["gdr"] is None:
            rank["gdr"] = False
        if via := _VIA.search(said):
            if rank["network"] is None:
                rank["network"] = via.group("net")
            if via.group("gdr") or is_ib(via.group("net")):  # a socket or OFI channel without /GDRDMA says nothing
                channels.setdefault(pid, set()).add(bool(via.group("gdr")))
        if _WHY.search(said) and said not in rank["reasons"] and len(rank["reasons"]) < 4:
            rank["reasons"].append(said)
    for pid, rank in ranks.items():
        rank["nccl_version"] = rank["nccl_version"] or version
        if pid in channels:  # the channels NCCL built say what it uses, whatever the HCA lines announced
            rank["gdr"] = True in channels[pid]
    return list(ranks.values())


def is_ib(network: str) -> bool:
    """NCCL's own IB transport or a plugin's (IBext, IBext_v8, ...), which take the same GPUDirect RDMA path."""
    return network.startswith("IB")


def expects_ib(record: HostRecord) -> list[str]:
    """The host's ACTIVE InfiniBand/RoCE ports, unless InfiniBand is switched off for NCCL there; empty: sockets expected."""
    nccl = record.facts["nccl"]
    settings = {**{k: v for conf in nccl["conf_files"].values() for k, v in conf.items()}, **nccl["env"]}
    if settings.get("NCCL_IB_DISABLE", "0").strip() == "1" or settings.get("NCCL_NET", "").lower() == "socket":
        return []
    return [f"{p['device']}:{p['port']}" for p in record.facts["net"]["infiniband"] if p["state"] == "ACTIVE"]


def judge_transport(records: Sequence[HostRecord], outputs: Mapping[str, str], reported: Sequence[str | None] = (),
                    diagnostics_requested: bool = False) -> tuple[list[Finding], TransportSection]:
    """PF841-PF844 from each host's output of a passing NCCL launch, and the report's account of it; reported: the
    NCCL version each rank's worker gave; diagnostics_requested: the launch set NCCL_DIAGNOSTICS_ENV."""
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
        if any(map(is_ib, networks)) and any(r["gdr"] is False for r in mine):
            without = sorted({f"GPU {r['device']}" for r in mine if r["gdr"] is False})
            distance = sorted({why for r in mine for why in r["reasons"] if _GPU_TOO_FAR in why})
            findings.append(Finding("PF842", Status.warn, name, f"NCCL uses InfiniBand without GPUDirect RDMA on "
                                    f"{', '.join(without[:8])}: their transfers are staged through host memory"
                                    + (f" ({'; '.join(distance[:2])})" if distance else ""),
                                    "load nvidia_peermem (or use dmabuf), disable ACS, set iommu=pt (PF822-PF824 say which); "
                                    "a GPU too far from its NIC needs a nearer NIC or NCCL_NET_GDR_LEVEL raised"))
    if len(set(chosen.values())) > 1:
        detail = ", ".join(f"{host}: {net}" for host, net in sorted(chosen.items())[:8])
        findings.append(Finding("PF843", Status.fail, CLUSTER, f"hosts chose different NCCL networks ({detail})",
                                "make every host's network the same (ports, plugin, NCCL_IB_* settings); mixed transports hang"))
    elif len(chosen) > 1:
        findings.append(Finding("PF843", Status.passed, CLUSTER, f"every host uses NET/{next(iter(chosen.values()))}"))
    expected: Literal["IB", "Socket"] = "IB" if any(expects_ib(r) for r in records) else "Socket"
    message = "; ".join(f"{host}: {net}" for host, net in sorted(chosen.items())[:8]) or "NCCL printed no network choice"
    versions = [*reported, *(r["nccl_version"] for r in ranks)]
    diagnostics = judge_diagnostics(records, outputs, versions, diagnostics_requested)
    if diagnostics is not None:
        findings += diagnostics_findings(diagnostics, [r.host.name for r in records])
    return findings, {"expected": expected, "message": message, "ranks": ranks, "diagnostics": diagnostics}


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


def nccl_version_tuple(version: str | None) -> tuple[int, ...] | None:
    """(2, 31, 2) from "2.31.2+cuda12.9" or "2.31.2"; None when it says no version."""
    match = re.match(r"\s*(\d+)\.(\d+)(?:\.(\d+))?", version or "")
    return tuple(int(part) for part in match.groups() if part is not None) if match else None


def has_diagnostics(versions: Sequence[str | None]) -> str | None:
    """The oldest of versions when every known one is 2.31 or newer (NCCL's diagnostics exist there); else None."""
    known = sorted((t, v) for v in versions if v and (t := nccl_version_tuple(v)) is not None)
    return known[0][1] if known and known[0][0][:2] >= DIAGNOSTICS_SINCE else None


def diagnostics_env(records: Sequence[HostRecord]) -> dict[str, str]:
    """NCCL_DIAGNOSTICS_ENV when every host's facts say torch loads NCCL 2.31 or newer; an older NCCL ignores the
    variable, but a mixed or unknown set gets none, so that nothing changes where NCCL has no diagnostics."""
    versions = [r.facts["torch"]["nccl_version"] for r in records]
    return dict(NCCL_DIAGNOSTICS_ENV) if versions and None not in versions and has_diagnostics(versions) else {}


# "host:pid NCCL DIAG text" (DIAG_PRINT in NCCL 2.31's src/include/diagnostics_log.h prints "%s:%d " first; the
# user guide's samples show the lines without it). torchrun's "[rank]" tee prefixes may come before.
_DIAG = re.compile(r"(?:^|[\s\]:])(?:[^\s:\[\]]+:\d+ )?NCCL DIAG (?P<text>.*)$")
_RESULT = re.compile(r"\[(?P<level>OK|INFO)\]\s+(?:(?P<check>[A-Za-z0-9 ]+?): )?(?P<said>.*)$")
_CLOSING = re.compile(r"(?:NCCL|RAS) diagnostics completed")
# NCCL's [INFO] is both "a failed verification or a check that could not be completed" and a note to review: the
# failures per check, in the words of NCCL's src/diagnostics/p2p.cc and ib_write_bw.cc. The bandwidth check's setup
# lines (ib_write_bw missing on a node, a socket-only network, "setup failed on rank N") and its outliers stay notes:
# the tool is optional and a rank off the median is slow, not broken. The RAS checks (GPU inventory, CUDA driver
# version, ECC, NVLink, NCCL environment) compare and never exercise a path: their [INFO] is a note too.
_FAILED = {"p2p": re.compile(r"(?<!cleanup )failed|mismatch|\b\d+/\d+ (?:directed|GPU-to-GPU)|returned -?\d+"),
           "net bw": re.compile(r"tool run (?:failed|timed out)|unable to complete in allocated time")}


def _failed(check: str, text: str) -> bool:
    pattern = _FAILED.get(check)
    return pattern is not None and pattern.search(text) is not None


def parse_nccl_diagnostics(text: str, host: str) -> tuple[list[NcclDiagnosticLine], list[str], bool]:
    """The result lines of NCCL's diagnostics reports (active and RAS) in one host's output, their closing lines, and
    whether any "NCCL DIAG" line was there at all."""
    results: list[NcclDiagnosticLine] = []
    closings: list[str] = []
    seen = False
    for raw in text.splitlines():
        match = _DIAG.search(raw.strip())
        if match is None:
            continue
        seen = True
        said = match.group("text").strip()
        if _CLOSING.match(said):
            closings.append(said)
        elif result := _RESULT.match(said):
            level: Literal["OK", "INFO"] = "OK" if result.group("level") == "OK" else "INFO"
            body = result.group("said").strip()
            # The report's host is the one whose output holds the line: NCCL's own "host:pid" is the machine's
            # hostname, which need not be the name the cluster config gives it.
            results.append({"host": host, "level": level, "check": result.group("check") or "",
                            "text": body, "failed": level == "INFO" and _failed(result.group("check") or "", body)})
    return results, closings, seen


def judge_diagnostics(records: Sequence[HostRecord], outputs: Mapping[str, str], versions: Sequence[str | None],
                      requested: bool) -> NcclDiagnostics | None:
    """The report's account of NCCL's diagnostics; None where the ranks' NCCL is older than 2.31 or says no version."""
    version = has_diagnostics(versions)
    if version is None:
        return None
    results: list[NcclDiagnosticLine] = []
    summaries: list[str] = []
    ran = False
    for record in records:
        mine, closing, seen = parse_nccl_diagnostics(outputs.get(record.host.name, ""), record.host.name)
        results += mine
        summaries += [line for line in closing if line not in summaries]
        ran = ran or seen
    return {"nccl_version": version, "requested": requested, "ran": ran, "summaries": summaries, "results": results}


def diagnostics_findings(diagnostics: NcclDiagnostics, hosts: Sequence[str]) -> list[Finding]:
    """PF844: fail per host whose report names a failure (NCCL's words: the GPU pair, its path, what to check), warn
    for [INFO] notes or a report that never came, pass when it ran and every check said [OK]."""
    where = hosts[0] if hosts else CLUSTER  # the master hosts rank 0, whose process prints the report
    if not diagnostics["requested"]:
        return [Finding("PF844", Status.unknown, CLUSTER, f"NCCL {diagnostics['nccl_version']} has its own diagnostics but "
                        "the hosts' facts did not say so before the launch, so they did not run",
                        "run `preflight check` again once every host's facts report torch's NCCL version")]
    if not diagnostics["ran"]:
        return [Finding("PF844", Status.warn, where, "NCCL_RUN_DIAGNOSTICS=1 was set but no 'NCCL DIAG' report came back "
                        "from rank 0's standard output", "run the application with NCCL_RUN_DIAGNOSTICS=1 on the master "
                        "and read its standard output")]
    findings: list[Finding] = []
    done = f" ({'; '.join(diagnostics['summaries'])})" if diagnostics["summaries"] else ""
    for host in dict.fromkeys(r["host"] for r in diagnostics["results"]):
        mine = [r for r in diagnostics["results"] if r["host"] == host]
        # Once per line: NCCL reports at every communicator init, and torch may make more than one.
        failed = list(dict.fromkeys(_said(r) for r in mine if r["failed"]))
        notes = list(dict.fromkeys(_said(r) for r in mine if r["level"] == "INFO" and not r["failed"]))
        if failed:
            findings.append(Finding("PF844", Status.fail, host, f"NCCL's own diagnostics failed: {' | '.join(failed[:4])}"
                                    + (f" (and {len(failed) - 4} more)" if len(failed) > 4 else ""),
                                    "see `preflight explain PF844`; NCCL's advice follows the ';' in its line"))
        elif notes:
            findings.append(Finding("PF844", Status.warn, host, f"NCCL's own diagnostics ask for a review: {' | '.join(notes[:4])}",
                                    "see `preflight explain PF844`"))
        else:
            passed = "; ".join(list(dict.fromkeys(_said(r) for r in mine))[:6])
            findings.append(Finding("PF844", Status.passed, host, f"NCCL's own diagnostics passed: {passed}{done}"))
    if not findings:
        findings.append(Finding("PF844", Status.passed, where, f"NCCL's own diagnostics ran with no result lines{done}"))
    return findings


def _said(line: NcclDiagnosticLine) -> str:
    return f"{line['check']}: {line['text']}" if line["check"] else line["text"]
