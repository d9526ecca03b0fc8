"""The report: one JSON document per run (schema-validated), a terminal table, an exit code."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from preflight import __version__
from preflight.collective.contracts import SpeedSection
from preflight.compose import Spec
from preflight.contracts import CollectiveSection, HostEntry, Report, ReportStatus, Spread, StageSections
from preflight.errors import ExitCode
from preflight.findings import CLUSTER, Finding, Status, ordered, status_name, worst
from preflight.history import history_dir, new_path, rotate
from preflight.records import HostOutcome
from preflight.resources import validator
from preflight.storage.contracts import StorageSection

REPORT_SCHEMA_VERSION = 7
# Schema 3 added the connectivity section; a schema 2 report (no such key) is still read by emit-launch. Schema 4 added
# the collective's per_host, pairwise and baseline; a schema 2 or 3 report has none of them. Schema 5 added the
# collective's transport (the network NCCL chose), the dcgm section, and hosts' facts of facts schema 2. Schema 6 added
# the storage section, an internal error's traceback to its finding (PF009), which no reader needs, and the
# collective's speed (the neighbour test, the compute probe, each host's start-up, what the speed was judged against).
# Schema 7 gave the speed section the shape of one judgement: each link's source and repeat, each host's sending and
# receiving, the compute probe's slices, the settings applied, and what the run could resolve.
READABLE_REPORT_SCHEMAS = (2, 3, 4, 5, 6, 7)
LATEST = "report.json"  # in the state folder: the last report, which emit-launch reads

EXIT_CODES: dict[ReportStatus, int] = {"pass": ExitCode.PASSED, "fail": ExitCode.FAILED, "incomplete": ExitCode.INCOMPLETE}


def overall_status(findings: Sequence[Finding]) -> ReportStatus:
    """fail if anything failed; incomplete if something could not be checked; else pass."""
    statuses = {f.status for f in findings}
    if Status.fail in statuses:
        return "fail"
    if Status.unknown in statuses:
        return "incomplete"
    return "pass"


def build_report(spec: Spec, outcomes: Sequence[HostOutcome], findings: Sequence[Finding], started: dt.datetime, elapsed_s: float,
                 sections: StageSections | None = None) -> Report:
    """Assemble the report from the facts stage's outcomes, every finding, and the stages' sections by name (None for
    each stage not among them)."""
    every = ordered([*(o.problem for o in outcomes if o.problem is not None), *findings])
    statuses: dict[str, list[Status]] = {}
    for finding in every:
        statuses.setdefault(finding.host, []).append(finding.status)
    hosts: list[HostEntry] = []
    for outcome in outcomes:
        hosts.append({
            "name": outcome.host.name,
            "address": outcome.host.address,
            "status": status_name(worst(statuses.get(outcome.host.name, []))),
            "reason": outcome.problem.message if outcome.problem else None,
            "facts": outcome.record.facts if outcome.record else None,
        })
    status = overall_status(every)
    report: Report = {
        "schema": REPORT_SCHEMA_VERSION,
        "preflight_version": __version__,
        "created_at": started.isoformat(timespec="seconds"),
        "elapsed_s": round(elapsed_s, 3),
        "cluster": spec.config.cluster.name,
        "playbook": spec.config.playbook.name,
        "spec_digest": spec.digest,
        "config_digests": spec.group_digests(),
        "status": status,
        "exit_code": EXIT_CODES[status],
        "hosts": hosts,
        "findings": [f.to_json() for f in every],
        **every_section(sections or StageSections()),
    }
    validator("report").validate(report)
    return report


def every_section(sections: StageSections) -> StageSections:
    """sections with every stage's key, in the schema's order: None for each stage absent from it."""
    return cast(StageSections, {name: sections.get(name) for name in StageSections.__annotations__})


def report_text(report: Report) -> str:
    """The report as the JSON text that is saved and printed."""
    return json.dumps(report, indent=1, sort_keys=False) + "\n"


def save_report(report: Report, state_dir: str, text: str | None = None, keep: int = 100) -> Path:
    """Write the report (as text, when it is already rendered) into the state folder atomically (a temporary file,
    then rename): the latest, and a copy in the history, which keeps the newest `keep` (preflight.history)."""
    folder = Path(state_dir)
    folder.mkdir(parents=True, exist_ok=True)
    text = text or report_text(report)
    history = history_dir(folder)
    history.mkdir(exist_ok=True)
    for path in (new_path(history, report), folder / LATEST):
        write_atomically(path, text)
    rotate(history, keep)
    return folder / LATEST


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    """Never leave a half-written file: write beside it, flush, then rename over it."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(handle, mode)  # mkstemp's 0600 would make a launch file unreadable to the job's user
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "hang": "bold red", "unknown": "magenta", "incomplete": "magenta"}


