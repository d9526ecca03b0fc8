"""The sweep's bandwidth: every rank's rows summarised per (op, size) for the report, judged against the hardware
profiles, and a passing run's peak."""

from __future__ import annotations

from collections.abc import Sequence

from preflight.collective.judge import RunOutcome
from preflight.contracts import SweepRow
from preflight.findings import CLUSTER, Finding, Status
from preflight.records import HostRecord
from preflight.spec import PreflightConfig
from preflight.worker import ResultEvent, SweepResult


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


def peak_busbw(outcome: RunOutcome) -> float | None:
    """A passing run's best busbw over the sweep (each size's slowest rank); None without a sweep or a pass."""
    rows = summarize_sweep(outcome.results) if outcome.status == "pass" else []
    return max((row["busbw_min_GBps"] for row in rows), default=None)


def bandwidth_findings(config: PreflightConfig, records: Sequence[HostRecord], nproc: int, sweep: list[SweepRow]) -> list[Finding]:
    """Compare the largest messages' busbw with the matching hardware profile; none: report only."""
    gpu_names = {d["name"] for r in records for d in r.facts["gpu"]["devices"]}
    profile = next((p for p in config.collective.profiles
                    if p.gpus_per_host == nproc and gpu_names and all(p.gpu_name in n for n in gpu_names)), None)
    if not sweep:
        return []
    if profile is None:
        best = max(sweep, key=lambda r: (r["bytes"], r["busbw_min_GBps"]))
        return [Finding("PF604", Status.passed, CLUSTER,
                        f"no bandwidth profile for this hardware: report only (largest message {best['bytes']} B: "
                        f"{best['op']} busbw {best['busbw_min_GBps']} GB/s min)")]
    findings = []
    for op, floor in (("all_reduce", profile.all_reduce_busbw_gbps), ("all_gather", profile.all_gather_busbw_gbps)):
        rows = [r for r in sweep if r["op"] == op and r["bytes"] >= profile.min_bytes]
        if not floor or not rows:
            continue
        worst = min(rows, key=lambda r: r["busbw_min_GBps"])
        status = Status.passed if worst["busbw_min_GBps"] >= floor else Status.fail
        findings.append(Finding("PF604", status, CLUSTER,
                                f"{op} busbw {worst['busbw_min_GBps']} GB/s at {worst['bytes']} B (profile {profile.gpu_name} x"
                                f"{profile.gpus_per_host}: >= {floor} GB/s)",
                                "" if status == Status.passed else "check NVLink/NVSwitch health (nvidia-smi nvlink -s), "
                                "NCCL_P2P/NCCL_IB settings and PCIe/NIC topology (nvidia-smi topo -m)"))
    return findings
