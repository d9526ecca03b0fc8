"""The collective stage: the full set's launch (repeated as the playbook says), then the culprits when it fails; the
findings and the report's collective section."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, cast

from preflight.collective.bandwidth import bandwidth_findings, host_spreads, matching_profile, peak_busbw, summarize_sweep
from preflight.collective.baseline import compare_with_history
from preflight.collective.contracts import PAIRWISE, SWEEP, CollectiveSection, IsolationSection, RepeatRun
from preflight.collective.isolate import intra_node_findings, isolate
from preflight.collective.judge import RunOutcome, lost_findings
from preflight.collective.nccl_network import NCCL_INFO_ENV, diagnostics_env, judge_transport
from preflight.collective.pairwise import in_launch_plan, run_pairwise
from preflight.collective.run import Collective, SweepPlan, configured_sweep, neighbour_bytes
from preflight.collective.speed_rails import judge_rails, rails_section
from preflight.collective.speed_report import findings as speed_findings
from preflight.collective.speed_report import judged_against, pairwise_section
from preflight.collective.speed_report import section as speed_section
from preflight.connectivity.contracts import ConnectivitySection
from preflight.connectivity.judge import blamed_hosts
from preflight.contracts import BackendName
from preflight.errors import Incomplete
from preflight.findings import CLUSTER, Finding, Status
from preflight.interrupt import Activity
from preflight.launch import LaunchError
from preflight.records import HostRecord, host_rails, resolve_backend
from preflight.spec import Backend, PreflightConfig
from preflight.stages import StageContext, StageResult
from preflight.transport import Transport


def _section(config: PreflightConfig, backend: Backend, hosts: list[str]) -> CollectiveSection:
    return {"backend": cast(BackendName, backend.value), "status": "skipped", "hosts": hosts, "master": None,
            "port": config.network.master_port, "nproc_per_node": None, "world_size": None, "message": "", "verify": None,
            "sweep": [], "isolation": None}


def not_run(config: PreflightConfig, backend: Backend, records: Sequence[HostRecord], why: str,
            fix: str = "fix what the connectivity findings name, then check again") -> StageResult[CollectiveSection]:
    """The stage's account when an earlier stage showed it cannot pass: skipped, and why, as an unknown PF601."""
    section = _section(config, backend, [r.host.name for r in records if r.facts["torch"]["installed"]])
    section["message"] = why
    return StageResult([Finding("PF601", Status.unknown, CLUSTER, why, fix)],
                       section)


class CollectiveStage:
    """torchrun across the reached hosts with the launch emit-launch will write (the playbook's sweep and pairwise
    stages are parts of it); not run after a failed connectivity test, and without the hosts the facts stage found
    starved of CPU."""

    name = "collective"
    codes = ("PF601", "PF602", "PF604", "PF605", "PF606", "PF607", "PF608", "PF613", "PF620", "PF621", "PF622", "PF623",
             "PF624", "PF841", "PF842", "PF843", "PF844")
    needs_records = True
    reads = ("facts", "connectivity")

    def run(self, context: StageContext) -> StageResult[CollectiveSection]:
        # The connectivity stage's section is its StageResult's type.
        connectivity = cast("ConnectivitySection | None", context.sections.get("connectivity"))
        records = list(context.records)
        if connectivity is not None and connectivity["status"] == "fail":
            tested = context.findings.get("connectivity", ())
            blamed = blamed_hosts(tested, context.config.cluster.master)
            if blamed is None:
                # torchrun across paths known to be broken would only wait out its deadlines, then blame the set.
                named = dict.fromkeys(f"{f.code} on {f.host}" if f.host != CLUSTER else f.code for f in tested if f.status == Status.fail)
                return not_run(context.config, context.backend, records, f"not run: the connectivity test failed ({', '.join(named)})")
            # The others' paths are proven: the launch runs on them, so the report proves the set emit-launch keeps once
            # it leaves the blamed hosts out.
            records = [r for r in records if r.host.name not in blamed]
        # A host whose cgroup holds it to a fraction of a CPU (PF206) would make every launch wait on its torch start,
        # then blame its network: it is named already, and the launch proves the set emit-launch keeps without it. The
        # master stays: it hosts the store, and without it no launch runs at all.
        starved = {f.host for f in context.findings.get("facts", ()) if f.code == "PF206" and f.status == Status.fail}
        records = [r for r in records if r.host.name not in starved or r.host.name == context.config.cluster.master]
        # A host with fewer GPUs than ranks (PF207) fails its launch in init with "invalid device ordinal", which the
        # collective would blame on the host's hardware or network: it is left out, and without the master nothing runs.
        short = {f.host: f.message for f in context.findings.get("facts", ()) if f.code == "PF207" and f.status == Status.fail}
        if context.config.cluster.master in short:
            return not_run(context.config, context.backend, records,
                           f"not run: PF207 on {context.config.cluster.master}: {short[context.config.cluster.master]}",
                           "start one rank per GPU (training.nproc_per_node), then check again")
        records = [r for r in records if r.host.name not in short]
        return run_collective(context.config, context.transport, resolve_backend(records, context.config), records, context.activity)


    def text(self, section: CollectiveSection) -> list[Any]:
        from preflight.collective.render import text
        return text(section)

    def html(self, section: CollectiveSection) -> str:
        from preflight.collective.render import html
        return html(section)

