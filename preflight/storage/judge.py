"""The storage stage's judgement: what storage/probe.py printed on every host, turned into findings (PF901-PF910) and
the report's section. No I/O: it is tested on recorded output."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from preflight.checks.node import MIN_FREE_INODES
from preflight.findings import CLUSTER, Finding, Status, status_name, worst
from preflight.spec import PreflightConfig, StoragePath
from preflight.spread import outliers
from preflight.storage.contracts import StorageHost, StoragePathSection
from preflight.storage.wire import PathReport, StorageProbeOutput

# Filesystems that live on one machine only: a "shared" path on one of them is each host's own.
LOCAL_TYPES = frozenset({"tmpfs", "ramfs", "overlay", "devtmpfs", "aufs"})
_FULL = ("ENOSPC", "EDQUOT")
_DENIED = ("EACCES", "EPERM")
_NO_ANSWER = "see why the host did not answer; raise storage.timeout_s if it is slow"


@dataclass
class StorageRun:
    """What the stage's rounds brought back: each host's write round, and each shared path's read round."""

    hosts: list[str]  # every host the stage ran on, in the config's order
    written: dict[str, StorageProbeOutput]  # host -> its write round's output
    problems: dict[str, str]  # host -> why its write round brought back nothing
    seen: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # path -> host -> the hosts whose markers it read
    unread: dict[str, str] = field(default_factory=dict)  # host -> why its read round brought back nothing


def size(n: int | None) -> str:
    """Bytes as people read them: 8MiB, 1.5GiB."""
    if n is None:
        return "unknown"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f}{unit}" if value == int(value) or unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{n}B"


def _who(out: StorageProbeOutput) -> str:
    return f"{out['user'] or 'uid'} (uid {out['uid']})"


def _filesystem(report: PathReport | None) -> str:
    if report is None or report["fstype"] is None:
        return "unknown filesystem"
    return f"{report['fstype']} {report['source']}"


def _rate(report: PathReport, read: bool) -> float | None:
    """The write (or read) figure in GB/s; None when the test did not pass."""
    test = report["test"]
    if test is None or not test["ok"]:
        return None
    seconds = test["read_s"] if read else test["write_s"]
    return None if seconds is None else round(test["bytes"] / max(seconds, 1e-9) / 1e9, 6)


def host_findings(entry: StoragePath, out: StorageProbeOutput, report: PathReport) -> list[Finding]:
    """PF901-PF905 for one host's view of one path; a PF902 pass when it took the test."""
    host, path = out["host"], entry.path
    if report["error"] and report["test"] is None and report["exists"] and report["is_dir"]:
        return [Finding("PF910", Status.unknown, host, f"{path}: {report['error']}", "raise storage.timeout_s; see why the host is slow")]
    if not report["exists"] and report["error"]:  # stat failed otherwise than "no such file": a folder above it is closed
        return [Finding("PF902", Status.fail, host, f"{path} cannot be reached as {_who(out)}: {report['error']}",
                        "give the training user search (x) permission on every folder above the path")]
    if not report["exists"]:
        return [Finding("PF901", Status.fail, host, f"{path} is missing", "create the folder, or mount what should be there")]
    if not report["is_dir"]:
        return [Finding("PF901", Status.fail, host, f"{path} is not a folder", "point storage.paths at the folder the job writes into")]
    found: list[Finding] = []
    test = report["test"]
    if report["read_only"] or (test is not None and test["errno"] == "EROFS"):
        found.append(Finding("PF903", Status.fail, host, f"{path} is on a read-only mount ({_filesystem(report)})",
                             "remount it read-write (an NFS server or a disk error may have forced read-only)"))
    # A filesystem that counts no blocks (ramfs, some FUSE) says 0 free of 0: it has no limit to judge.
    if entry.min_free_bytes and report["total_bytes"] and report["free_bytes"] is not None and report["free_bytes"] < entry.min_free_bytes:
        found.append(Finding("PF904", Status.fail, host, f"{path} has {size(report['free_bytes'])} free of {size(report['total_bytes'])}"
                             f", less than the {size(entry.min_free_bytes)} asked (min_free_bytes)", "free space or grow the filesystem"))
    if report["total_inodes"] and report["free_inodes"] is not None and report["free_inodes"] < MIN_FREE_INODES:
        found.append(Finding("PF905", Status.fail, host, f"{path} has {report['free_inodes']} free inodes of {report['total_inodes']}",
                             "remove small files or grow the filesystem's inode table"))
    if test is not None and not test["ok"]:
        what = f"{test['step']}: {test['error']}" + (f" ({test['errno']})" if test["errno"] else "")
        if test["errno"] in _FULL:
            if not any(f.code == "PF904" for f in found):
                found.append(Finding("PF904", Status.fail, host, f"{path} filled up writing {size(test['bytes'])}: {what}",
                                     "free space or grow the filesystem (or the user's quota)"))
        elif test["errno"] != "EROFS":
            owner = f"; the folder is {report['owner'] or report['owner_uid']}'s, mode {report['mode']}" if test["errno"] in _DENIED else ""
            found.append(Finding("PF902", Status.fail, host, f"{path} is not writable as {_who(out)}: {what}{owner}",
                                 "give the training user write access to the folder (owner, group or ACL)"))
    if not found and test is not None:
        found.append(Finding("PF902", Status.passed, host, f"{path} writable as {_who(out)}: {_filesystem(report)}, "
                             f"{size(report['free_bytes'])} free, {size(test['bytes'])} written and read back"))
    return found


