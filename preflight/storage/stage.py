"""Running the storage test: preflight/storage/probe.py on every host at once, over the run's connections, as the
training user (the user each host's connection logs in as), in up to three rounds:

1. ``write``: every path's facts and write test on every host; on a shared path each host also leaves a marker file;
2. ``read`` (shared paths only): every host reads every host's marker by name;
3. ``clean`` (where a marker was written, or a host did not answer the first round): every answering host removes every
   host's files of the run that it can reach (a host that wrote and then hung leaves nothing on a shared path).

A host that reads no other host's marker is on another filesystem. The rounds are separate commands so that every host
has written before any reads, and every host has read before any removes. Each round is cut at storage.timeout_s; an
interrupt leaves the files to the run's reaper, which removes ``.preflight-<tag>-*`` under the configured paths."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Any, cast

from preflight import bundle
from preflight.findings import Finding
from preflight.gather import host_python, outputs_by_host
from preflight.interrupt import Activity, hosts_phrase
from preflight.records import HostRecord
from preflight.spec import PreflightConfig
from preflight.stages import StageContext, StageResult
from preflight.storage.contracts import StorageSection
from preflight.storage.judge import StorageRun, judge_storage
from preflight.storage.wire import ProbePath, Round, StorageProbeConfig, StorageProbeOutput
from preflight.transport import CommandResult, RemoteCommand, Transport

# A round's script starts no new path after this share of storage.timeout_s, so that the one under way ends in time.
START_SHARE = 0.5


def probe_source() -> str:
    """The storage test's bundle, sent to each host on stdin."""
    return bundle.text(bundle.STORAGE)


def _parse(result: CommandResult) -> StorageProbeOutput:
    """The script's one JSON line; ValueError when it is not one."""
    lines = result.stdout.strip().splitlines()
    data: Any = json.loads(lines[-1]) if lines else None  # raw JSON from a host, checked for the keys the judge reads
    if not isinstance(data, dict) or not all(k in data for k in ("host", "round", "user", "uid", "paths", "markers")):
        raise ValueError("the storage test printed no result")
    return cast(StorageProbeOutput, data)


def _round(config: PreflightConfig, transport: Transport, records: Sequence[HostRecord], name: Round, nonce: str,
           paths: list[ProbePath], hosts: list[str]) -> tuple[dict[str, StorageProbeOutput], dict[str, str]]:
    """One round on the given records' hosts at once (hosts: every host of the stage, whose files they look for): each
    host's output, or why there is none."""
    timeout_s = config.storage.timeout_s
    commands = []
    for record in records:
        probe: StorageProbeConfig = {"host": record.host.name, "round": name, "nonce": nonce, "hosts": hosts, "paths": paths,
                                     "deadline_s": timeout_s * START_SHARE}
        argv = [host_python(record.host), "-", json.dumps(probe, separators=(",", ":"))]
        commands.append(RemoteCommand(host=record.host, argv=argv, stdin=probe_source(), timeout_s=timeout_s))
    return outputs_by_host(transport, commands, _parse)


def run_storage_stage(config: PreflightConfig, transport: Transport, records: Sequence[HostRecord],
                      activity: Activity | None = None) -> tuple[list[Finding], StorageSection]:
    """Every configured path tried from every reached host at once; findings and the report's section."""
    began = time.monotonic()
    nonce = uuid.uuid4().hex[:10]
    paths: list[ProbePath] = [{"path": p.path, "shared": p.shared, "write_bytes": p.write_bytes} for p in config.storage.paths]
    if activity is not None:
        activity.now("storage", f"the storage test of {len(paths)} path(s) on {hosts_phrase(len(records))}")
    hosts = [r.host.name for r in records]
    written, problems = _round(config, transport, records, "write", nonce, paths, hosts)
    run = StorageRun(hosts=hosts, written=written, problems=problems)
    shared = [p for p in paths if p["shared"]]
    answered = [r for r in records if r.host.name in written]
    marked = any(p["marker"] for out in written.values() for p in out["paths"])
    if shared and marked:
        read, run.unread = _round(config, transport, answered, "read", nonce, shared, hosts)
        for host, out in read.items():
            for entry in out["markers"]:
                run.seen.setdefault(entry["path"], {})[host] = entry["seen"]
    if answered and (marked or problems):
        _round(config, transport, answered, "clean", nonce, paths if problems else shared, hosts)
    findings, sections = judge_storage(run, config.storage.paths, config)
    return findings, {"timeout_s": config.storage.timeout_s, "elapsed_s": round(time.monotonic() - began, 3), "paths": sections}


class StorageStage:
    """The configured paths tried from every reached host (PF901-PF910); skipped, with no section, when none is configured."""

    name = "storage"
    codes = tuple(f"PF{n}" for n in range(901, 911))
    needs_records = True
    reads: tuple[str, ...] = ()

    def run(self, context: StageContext) -> StageResult[StorageSection]:
        paths = context.config.storage.paths
        if not paths:
            return StageResult([])
        context.transport.remove_on_stop([p.path for p in paths])  # an interrupt's reaper removes the test's files
        findings, section = run_storage_stage(context.config, context.transport, context.records, context.activity)
        return StageResult(findings, section)


    def text(self, section: StorageSection) -> list[Any]:
        from preflight.storage.render import text
        return text(section)

    def html(self, section: StorageSection) -> str:
        from preflight.storage.render import html
        return html(section)

STAGE = StorageStage()