STAGE = CollectiveStage()


def run_collective(config: PreflightConfig, transport: Transport, backend: Backend, records: Sequence[HostRecord],
                   activity: Activity | None = None) -> StageResult[CollectiveSection]:
    """The full set (the master first: it hosts the store), then isolation when it fails; the findings and the report
    section. Incomplete when the master's rendezvous port is taken (by another check on the same cluster, say): no
    launch can tell anything then."""
    master = config.cluster.master
    usable = [r for r in sorted(records, key=lambda r: r.host.name != master) if r.facts["torch"]["installed"]]
    section = _section(config, backend, [r.host.name for r in usable])
    if not usable or usable[0].host.name != master:
        section["message"] = "the master could not be checked or has no torch: no collective"
        return StageResult([Finding("PF601", Status.unknown, CLUSTER, section["message"], "fix the master host first")], section)
    collective = Collective(config, transport, backend, usable, activity)
    interrupted = False
    try:
        collective.stage()
        return _run_staged(config, collective, usable, section)
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        # An interrupt's cleanup (HostRouter.stop) removes the folders after killing what runs from them, within its own
        # deadline; close() here would wait on the hosts unbounded by it.
        if not interrupted:
            collective.close()


def _run_staged(config: PreflightConfig, collective: Collective, usable: list[HostRecord],
                section: CollectiveSection) -> StageResult[CollectiveSection]:
    """The full set's runs on the hosts the worker reached, and what follows their outcome."""
    master = config.cluster.master
    findings = [Finding("PF601", Status.unknown, name, f"the worker could not be copied: {why}", "check the host's /tmp (PF209) and python")
                for name, why in collective.unstaged.items()]
    hosts = [r.host.name for r in usable if r.host.name in collective.staged]
    if master not in hosts:
        section["message"] = "the worker could not be copied to the master: no collective"
        return StageResult(findings, section)
    port = config.network.master_port or collective.free_port(master)
    if not port:
        section["message"] = f"no free port found on {master} for the rendezvous"
        return StageResult([*findings, Finding("PF601", Status.unknown, master, section["message"], "set network.master_port")], section)
    section["port"] = port
    # A port someone else holds would only fail the rendezvous after its deadline, and the splitting then blame the set.
    holder = collective.port_holder(master, port) if config.network.master_port else None
    if holder is not None:
        raise _port_in_use(config, master, port, holder)
    info_env = _nccl_info_env(collective, [r for r in usable if r.host.name in hosts])
    try:
        sweep = configured_sweep(config, collective.backend) if SWEEP in config.playbook.stages else None
        sweep = in_launch_plan(config, collective.backend, hosts, sweep)
        outcome, runs = _repeat(collective, hosts, port, sweep, config.playbook.repeats, info_env)
    except LaunchError as e:
        section["message"] = str(e)
        return StageResult([*findings, Finding("PF601", Status.fail, e.host, str(e), "give the host an IPv4 address on its interface")],
                           section)
    if outcome.port_taken:
        # Taken between the check above and torchrun's start: another check started at the same moment.
        raise _port_in_use(config, master, port, collective.port_holder(master, port) or "another process (free again now)")
    section.update({"master": outcome.launch.master, "nproc_per_node": outcome.launch.nproc_per_node,
                    "world_size": outcome.launch.nnodes * outcome.launch.nproc_per_node, "status": outcome.status,
                    "message": outcome.message, "phase": outcome.phase, "repeats": runs})
    if outcome.status == "pass":
        findings += _after_pass(config, collective, usable, hosts, port, outcome, info_env, sweep, section)
    else:
        findings += _after_failure(config, collective, hosts, port, outcome, section)
    return StageResult(findings, section)