def sharing_findings(entry: StoragePath, reports: Mapping[str, PathReport], seen: Mapping[str, list[str]], order: Sequence[str]
                     ) -> tuple[list[Finding], list[list[str]]]:
    """PF906-PF908 for a shared path: the hosts grouped by whose markers they read. The largest group (on a tie, the one
    with the host first in the config, the master) is the shared filesystem; a host apart from it is on another one:
    it reads other files than the group, or the group cannot read its file."""
    path = entry.path
    writers = {h for h, r in reports.items() if r["marker"]}
    readers = {h: frozenset(s) & writers for h, s in seen.items() if h in writers}
    by_view: dict[frozenset[str], list[str]] = {}
    for host in sorted(readers, key=order.index):
        by_view.setdefault(readers[host], []).append(host)
    groups = sorted(by_view.values(), key=lambda g: (-len(g), order.index(g[0])))
    if not groups:
        return [], groups
    if len(writers) == 1:
        (host,) = writers
        if reports[host]["fstype"] in LOCAL_TYPES:
            message = (f"{path} is {_filesystem(reports[host])}, a filesystem of this host alone, where a shared one is expected; one "
                       "host cannot show whether it is shared")
            return [Finding("PF907", Status.warn, host, message, "mount the shared filesystem there")], groups
        return [], groups
    main = groups[0]
    view = readers[main[0]]
    apart = [h for h in sorted(writers, key=order.index) if h not in main and (h not in view or h in readers)]
    if not apart:
        findings = [Finding("PF906", Status.passed, CLUSTER, f"{path} is one filesystem: {len(main)} host(s) read the files "
                            f"of all {len(writers)} that wrote one")]
        sources: dict[str, list[str]] = {}
        for host in sorted(writers, key=order.index):
            sources.setdefault(f"{reports[host]['fstype']} {reports[host]['source']}", []).append(host)
        if len(sources) > 1:
            said = "; ".join(f"{', '.join(hosts)}: {source}" for source, hosts in sources.items())
            findings.append(Finding("PF908", Status.warn, CLUSTER, f"{path} is shared but mounted from different sources ({said})",
                                    "mount the same export on every host, as the job's other hosts do"))
        return findings, groups
    findings = []
    for host in apart:
        theirs = ", ".join(sorted(view, key=order.index))
        message = (f"{path} on {host} is another filesystem ({_filesystem(reports[host])}) than on {', '.join(main)} "
                   f"({_filesystem(reports[main[0]])}): ")
        if host in readers:
            mine = ", ".join(sorted(readers[host], key=order.index)) or "no host"
            message += f"{host} reads the files of {mine}, and they of {theirs}"
        else:
            message += f"they cannot read its file (they read those of {theirs})"
        if reports[host]["fstype"] in LOCAL_TYPES:
            findings.append(Finding("PF907", Status.fail, host, message + f"; {reports[host]['fstype']} is this host's alone",
                                    "mount the shared filesystem on the path (see the mount on the other hosts)"))
        else:
            findings.append(Finding("PF906", Status.fail, host, message, "mount the shared filesystem there, as the other hosts do"))
    return findings, groups