def render(report: Report, show_all: bool = False) -> Any:
    """The report as rich renderables: findings table (root cause first) and a summary line."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    shown = [f for f in report["findings"] if show_all or f["status"] != "pass"]
    hidden = len(report["findings"]) - len(shown)
    # Four columns, the fix under its finding: at 80 columns a fifth squeezed both into a third of the width each.
    # Text wraps between words; only a word longer than the column (a very long path) is folded.
    table = Table(show_edge=False, pad_edge=False, expand=False)
    for column in ("status", "host", "code", "finding"):
        table.add_column(column, overflow="fold", no_wrap=column in ("status", "code"))
    for finding in shown:
        where = "(cluster)" if finding["host"] == CLUSTER else finding["host"]
        text = Text(finding["message"])
        if finding["remedy"]:
            text.append("\nfix: ", style="bold").append(finding["remedy"], style="dim")
        table.add_row(Text(finding["status"], style=_STYLE[finding["status"]]), where, finding["code"], text)
    summary = verdict_line(report)
    parts: list[Any] = [table] if table.row_count else []
    connectivity = report.get("connectivity")  # absent from schema 2 reports
    if connectivity and connectivity["status"] != "skipped":
        parts.append(Text.assemble(("connectivity ", "bold"), (connectivity["status"].upper(), _STYLE.get(connectivity["status"], "")),
                                   f"  {connectivity['message']} ({connectivity['elapsed_s']:.1f} s)"))
    collective = report["collective"]
    if collective and collective["status"] != "skipped":
        # The collective's outcome in one line, whatever the findings filter hides: it is the headline of a full check.
        verified = collective["verify"]
        detail = f" ({verified['bytes_per_rank']:,} B per rank, {verified['wrong']} wrong)" if verified else ""
        parts.append(Text.assemble(("collective ", "bold"), (collective["status"].upper(), _STYLE.get(collective["status"], "")),
                                   f"  {collective['message']}{detail}"))
    if collective and collective["sweep"] and (collective["world_size"] or 0) < 2:
        parts.append(Text.assemble(("bandwidth ", "bold"), "not measured: with one rank no byte crosses between processes "
                                   "(busbw is 0 by definition); run two ranks or more, e.g. training.nproc_per_node=2"))
    elif collective and collective["sweep"]:
        sweep = Table(title=f"bandwidth ({collective['backend']}, {collective['world_size']} ranks; GB/s as nccl-tests)",
                      show_edge=False, pad_edge=False)
        for column in ("op", "bytes", "algbw mean", "busbw min", "busbw mean"):
            sweep.add_column(column, justify="right")
        for row in collective["sweep"]:
            sweep.add_row(row["op"], f"{row['bytes']:,}", f"{row['algbw_mean_GBps']:.3f}", f"{row['busbw_min_GBps']:.3f}",
                          f"{row['busbw_mean_GBps']:.3f}")
        parts.append(sweep)
    if collective:
        parts += _speed_parts(collective)
        parts += _localization_parts(collective)
        transport = collective.get("transport")
        if transport:
            parts.append(Text.assemble(("NCCL network ", "bold"), f"{transport['message']} (expected {transport['expected']})"))
            diagnostics = transport.get("diagnostics")  # absent in schema 5 reports written before NCCL 2.31's diagnostics
            if diagnostics:
                results = diagnostics["results"]
                worst = "not run" if not diagnostics["requested"] else "fail" if any(r["failed"] for r in results) else \
                    "warn" if not diagnostics["ran"] or any(r["level"] == "INFO" for r in results) else "pass"
                said = "; ".join(diagnostics["summaries"]) or ("ran" if diagnostics["ran"] else "no report came back")
                parts.append(Text.assemble(("NCCL diagnostics ", "bold"), (worst.upper(), _STYLE.get(worst, "")),
                                           f"  NCCL {diagnostics['nccl_version']}: {said} (PF844)"))
    dcgm = report.get("dcgm")  # absent before schema 5
    if dcgm:
        line = "; ".join(f"{h['host']}: {h['status']}" for h in dcgm["hosts"][:8]) + (" ..." if len(dcgm["hosts"]) > 8 else "")
        statuses = {h["status"] for h in dcgm["hosts"]}
        worst = "fail" if "fail" in statuses else "not run" if statuses <= {"not run"} else \
            "warn" if statuses & {"timed out", "error"} else "pass"
        parts.append(Text.assemble(("dcgm ", "bold"), (worst.upper(), _STYLE.get(worst, "")), f"  dcgmi diag -r {dcgm['level']}: {line}"))
    storage = report.get("storage")  # absent before schema 6
    if storage:
        parts += _storage_parts(storage)
    if hidden:
        parts.append(Text(f"{hidden} passed check(s) not shown (--all shows them)", style="dim"))
    parts.append(summary)
    return Group(*parts)


def verdict_line(report: Report) -> Any:
    """The last line of the table alone (`--quiet`): the verdict, the cluster, its hosts, the time taken."""
    from rich.text import Text

    counts: dict[str, int] = {}
    for entry in report["hosts"]:
        counts[entry["status"]] = counts.get(entry["status"], 0) + 1
    per_status = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    collective = report["collective"]
    speed = collective.get("speed") if collective else None  # absent before schema 6
    # A pass says what it measured the speed against; without a reference the hosts were only judged against each other.
    judged = f"; {speed['reference_message']}" if speed and speed["reference"] == "none" else ""
    return Text.assemble((report["status"].upper(), _STYLE[report["status"]]),
                         f"  {report['cluster']}: {len(report['hosts'])} host(s) ({per_status}), playbook {report['playbook']}, "
                         f"{report['elapsed_s']:.1f} s{judged}")


def console(stderr: bool = False) -> Any:
    """A rich console that styles only a terminal (or FORCE_COLOR) and never under NO_COLOR (https://no-color.org);
    its width is the terminal's (COLUMNS, else 80 when not a terminal)."""
    from rich.console import Console

    # Rich alone only drops the colours under NO_COLOR and keeps bold and dim: no styles at all is what users ask for.
    return Console(stderr=stderr, color_system=None if os.environ.get("NO_COLOR") else "auto")


SHOWN_ROWS = 16  # beyond this many hosts or pairs, the tables show only the outliers (and the pairs measured again)


def _versus(value: float | None, spread: Spread) -> str:
    """A figure against its median, as a percentage."""
    return _ratio(value, spread["median_GBps"])


def _spread_caption(spread: Spread, what: str) -> str:
    if spread["median_GBps"] is None:
        return f"no {what}"
    factor = math.exp(spread["mad_log"] or 0.0)
    caption = f"median over {spread['count']} {what} {spread['median_GBps']:.3g} GB/s, typically within x{factor:.2f} of it"
    threshold = spread["threshold_GBps"]
    return caption + (f"; outlier below {threshold:.3g} GB/s" if threshold is not None else "; too few to name an outlier")


def _storage_parts(storage: StorageSection) -> list[Any]:
    """A table per storage path: each host's filesystem, free space and throughput against the median over hosts."""
    from rich.table import Table
    from rich.text import Text

    from preflight.storage.judge import size

    parts: list[Any] = []
    for path in storage["paths"]:
        # One host's figure is its own median: a caption would only say so.
        caption = (f"write: {_spread_caption(path['write_spread'], 'hosts')}; read: {_spread_caption(path['read_spread'], 'hosts')}"
                   if max(path["write_spread"]["count"], path["read_spread"]["count"]) > 1 else None)
        table = Table(title=f"storage {path['path']} ({'shared, ' if path['shared'] else ''}{size(path['write_bytes'])} per host)",
                      caption=caption, show_edge=False, pad_edge=False)
        for column in ("host", "filesystem", "free", "write GB/s", "vs median", "read GB/s", "vs median", ""):
            table.add_column(column, justify="left" if column in ("host", "filesystem", "") else "right")
        for host in path["hosts"]:
            if len(path["hosts"]) <= SHOWN_ROWS or host["status"] != "pass":
                rates = [(f"{v:.3f}" if v is not None else "", _versus(v, spread))
                         for v, spread in ((host["write_GBps"], path["write_spread"]), (host["read_GBps"], path["read_spread"]))]
                table.add_row(host["host"], f"{host['fstype'] or ''} {host['source'] or ''}".strip(),
                              size(host["free_bytes"]) if host["free_bytes"] is not None else "", *rates[0], *rates[1],
                              Text(host["status"], style=_STYLE[host["status"]]) if host["status"] != "pass" else "")
        parts.append(table)
    return parts


def _speed_parts(collective: CollectiveSection) -> list[Any]:
    """Each host beside the others from the full set's launch: its sending and receiving (its best link before schema 7),
    its compute, its start-up. Absent from reports before schema 6."""
    from rich.table import Table
    from rich.text import Text

    speed = collective.get("speed")
    if not speed:
        return []
    on_gpu = collective["backend"] == "nccl"
    unit, scale = ("TFLOPS", 1.0) if on_gpu else ("GFLOPS", 1000.0)
    links = {h["host"]: h for h in speed["hosts"]}
    compute = {c["host"]: c for c in speed["compute"]}
    link_median, compute_median = speed["host_stats"]["median"], speed["compute_stats"]["median"]
    verdicts = speed_verdicts(speed)
    table = Table(title=f"speed per host (neighbour test {speed['bytes']:,} B per message and its repeats, compute probe, start-up)",
                  caption=f"median best link {_figure(link_median)} GB/s, median compute {_figure(compute_median, scale)} {unit}",
                  show_edge=False, pad_edge=False)
    for column in ("host", "sends GB/s", "receives GB/s", "vs median", unit, "vs median", "import s", ""):
        table.add_column(column, justify="left" if column == "host" else "right")
    for start in speed["starts"]:
        host = start["host"]
        link, rate, verdict = links.get(host), compute.get(host), verdicts[host]
        # Schema 6 reports carry each host's best link only.
        sends = link.get("send_GBps", link["best_GBps"]) if link else None
        receives = link.get("recv_GBps", link["best_GBps"]) if link else None
        worse = min((v for v in (sends, receives) if v is not None), default=None)
        if len(speed["starts"]) <= SHOWN_ROWS or verdict:
            table.add_row(host, _figure(sends), _figure(receives), _ratio(worse, link_median),
                          _figure(rate["tflops"] if rate else None, scale), _ratio(rate["tflops"] if rate else None, compute_median),
                          "" if start["import_s"] is None else f"{start['import_s']:.1f}",
                          Text(", ".join(verdict), style=_STYLE["fail"]) if verdict else "")
    return [table, Text.assemble(("speed ", "bold"), f"{speed['message']}; {speed['reference_message']}")]


def speed_verdicts(speed: SpeedSection) -> dict[str, list[str]]:
    """Per host, what the speed section names it for: slow network, slow compute, slow start (none: an empty list)."""
    verdicts: dict[str, list[str]] = {start["host"]: [] for start in speed["starts"]}
    for link in speed["hosts"]:
        if link["verdict"] != "ok":
            # Which way is slow, where the section says (schema 7): a host that only sends slowly is named so.
            ways = [way for way, key in (("sending", "sending"), ("receiving", "receiving")) if link.get(key) in ("warn", "fail")]
            named = f"{link['verdict']} ({' and '.join(ways)})" if ways and link["verdict"] == "slow network" else link["verdict"]
            verdicts.setdefault(link["host"], []).append(named)
    for host in speed["slow_compute"]:
        if "slow compute" not in verdicts.setdefault(host, []):
            verdicts[host].append("slow compute")
    for start in speed["starts"]:
        if start["straggler"]:
            verdicts[start["host"]].append("slow start")
    return verdicts


def _figure(value: float | None, scale: float = 1.0) -> str:
    return "" if value is None else f"{value * scale:.3g}"


def _ratio(value: float | None, median: float | None) -> str:
    return "" if value is None or not median else f"{(value - median) / median * 100:+.0f}%"


def _localization_parts(collective: CollectiveSection) -> list[Any]:
    """Each host's sweep figure and the pairwise stage's pairs and hosts beside their medians, outliers marked; and
    the comparison with the cluster's history. Absent from reports before schema 4."""
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = []
    slow = Text("slow", style=_STYLE["fail"])
    spreads = collective.get("per_host") or []
    if spreads and len(spreads[0]["hosts"]) > 1:
        table = Table(title="per host (sweep's largest size, slowest rank; a synchronous collective evens them out)",
                      caption="; ".join(f"{s['op']}: {_spread_caption(s['spread'], 'hosts')}" for s in spreads),
                      show_edge=False, pad_edge=False)
        table.add_column("host")
        for spread in spreads:
            table.add_column(f"{spread['op']} {spread['bytes']:,} B", justify="right")
            table.add_column("vs median", justify="right")
        table.add_column("")
        rows: dict[str, list[Any]] = {}
        for k, spread in enumerate(spreads):
            for figure in spread["hosts"]:
                row = rows.setdefault(figure["host"], [figure["host"], *[""] * (2 * len(spreads)), ""])
                row[1 + 2 * k], row[2 + 2 * k] = f"{figure['busbw_GBps']:.3f}", _versus(figure["busbw_GBps"], spread["spread"])
                if figure["outlier"]:
                    row[-1] = slow
        for row in rows.values():
            if len(rows) <= SHOWN_ROWS or row[-1]:
                table.add_row(*row)
        parts.append(table)
    pairwise = collective.get("pairwise")
    if pairwise and pairwise["status"] != "skipped":
        table = Table(title=f"pairwise ({pairwise['op']} {pairwise['bytes']:,} B, {pairwise['rounds']} round(s), {pairwise['mode']})",
                      caption=_spread_caption(pairwise["pair_spread"], "pairs"), show_edge=False, pad_edge=False)
        for column in ("pair", "round", "GB/s", "vs median", ""):
            table.add_column(column, justify="left" if column == "pair" else "right")
        # Measured again: in the re-pair mode every pair after round 1 (a suspect with a known-good host); in a round-robin
        # a pair measured twice (once more, to tell a slow link from noise).
        times = Counter(frozenset(pair["hosts"]) for pair in pairwise["pairs"])
        for pair in pairwise["pairs"]:
            again = pair["round"] > 1 if pairwise["mode"] == "re-pair" else times[frozenset(pair["hosts"])] > 1
            if len(pairwise["pairs"]) <= SHOWN_ROWS or pair["outlier"] or again:
                rate = f"{pair['busbw_GBps']:.3f}" if pair["status"] == "pass" else pair["status"]
                table.add_row("-".join(pair["hosts"]), str(pair["round"]), rate, _versus(pair["busbw_GBps"], pairwise["pair_spread"]),
                              slow if pair["outlier"] else "")
        parts.append(table)
        hosts = Table(title="pairwise per host (its best pair)", caption=_spread_caption(pairwise["host_spread"], "hosts"),
                      show_edge=False, pad_edge=False)
        for column in ("host", "pairs", "best GB/s", "vs median", ""):
            hosts.add_column(column, justify="left" if column == "host" else "right")
        for entry in pairwise["hosts"]:
            if len(pairwise["hosts"]) <= SHOWN_ROWS or entry["verdict"] != "ok":
                best = "" if entry["best_GBps"] is None else f"{entry['best_GBps']:.3f}"
                hosts.add_row(entry["host"], str(entry["pairs"]), best, _versus(entry["best_GBps"], pairwise["host_spread"]),
                              slow if entry["verdict"] == "slow" else entry["verdict"] if entry["verdict"] != "ok" else "")
        parts.append(hosts)
        parts.append(Text.assemble(("pairwise ", "bold"), (pairwise["status"].upper(), _STYLE.get(pairwise["status"], "")),
                                   f"  {pairwise['message']} ({pairwise['elapsed_s']:.1f} s)"))
    baseline = collective.get("baseline")
    if baseline:
        below = any(f["below"] for f in baseline["figures"])
        parts.append(Text.assemble(("baseline ", "bold"), ("BELOW" if below else "OK", _STYLE["warn" if below else "pass"]),
                                   f"  {baseline['message']}"))
    return parts
