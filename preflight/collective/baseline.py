"""The baseline: this run's bandwidth against the cluster's own history (PF613), so that a check says "12% below this
cluster's median of the last 10 passing runs" rather than only pass or fail.

Compared with: the last ``collective.baseline_runs`` (10) reports in ``state_dir/history`` that passed, of the same
cluster name, the same set of hosts, the same backend and the same ranks per host (another set moves busbw by itself).
The figures, each matched on its op, size and host:

- the sweep's rows (busbw of the slowest rank), for each op from its largest size down to a sixteenth of it: the
  bandwidth-bound end of the sweep; smaller messages measure latency and vary from run to run;
- each host's figure at the sweep's largest size (``collective.per_host``);
- each host's best pair in the pairwise stage.

Each figure's baseline is the median of the same figure in those runs, and needs at least MIN_RUNS of them; a figure
more than ``collective.baseline_tolerance_percent`` (15) below its baseline, and beyond the history's own spread, is
marked below. The spread is the bandwidth rule's (preflight.spread): median * e^(-k * mad_log) of the past
figures, ``collective.outlier_mad_k`` (4), as a percentage below their median (``noise_percent``). A history whose runs
agree (a real fabric: a few percent from run to run) leaves the tolerance to decide; one whose runs scatter (hosts that
share their CPUs with other work: 40% below to 49% above in one day of a 2-core machine's runs) says that a drop inside
that scatter is no evidence of a change. The warnings rest on
evidence that repeats: the cluster's, when an op's compared sizes are at their median more than the tolerance below
(each size is a short sample of the same links: one size's dip decides nothing); a host's, when its best pair is. A
host's sweep figure is shown, not judged: in a synchronous collective every host has the cluster's own figure. The floors
of ``collective.profiles`` are PF604's, which says how far above or below the floor the cluster is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, cast

from preflight.collective.contracts import BaselineFigure, BaselineSection, CollectiveSection
from preflight.contracts import ReportHead
from preflight.findings import CLUSTER, Finding, Status
from preflight.history import passing_reports
from preflight.spec import PreflightConfig
from preflight.spread import mad_log, median

MIN_RUNS = 3  # past runs a figure needs before it has a baseline
SWEEP_SPAN = 16  # the sweep's sizes compared: from each op's largest down to a sixteenth of it
FigureKey = tuple[Literal["sweep", "host", "pairwise"], str, int, str]  # (source, op, bytes, host)


def figures(section: CollectiveSection) -> dict[FigureKey, float]:
    """The bandwidth figures of a collective section (this run's, or a kept report's of any schema: what it lacks,
    it lacks)."""
    found: dict[FigureKey, float] = {}
    largest: dict[str, int] = {}
    for row in section["sweep"]:
        largest[row["op"]] = max(row["bytes"], largest.get(row["op"], 0))
    for row in section["sweep"]:
        if row["bytes"] * SWEEP_SPAN >= largest[row["op"]]:
            found[("sweep", row["op"], row["bytes"], CLUSTER)] = float(row["busbw_min_GBps"])
    for spread in section.get("per_host") or []:
        for host in spread["hosts"]:
            found[("host", spread["op"], spread["bytes"], host["host"])] = float(host["busbw_GBps"])
    pairwise = section.get("pairwise")
    if pairwise and pairwise["status"] != "skipped":
        for entry in pairwise["hosts"]:
            if entry["best_GBps"] is not None:
                found[("pairwise", pairwise["op"], pairwise["bytes"], entry["host"])] = float(entry["best_GBps"])
    return found


def _same_launch(section: CollectiveSection) -> tuple[str, list[str], int | None]:
    return section["backend"], sorted(section["hosts"]), section["nproc_per_node"]


def _collective(report: ReportHead) -> CollectiveSection | None:
    """A kept report's collective section, None where it has none: the history reads only every report's head. Its
    inside may be of another version, which the readers catch (KeyError, TypeError, ValueError)."""
    section = cast(dict[str, object], report).get("collective")  # a kept report, read as JSON
    return cast(CollectiveSection, section) if isinstance(section, dict) else None


def _past_figures(config: PreflightConfig, section: CollectiveSection) -> list[dict[FigureKey, float]]:
    """The figures of the cluster's last passing runs of the same launch, newest first; a kept report this version
    cannot read is passed over."""
    wanted = _same_launch(section)

    def match(report: ReportHead) -> bool:
        try:
            collective = _collective(report)
            return collective is not None and _same_launch(collective) == wanted
        except (KeyError, TypeError):
            return False

    past = []
    for report in passing_reports(config.state_dir, config.cluster.name, config.collective.baseline_runs, match):
        try:
            collective = _collective(report)
            if collective is not None:
                past.append(figures(collective))
        except (KeyError, TypeError, ValueError):
            continue
    return past


def _figure_name(figure: BaselineFigure) -> str:
    what = {"sweep": "busbw", "host": "this host's busbw", "pairwise": "this host's best pair"}[figure["source"]]
    return f"{figure['op']} {figure['bytes']:,} B {what} {figure['GBps']:.3g} GB/s"


def _phrase(figure: BaselineFigure) -> str:
    change = figure["change_percent"]
    direction = "below" if change < 0 else "above"
    return (f"{_figure_name(figure)}: {abs(change):.0f}% {direction} this cluster's median of the last {figure['runs']} passing runs "
            f"({figure['median_GBps']:.3g} GB/s)")


def compare_with_history(config: PreflightConfig, section: CollectiveSection) -> tuple[list[Finding], BaselineSection]:
    """PF613 for this run's figures against the cluster's history, and the report's baseline section."""
    tolerance = config.collective.baseline_tolerance_percent
    past = _past_figures(config, section)
    compared: list[BaselineFigure] = []
    for key, value in figures(section).items():
        values = [f[key] for f in past if key in f]
        if len(values) < MIN_RUNS:
            continue
        middle = median(values)
        change = (value - middle) / middle * 100 if middle > 0 else 0.0
        noise = _noise_percent(values, middle, config.collective.outlier_mad_k)
        source, op, size, host = key
        compared.append({"source": source, "op": op, "bytes": size, "host": host, "GBps": round(value, 6),
                         "median_GBps": round(middle, 6), "runs": len(values), "change_percent": round(change, 1),
                         "noise_percent": round(noise, 1), "below": change < -max(tolerance, noise)})
    baseline: BaselineSection = {"runs": len(past), "wanted": config.collective.baseline_runs, "tolerance_percent": tolerance,
                                 "message": "", "figures": compared}
    if not compared:
        baseline["message"] = (f"no baseline yet: {len(past)} passing run(s) of this cluster with the same hosts, backend and ranks "
                               f"per host in {config.state_dir}/history; {MIN_RUNS} needed")
        return [Finding("PF613", Status.passed, CLUSTER, baseline["message"])], baseline
    findings = _below(compared, tolerance)
    worst = min(compared, key=lambda f: f["change_percent"])
    scattered = [f for f in compared if f["change_percent"] < -tolerance and not f["below"]]
    spread = (f" or, {len(scattered)} of them, within their history's own spread (up to "
              f"{max(f['noise_percent'] for f in scattered):.0f}% below its median)" if scattered else "")
    within = f"{len(compared)} bandwidth figure(s) within {tolerance:g}% of their baseline{spread}; the lowest, {_phrase(worst)}"
    baseline["message"] = _phrase(worst) if findings else within
    if not findings:
        findings.append(Finding("PF613", Status.passed, CLUSTER, within))
    return findings, baseline


