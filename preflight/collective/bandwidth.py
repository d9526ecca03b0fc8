"""The sweep's bandwidth: every rank's rows summarised per (op, size) for the report, judged against the hardware
profiles, each host's figure beside the median over hosts, and a passing run's peak."""

from __future__ import annotations

from collections.abc import Sequence

from preflight.collective.contracts import HostFigure, HostSpread, SweepRow
from preflight.collective.judge import RunOutcome
from preflight.collective.wire import ResultEvent, SweepResult
from preflight.findings import CLUSTER, Finding, Status
from preflight.records import HostRecord
from preflight.spec import BandwidthProfile, PreflightConfig
from preflight.spread import outliers


def summarize_sweep(results: Sequence[ResultEvent]) -> list[SweepRow]:
    """Per (op, size): busbw min and mean over ranks, algbw mean, as the report's table."""
    table: dict[tuple[str, int], list[SweepResult]] = {}
    for result in results:
        for row in result["sweep"]:
            table.setdefault((row["op"], row["bytes"]), []).append(row)
    rows: list[SweepRow] = []
    for (op, size), entries in sorted(table.items()):
        # JSON may carry a whole rate as an integer; the report's rates are floats.
        busbw = [float(e["busbw_GBps"]) for e in entries]
        algbw = [float(e["algbw_GBps"]) for e in entries]
        rows.append({"op": op, "bytes": size, "ranks": len(entries), "busbw_min_GBps": round(min(busbw), 3),
                     "busbw_mean_GBps": round(sum(busbw) / len(busbw), 3), "algbw_mean_GBps": round(sum(algbw) / len(algbw), 3)})
    return rows


def host_spreads(results: Sequence[ResultEvent], k: float, fraction: float) -> list[HostSpread]:
    """Per op, at its largest size: each host's busbw (its slowest rank) and time (its slowest rank's), with the median
    and MAD over hosts and the hosts below min(median - k * MAD, fraction * median) marked.

    In a synchronous collective every rank waits for the slowest, so every host shows about the same time: a host stands
    out here only when it is slow on its own side (its ranks' copies, its PCIe). The pairwise stage is what names a slow
    host or link (preflight.collective.pairwise)."""
    rows: dict[tuple[str, int], dict[str, list[SweepResult]]] = {}
    for result in results:
        for row in result["sweep"]:
            rows.setdefault((row["op"], row["bytes"]), {}).setdefault(result["host"], []).append(row)
    largest: dict[str, int] = {}
    for op, size in rows:
        largest[op] = max(size, largest.get(op, 0))
    spreads: list[HostSpread] = []
    for op, size in sorted(largest.items()):
        per_host = rows[(op, size)]
        busbw = {host: min(float(r["busbw_GBps"]) for r in ranks) for host, ranks in per_host.items()}
        found = outliers(busbw, k, fraction)
        hosts: list[HostFigure] = [{"host": host, "ranks": len(ranks), "busbw_GBps": round(busbw[host], 6),
                                    "time_us": round(max(float(r["time_us"]) for r in ranks), 3), "outlier": host in found.outliers}
                                   for host, ranks in per_host.items()]
        spreads.append({"op": op, "bytes": size, "spread": found.summary(), "hosts": hosts})
    return spreads


def peak_busbw(outcome: RunOutcome) -> float | None:
    """A passing run's best busbw over the sweep (each size's slowest rank); None without a sweep or a pass."""
    rows = summarize_sweep(outcome.results) if outcome.status == "pass" else []
    return max((row["busbw_min_GBps"] for row in rows), default=None)


def matching_profile(config: PreflightConfig, records: Sequence[HostRecord], nproc: int) -> BandwidthProfile | None:
    """The hardware profile of these hosts' GPUs and ranks per host, if one is configured."""
    gpu_names = {d["name"] for r in records for d in r.facts["gpu"]["devices"]}
    return next((p for p in config.collective.profiles
                 if p.gpus_per_host == nproc and gpu_names and all(p.gpu_name in n for n in gpu_names)), None)


def bandwidth_findings(profile: BandwidthProfile | None, sweep: list[SweepRow], planned_max: int) -> list[Finding]:
    """Compare the largest messages' busbw with the matching hardware profile; none: report only.

    The profile's floors hold from its min_bytes on. When the sweep stopped below that size (the adaptive sweep stops
    once busbw has plateaued; a degraded link plateaus early), the floor is judged at the largest size reached, and the
    finding says so: after a plateau, larger messages would gain under 5% per doubling, so the floor fails there; when
    the sweep was cut by its own largest size (planned_max) before any plateau, busbw may still grow, so it warns."""
    if not sweep:
        return []
    if profile is None:
        best = max(sweep, key=lambda r: (r["bytes"], r["busbw_min_GBps"]))
        return [Finding("PF604", Status.passed, CLUSTER,
                        f"no bandwidth profile for this hardware: report only (largest message {best['bytes']} B: "
                        f"{best['op']} busbw {best['busbw_min_GBps']} GB/s min)")]
    findings = []
    for op, floor in (("all_reduce", profile.all_reduce_busbw_gbps), ("all_gather", profile.all_gather_busbw_gbps)):
        reached = [r for r in sweep if r["op"] == op]
        rows = [r for r in reached if r["bytes"] >= profile.min_bytes]
        if not floor or not reached:
            continue
        rule, failing = "", Status.fail
        if not rows:
            rows = [max(reached, key=lambda r: r["bytes"])]
            plateaued = rows[0]["bytes"] < planned_max
            rule = (f" (the sweep stopped at {rows[0]['bytes']:,} B, below the profile's {profile.min_bytes:,} B: "
                    + ("busbw had plateaued, or one iteration took 20 times its time budget, so the floor is judged at "
                       "the largest size reached)" if plateaued else
                       "its largest size, collective.sweep_max_bytes; busbw may still grow, so a shortfall warns)"))
            failing = Status.fail if plateaued else Status.warn
        worst = min(rows, key=lambda r: r["busbw_min_GBps"])
        status = Status.passed if worst["busbw_min_GBps"] >= floor else failing
        change = (worst["busbw_min_GBps"] - floor) / floor * 100
        findings.append(Finding("PF604", status, CLUSTER,
                                f"{op} busbw {worst['busbw_min_GBps']} GB/s at {worst['bytes']} B: {abs(change):.0f}% "
                                f"{'below' if change < 0 else 'above'} the profile {profile.gpu_name} x{profile.gpus_per_host}'s "
                                f"floor of {floor} GB/s{rule}",
                                "" if status == Status.passed else "check NVLink/NVSwitch health (nvidia-smi nvlink -s), "
                                "NCCL_P2P/NCCL_IB settings and PCIe/NIC topology (nvidia-smi topo -m)"))
    return findings