def slow_findings(path: str, figures: Mapping[str, float], what: str, config: PreflightConfig) -> tuple[list[Finding], list[str]]:
    """PF909 for each host whose figure is an outlier (the bandwidth rule: median and MAD, preflight.spread)."""
    found = outliers(figures, config.collective.outlier_mad_k, config.collective.outlier_fraction)
    findings = [Finding("PF909", Status.warn, host, f"{path} is slow on {host}: {what} {figures[host]:.3f} GB/s against the median "
                        f"{found.median or 0:.3f} GB/s of {found.count} hosts", "look at the host's disk, mount options and load")
                for host in found.outliers]
    return findings, found.outliers


def _host_entry(host: str, mine: list[Finding], out: StorageProbeOutput | None, report: PathReport | None, write: float | None,
                read: float | None, sees: list[str] | None) -> StorageHost:
    first = next((f for f in mine if f.status == worst([g.status for g in mine])), None)
    test = report["test"] if report else None
    return {"host": host, "status": status_name(worst([f.status for f in mine])), "message": first.message if first else "",
            "user": out["user"] if out else None, "uid": out["uid"] if out else None,
            "fstype": report["fstype"] if report else None, "source": report["source"] if report else None,
            "read_only": report["read_only"] if report else None, "free_bytes": report["free_bytes"] if report else None,
            "total_bytes": report["total_bytes"] if report else None, "free_inodes": report["free_inodes"] if report else None,
            "total_inodes": report["total_inodes"] if report else None, "write_GBps": write, "read_GBps": read,
            "read_uncached": test["uncached"] if test and test["ok"] else None, "sees": sees}


def judge_path(entry: StoragePath, run: StorageRun, config: PreflightConfig) -> tuple[list[Finding], StoragePathSection]:
    """Every finding about one path and its part of the report."""
    findings: list[Finding] = []
    reports: dict[str, PathReport] = {}
    per_host: dict[str, list[Finding]] = {}
    for host in run.hosts:
        out = run.written.get(host)
        report = next((r for r in out["paths"] if r["path"] == entry.path), None) if out else None
        if out is None or report is None:
            why = run.problems.get(host, "no result for the path")
            per_host[host] = [Finding("PF910", Status.unknown, host, f"{entry.path}: the storage test did not run: {why}", _NO_ANSWER)]
            continue
        reports[host] = report
        per_host[host] = host_findings(entry, out, report)
    groups: list[list[str]] = []
    seen = run.seen.get(entry.path, {})
    if entry.shared:
        for host in run.unread:
            if host in reports and reports[host]["marker"]:
                per_host[host].append(Finding("PF910", Status.unknown, host,
                                              f"{entry.path}: no answer from the read round: {run.unread[host]}", _NO_ANSWER))
        more, groups = sharing_findings(entry, reports, seen, run.hosts)
        findings += [f for f in more if f.host == CLUSTER]
        for f in more:
            if f.host != CLUSTER:
                per_host[f.host].append(f)
    write = {h: rate for h, r in reports.items() if (rate := _rate(r, read=False)) is not None}
    read = {h: rate for h, r in reports.items() if (rate := _rate(r, read=True)) is not None}
    for figures, what in ((write, "write"), (read, "read")):
        more, _slow = slow_findings(entry.path, figures, what, config)
        for f in more:
            per_host[f.host].append(f)
    write_spread = outliers(write, config.collective.outlier_mad_k, config.collective.outlier_fraction).summary()
    read_spread = outliers(read, config.collective.outlier_mad_k, config.collective.outlier_fraction).summary()
    hosts: list[StorageHost] = []
    for host in run.hosts:
        mine = per_host[host]
        findings += mine
        report = reports.get(host)
        out = run.written.get(host)
        hosts.append(_host_entry(host, mine, out, report, write.get(host), read.get(host),
                                 sorted(seen[host]) if entry.shared and host in seen else None))
    status = status_name(worst([f.status for f in findings]))
    section: StoragePathSection = {"path": entry.path, "shared": entry.shared, "min_free_bytes": entry.min_free_bytes,
                                   "write_bytes": entry.write_bytes, "status": status, "groups": groups,
                                   "write_spread": write_spread, "read_spread": read_spread, "hosts": hosts}
    return findings, section


def judge_storage(run: StorageRun, paths: Sequence[StoragePath], config: PreflightConfig) -> tuple[list[Finding], list[StoragePathSection]]:
    """Every path's findings and sections."""
    findings: list[Finding] = []
    sections: list[StoragePathSection] = []
    for entry in paths:
        more, section = judge_path(entry, run, config)
        findings += more
        sections.append(section)
    return findings, sections
