"""The report as metrics for node_exporter's textfile collector (`check --prometheus FILE`, `gate --prometheus FILE`).

node_exporter reads every `*.prom` file in its `--collector.textfile.directory` at each scrape, so the file is
written beside itself and renamed over (a scrape never sees half of it). Names follow Prometheus' conventions: the
`preflight_` prefix, base units (seconds, bytes), `_seconds` and `_bytes_per_second` suffixes, and labels rather
than names for what varies (host, code, op, size).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from pathlib import Path

from preflight.contracts import FindingStatus
from preflight.errors import InputError
from preflight.report import write_atomically
from preflight.report_shape import Report

# A finding's status as a number, worse is higher, so that `preflight_finding_status >= 2` alerts on a failure or a
# host that could not be checked.
STATUS_VALUES: dict[FindingStatus, int] = {"pass": 0, "warn": 1, "unknown": 2, "fail": 3}
GIGA = 1e9  # the report's GB/s are nccl-tests' decimal gigabytes


def prometheus_path(text: str) -> Path:
    """The file to write, which node_exporter reads only when it ends in .prom; bad input (exit 2) otherwise."""
    path = Path(text)
    if path.suffix != ".prom":
        raise InputError(f"--prometheus: {text} must end in .prom (node_exporter's textfile collector reads only those)")
    return path


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: dict[str, str]) -> str:
    return "{" + ",".join(f'{name}="{_escape(value)}"' for name, value in pairs.items()) + "}"


def _number(value: float) -> str:
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class _Metrics:
    """Samples grouped by metric, each metric written once with its HELP and TYPE (the format requires it)."""

    def __init__(self) -> None:
        self.help: dict[str, str] = {}
        self.samples: dict[str, list[str]] = {}

    def gauge(self, name: str, help_text: str, samples: Iterable[tuple[dict[str, str], float]]) -> None:
        lines = [f"{name}{_labels(labels)} {_number(value)}" for labels, value in samples]
        if lines:
            self.help[name] = help_text
            self.samples.setdefault(name, []).extend(lines)

    def text(self) -> str:
        out = []
        for name, lines in self.samples.items():
            out += [f"# HELP {name} {self.help[name]}", f"# TYPE {name} gauge", *lines]
        return "\n".join(out) + "\n"


def metrics_text(report: Report, command: str) -> str:
    """The report's verdict, findings, bandwidth and storage figures in the Prometheus text exposition format."""
    run = {"command": command, "cluster": report["cluster"]}
    finished = dt.datetime.fromisoformat(report["created_at"]).timestamp() + report["elapsed_s"]
    metrics = _Metrics()
    metrics.gauge("preflight_last_run_timestamp_seconds", "When the last run finished, in seconds since the epoch.",
                  [(run, round(finished, 3))])
    metrics.gauge("preflight_run_duration_seconds", "How long the last run took.", [(run, report["elapsed_s"])])
    metrics.gauge("preflight_exit_code", "The last run's exit code: 0 passed, 1 a check failed, 3 incomplete.",
                  [(run, report["exit_code"])])
    metrics.gauge("preflight_hosts", "Hosts of the last run, by their worst finding's status.",
                  [({**run, "status": s}, sum(1 for h in report["hosts"] if h["status"] == s)) for s in STATUS_VALUES])
    worst: dict[tuple[str, str], int] = {}
    for finding in report["findings"]:
        key = (finding["code"], finding["host"])
        worst[key] = max(worst.get(key, 0), STATUS_VALUES[finding["status"]])
    metrics.gauge("preflight_finding_status",
                  "Each finding code's status on each host (host * is the whole cluster): 0 pass, 1 warn, 2 unknown, 3 fail.",
                  [({**run, "code": code, "host": host}, value) for (code, host), value in sorted(worst.items())])
    collective = report["collective"]
    if collective and (collective["world_size"] or 0) > 1:  # one rank has no bus bandwidth to report
        rows = collective["sweep"]
        metrics.gauge("preflight_collective_busbw_bytes_per_second",
                      "Bus bandwidth of the sweep, mean over ranks, by op and message size (as nccl-tests).",
                      [({**run, "op": r["op"], "size_bytes": str(r["bytes"])}, r["busbw_mean_GBps"] * GIGA) for r in rows])
        metrics.gauge("preflight_collective_busbw_min_bytes_per_second",
                      "Bus bandwidth of the sweep, the slowest rank, by op and message size.",
                      [({**run, "op": r["op"], "size_bytes": str(r["bytes"])}, r["busbw_min_GBps"] * GIGA) for r in rows])
        metrics.gauge("preflight_host_busbw_bytes_per_second",
                      "Each host's bus bandwidth at the sweep's largest size (its slowest rank), by op.",
                      [({**run, "host": f["host"], "op": s["op"], "size_bytes": str(s["bytes"])}, f["busbw_GBps"] * GIGA)
                       for s in collective.get("per_host") or [] for f in s["hosts"]])
    storage = report.get("storage")  # absent before schema 6
    if storage:
        hosts = [(p["path"], h) for p in storage["paths"] for h in p["hosts"]]
        for what, help_text in (("write", "write_bytes written and fsynced"), ("read", "read back past the page cache")):
            metrics.gauge(f"preflight_storage_{what}_bytes_per_second", f"Each host's storage path throughput: {help_text}.",
                          [({**run, "host": h["host"], "path": path}, rate * GIGA) for path, h in hosts
                           if (rate := h["write_GBps"] if what == "write" else h["read_GBps"]) is not None])
        metrics.gauge("preflight_storage_free_bytes", "Free space under each host's storage path, for the training user.",
                      [({**run, "host": h["host"], "path": path}, h["free_bytes"]) for path, h in hosts if h["free_bytes"] is not None])
    return metrics.text()


def write_metrics(report: Report, command: str, path: Path) -> None:
    """Write the metrics file atomically (a temporary file beside it, then rename)."""
    write_atomically(path, metrics_text(report, command))