def _nccl_info_env(collective: Collective, staged: list[HostRecord]) -> dict[str, str]:
    """On nccl, NCCL's INFO lines of the network it chose, captured on every rank of the full set's runs; and from NCCL
    2.31 on, its own checks of paths and setup at init, which rank 0 prints (PF844)."""
    if collective.backend != Backend.nccl:
        return {}
    return {**NCCL_INFO_ENV, **diagnostics_env(staged)}


def _after_pass(config: PreflightConfig, collective: Collective, usable: list[HostRecord], hosts: list[str], port: int,
                outcome: RunOutcome, info_env: dict[str, str], sweep: SweepPlan | None, section: CollectiveSection) -> list[Finding]:
    """A passed full set: the verified bytes, the sweep against the profiles, NCCL's network, then the speed judge's one
    judgement of everything the launch measured of each host and link (the neighbour test, the pairwise stage's rounds,
    the repeats, compute, start-up) beside the cluster's history, and what the speed was judged against."""
    verified = outcome.results[0]["verify"]
    section["verify"] = {"bytes_per_rank": verified["bytes"], "wrong": 0, "ranks": len(outcome.results)}
    section["sweep"] = summarize_sweep(outcome.results)
    findings = [Finding("PF601", Status.passed, CLUSTER, outcome.message)]
    section["transport"] = None
    if collective.backend == Backend.nccl:
        more, section["transport"] = judge_transport(
            [r for r in usable if r.host.name in hosts], outcome.outputs, [r["nccl"] for r in outcome.results],
            diagnostics_requested="NCCL_RUN_DIAGNOSTICS" in info_env)
        findings += more
    profile = matching_profile(config, usable, outcome.launch.nproc_per_node)
    findings += bandwidth_findings(profile, section["sweep"], max(sweep.sizes, default=0) if sweep else 0)
    c = config.collective
    # Each host's sweep figure beside the others': the report's table, and one of the history's figures. A synchronous
    # collective runs every rank at the slowest's pace, so it is no verdict of its own: the speed judge names hosts.
    section["per_host"] = host_spreads(outcome.results, c.outlier_mad_k, c.outlier_fraction)
    launched = [r for r in usable if r.host.name in hosts]
    # On rails each rail is judged on its own, its links against its median (speed_rails).
    rails = {r.host.name: host_rails(r.host, r.facts, config) for r in launched} if outcome.launch.rails else {}
    found, per_rail = judge_rails(config, collective.backend, launched, outcome.results, profile, rails)
    section["speed"] = speed = speed_section(found, collective.backend)
    if per_rail:
        speed["rails"] = rails_section(per_rail, found.cpu_explains)
    rounds = sweep.pair_rounds if sweep else []
    section["pairwise"] = None
    if PAIRWISE in config.playbook.stages and len(hosts) > 1:
        if rounds:
            section["pairwise"] = pairwise_section(found, rounds, neighbour_bytes(config, collective.backend))
        else:
            # No neighbour test to carry the rounds (collective.neighbour_time_s 0): the stage's launches of its own.
            more, section["pairwise"] = run_pairwise(config, collective, hosts, port)
            findings += more
    history, section["baseline"] = compare_with_history(config, section)
    findings += speed_findings(found, collective.backend, pairwise=bool(rounds), history=history, rails=per_rail)
    speed["reference"], speed["reference_message"] = judged_against(profile, section["sweep"], section.get("baseline"),
                                                                    len(launched))
    return findings