def _noise_percent(values: Sequence[float], middle: float, k: float) -> float:
    """How far below their median the past figures' own spread reaches: 1 - e^(-k * mad_log), as a percentage."""
    return (1 - math.exp(-k * mad_log(values, middle))) * 100 if middle > 0 else 0.0


def _below(compared: Sequence[BaselineFigure], tolerance: float) -> list[Finding]:
    """A warning for the cluster per op whose sweep sizes are, at their median, more than tolerance below their baselines
    and beyond their history's spread at its median (one size's dip is one short sample: a real drop, a degraded fabric,
    shows at every bandwidth-bound size); and one per host whose best pair is below. A host's sweep figure is no
    verdict: in a synchronous collective every host shows the cluster's own figure."""
    findings = []
    ops: dict[str, list[BaselineFigure]] = {}
    for figure in compared:
        if figure["source"] == "sweep":
            ops.setdefault(figure["op"], []).append(figure)
    for op, rows in ops.items():
        middle = median(f["change_percent"] for f in rows)
        noise = median(f["noise_percent"] for f in rows)
        if len(rows) >= 2 and middle < -max(tolerance, noise):
            sizes = ", ".join(f"{f['bytes']:,} B {f['change_percent']:+.0f}%" for f in sorted(rows, key=lambda f: f["bytes"]))
            beyond = f", beyond its history's own spread ({noise:.0f}% below its median)" if noise > tolerance else ""
            findings.append(Finding("PF613", Status.warn, CLUSTER,
                                    f"{op} busbw {abs(middle):.0f}% below this cluster's median of the last {rows[0]['runs']} passing "
                                    f"runs, the median of its {len(rows)} largest sizes ({sizes}){beyond}",
                                    "see `preflight explain PF613`: compare with the kept reports in state_dir/history"))
    for figure in compared:
        if figure["source"] == "pairwise" and figure["below"]:
            findings.append(Finding("PF613", Status.warn, figure["host"], _phrase(figure),
                                    "see `preflight explain PF613`: compare with the kept reports in state_dir/history"))
    return findings