def _after_failure(config: PreflightConfig, collective: Collective, hosts: list[str], port: int, outcome: RunOutcome,
                   section: CollectiveSection) -> list[Finding]:
    """A failed full set: PF602 for wrong bytes, else PF601; on nccl each host alone; then the culprits by splitting. A full
    set that lost a host has no verdict: the lost hosts are unknown, and nothing is split (it would only blame them)."""
    if outcome.lost:
        return [Finding("PF601", Status.unknown, CLUSTER, outcome.message, "check again once every host answers"),
                *lost_findings(outcome.lost, "during the collective")]
    code = "PF602" if outcome.phase in ("verify", "identity") and outcome.status == "fail" else "PF601"
    findings = [Finding(code, Status.fail, CLUSTER, outcome.message,
                        "see `preflight explain " + code + "`; the hosts named are the first to look at")]
    if collective.backend == Backend.nccl and outcome.launch.nproc_per_node > 1:
        findings += intra_node_findings(collective, hosts, port)
    if config.collective.isolate and len(hosts) > 1:
        named, section["isolation"] = _isolation(collective, hosts, port, config.cluster.master)
        findings += named
    return findings


def _isolation(collective: Collective, hosts: list[str], port: int, master: str) -> tuple[list[Finding], IsolationSection]:
    """Split the failing set: a PF605 per culprit (or one for the set, when every subset passes) and the report's
    isolation, with the healthy hosts run together once more."""
    found = isolate(collective, hosts, port)
    isolation: IsolationSection = {"rounds": found.rounds, "culprits": found.culprits, "healthy": found.healthy, "note": found.note,
                                   "confirmed": None}
    if found.culprits and master in found.healthy:
        # The healthy hosts together, on the master port, without the culprits: the launch emit-launch may give
        # with launch.exclude_failed, so that what it emits is a set that passed as a whole.
        (confirmed,) = collective.run([(found.healthy, port)])
        isolation["confirmed"] = {"hosts": found.healthy, "port": port, "status": confirmed.status, "message": confirmed.message}
    findings = [Finding("PF605", Status.fail, culprit,
                        f"fails the collective with any other host (found by splitting in {found.rounds} round(s)); "
                        f"healthy: {', '.join(found.healthy) or 'none'}",
                        "fix this host, or leave it out of cluster.hosts") for culprit in found.culprits]
    findings += lost_findings(found.lost, "while the hosts were split")
    if not found.culprits and not found.lost:
        findings.append(Finding("PF605", Status.fail, CLUSTER, found.note, "check the master port and the routes between hosts"))
    return findings, isolation


def _repeat(collective: Collective, hosts: Sequence[str], port: int, sweep: SweepPlan | None, repeats: int,
            extra_env: dict[str, str]) -> tuple[RunOutcome, list[RepeatRun]]:
    """The full set's launch, `repeats` times in a row until one does not pass: the outcome that counts (the first
    failure, else the slowest pass, whose sweep the bandwidth thresholds then judge) and a line per run."""
    outcomes: list[RunOutcome] = []
    for _ in range(repeats):
        (outcome,) = collective.run([(hosts, port)], sweep=sweep, extra_env=extra_env)
        outcomes.append(outcome)
        if outcome.status != "pass":
            break
    runs: list[RepeatRun] = [{"status": o.status, "phase": o.phase, "message": o.message, "peak_busbw_GBps": peak_busbw(o)}
                             for o in outcomes]
    last = outcomes[-1]
    if last.status != "pass":
        counted = last
        if repeats > 1:
            counted = replace(last, message=f"repeat {len(outcomes)} of {repeats}: {last.message}")
    else:
        # A pass without a sweep measured no bandwidth: it counts as the slowest.
        counted = min(outcomes, key=lambda o: peak_busbw(o) or 0.0)
        if repeats > 1:
            counted = replace(counted, message=f"{counted.message} ({repeats} runs in a row passed)")
    return counted, runs


def _port_in_use(config: PreflightConfig, master: str, port: int, holder: str) -> Incomplete:
    advice = "wait for it to end, or pass network.master_port=0 to pick a free port" if config.network.master_port else \
        "run the check again, it picks another free port"
    return Incomplete(f"the master's rendezvous port {master}:{port} is in use by {holder}, so the collective cannot start; {advice}")
