"""emit-launch: the launch that passed the check, in the form torchrun, a shell, Docker, systemd or Slurm reads.

Report + Spec -> a plan (the hosts kept, the port that passed, the workarounds allowed, or a refusal) -> the launch,
derived by the same function the collective ran -> one JSON document validated against the shipped schema -> the
format asked for. Every other format is a rendering of that validated document.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import json
import shlex
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from preflight import __version__, rail_env
from preflight.checks import cross_check_codes, run_cross_checks
from preflight.compose import JOB_GROUPS, Spec
from preflight.contracts import (
    READABLE_REPORT_SCHEMAS,
    REPORT_SCHEMA_VERSION,
    BackendName,
    FindingEntry,
    LaunchDocument,
    LaunchFormat,
    LaunchHost,
    Workaround,
)
from preflight.errors import InputError, PreflightError
from preflight.findings import CLUSTER, Status
from preflight.input_files import read_json_file
from preflight.launch import Launch, LaunchError, derive_launch
from preflight.rail_env import PREFIX as RAIL_PREFIX
from preflight.records import HostRecord, resolve_backend
from preflight.report import LATEST, write_atomically
from preflight.report_shape import Report
from preflight.resources import schema_problem
from preflight.spec import Backend, PreflightConfig

LAUNCH_SCHEMA_VERSION = 1
# Cluster findings about the collective: what the collective's own outcome (or the confirmed healthy set) settles.
_COLLECTIVE_CODES = frozenset({"PF601", "PF602", "PF605"})


class Refusal(PreflightError):
    """The report does not prove this launch: it failed, is stale, or was made for another config."""

    exit_code = 1


@dataclass
class Plan:
    """What the launch will be made of, once the report has been weighed."""

    hosts: list[str]  # launch order, the master first
    port: int
    backend: Backend
    excluded: dict[str, str] = field(default_factory=dict)  # host -> why it was left out
    workarounds: list[Workaround] = field(default_factory=list)
    forced: list[str] = field(default_factory=list)  # the refusals --force overrode


def read_report(path: Path) -> Report:
    """The report at path, schema-checked; a missing or broken file is bad input (exit 2)."""
    try:
        # Any JSON at all until the schema has judged it; only then is it typed as a Report.
        report: Any = read_json_file(path, "report")
    except FileNotFoundError:
        raise InputError(f"no report at {path}: run `preflight check` first (or give --report PATH)") from None
    if not isinstance(report, dict) or report.get("schema") not in READABLE_REPORT_SCHEMAS:
        found = report.get("schema") if isinstance(report, dict) else None
        raise InputError(f"{path} is not a preflight report of schema {REPORT_SCHEMA_VERSION} (found {found!r}): "
                         "run `preflight check` again")
    problem = schema_problem("report", report)
    if problem is not None:
        raise InputError(f"{path} is not a valid report: {problem}")
    return cast(Report, report)


def default_report_path(spec: Spec) -> Path:
    """Where `preflight check` saved its last report."""
    return Path(spec.config.state_dir) / LATEST


def _identity_problems(spec: Spec, report: Report, now: dt.datetime) -> list[str]:
    problems = []
    if report["cluster"] != spec.config.cluster.name:
        problems.append(f"the report is for cluster {report['cluster']!r}, not {spec.config.cluster.name!r}")
    else:
        ours = spec.group_digests()
        differ = [g for g in JOB_GROUPS if report["config_digests"].get(g) != ours[g]]
        if differ:
            problems.append(f"the report was made for another config (its {', '.join(differ)} differ{'s' if len(differ) == 1 else ''}): "
                            "run `preflight check` with the same config and overrides")
    age_h = (now - dt.datetime.fromisoformat(report["created_at"])).total_seconds() / 3600
    limit = spec.config.launch.max_report_age_h
    if age_h > limit:
        problems.append(f"the report is {age_h:.1f} h old (launch.max_report_age_h={limit:g}): run `preflight check` again")
    return problems


def _proven_set(report: Report) -> tuple[list[str] | None, int | None, str]:
    """The hosts a collective passed on as a whole, its port, and otherwise why there are none."""
    collective = report["collective"]
    if collective is None and not any(h["facts"] for h in report["hosts"]):
        # No host answered the probe, so no stage after it ran, whatever the playbook: its hosts are named apart.
        return None, None, ("the report has no collective (no host could be probed, so none ran): "
                            "run `preflight check` again once they answer")
    if collective is None or collective["status"] == "skipped":
        why = collective["message"] if collective else f"playbook {report['playbook']} runs none"
        return None, None, f"the report has no collective ({why}): run `preflight check` with playbook=full"
    if collective["status"] == "pass":
        return list(collective["hosts"]), int(collective["port"]), ""
    isolation = collective["isolation"]
    confirmed = isolation["confirmed"] if isolation else None
    if confirmed and confirmed["status"] == "pass":
        return list(confirmed["hosts"]), int(confirmed["port"]), ""
    return None, None, f"the collective did not pass ({collective['status']}: {collective['message']})"


def _way_out(config: PreflightConfig, failed: Collection[str]) -> str:
    """How a launch can do without the failed hosts: leave them out, unless the master is one (leaving it out refuses
    too: another master is the way then)."""
    if config.cluster.master in failed:
        return f"the master {config.cluster.master} is one: make a healthy host cluster.master"
    return "launch.exclude_failed=true leaves them out"


def plan_launch(spec: Spec, report: Report, *, now: dt.datetime, force: bool) -> Plan:
    """Weigh the report against the spec: the hosts and port to launch with, or a Refusal naming every reason."""
    config = spec.config
    problems = _identity_problems(spec, report, now)
    proven, port, why_unproven = _proven_set(report)
    if proven is None:
        problems.append(why_unproven)
    failed: dict[str, str] = {}
    workarounds: list[Workaround] = []
    cluster: list[FindingEntry] = []
    for finding in report["findings"]:
        if finding["status"] not in ("fail", "unknown"):
            continue
        summary = f"{finding['code']} {finding['message']}"
        if finding["host"] == CLUSTER:
            if finding["code"] not in _COLLECTIVE_CODES or proven is None:
                cluster.append(finding)
        elif finding.get("workaround") and config.launch.allow_workarounds:
            workarounds.append({"host": finding["host"], "code": finding["code"], "env": dict(finding["workaround"]),
                                "why": finding["message"]})
        else:
            fix = ",".join(f"{k}={v}" for k, v in (finding.get("workaround") or {}).items())
            failed.setdefault(finding["host"], summary + (f" (launch.allow_workarounds=true would set {fix})" if fix else ""))
    configured = [h.name for h in config.cluster.hosts]
    for name in configured:
        if proven is not None and name not in proven and name not in failed:
            failed[name] = "not in the set of hosts the collective passed on"
    candidates = proven if proven is not None else configured
    excluded: dict[str, str] = {}
    if failed:
        if config.launch.exclude_failed:
            excluded = {name: failed[name] for name in configured if name in failed}
        else:
            listed = "; ".join(f"{name}: {why}" for name, why in failed.items())
            problems.append(f"{len(failed)} host(s) failed ({listed}); {_way_out(config, failed)}")
    master = config.cluster.master
    if master in excluded:
        raise Refusal(f"the master {master} failed ({excluded[master]}): make a healthy host cluster.master and check again")
    hosts = [name for name in candidates if name in configured and name not in excluded]
    hosts.sort(key=lambda name: name != master)  # the master first: it serves the c10d store
    if not hosts:
        raise Refusal("no host is left to launch on")
    # A forced launch without a collective: the backend the checks resolved from the facts.
    backend = (Backend(report["collective"]["backend"]) if report["collective"]
               else resolve_backend(list(_host_records(spec, report).values()), config))
    problems += _cluster_problems(spec, report, cluster, hosts if excluded else None, backend)
    if problems and not force:
        raise Refusal("; ".join(problems) + " (--force emits anyway, and says so)")
    return Plan(hosts=hosts, port=port if port is not None else config.network.master_port, backend=backend,
                excluded=excluded, workarounds=[w for w in workarounds if w["host"] in hosts], forced=problems)


def _cluster_problems(spec: Spec, report: Report, findings: Sequence[FindingEntry], kept: Sequence[str] | None,
                      backend: Backend) -> list[str]:
    """The cluster findings that refuse the launch. With hosts left out (kept: the others), the checks that compare
    hosts are judged again on the kept hosts' facts in the report: a difference only a left-out host made refuses
    nothing."""
    again = cross_check_codes() & {f["code"] for f in findings} if kept is not None else set()
    problems = [f"cluster: {f['code']} {f['message']}" for f in findings if f["code"] not in again]
    if again:
        records = _host_records(spec, report)
        rejudged = run_cross_checks([records[name] for name in kept or [] if name in records], spec.config, backend)
        problems += [f"cluster: {f.code} {f.message} (on the {len(kept or [])} hosts kept)" for f in rejudged
                     if f.code in again and f.status in (Status.fail, Status.unknown)]
    return problems


def _rdzv_id(report: Report) -> str:
    # One id per report: emitting twice from one report gives the same launch, so outputs can be compared.
    digest = hashlib.sha256(f"{report['spec_digest']}/{report['created_at']}".encode()).hexdigest()[:12]
    return f"{report['cluster']}-{digest}"


def _host_records(spec: Spec, report: Report) -> dict[str, HostRecord]:
    """The configured hosts the report has facts for, as the checks and derive_launch take them."""
    facts = {h["name"]: h["facts"] for h in report["hosts"] if h["facts"]}
    return {h.name: HostRecord(host=h, facts=facts[h.name]) for h in spec.config.cluster.hosts if h.name in facts}


def derive(spec: Spec, report: Report, plan: Plan) -> Launch:
    """The launch over the plan's hosts, from the facts in the report, as the collective derived it."""
    config = spec.config
    known = _host_records(spec, report)
    missing = [name for name in plan.hosts if name not in known]
    if missing:
        raise Refusal(f"the report has no facts for {', '.join(missing)}: not checked, so no launch can be written for "
                      f"{'it' if len(missing) == 1 else 'them'} ({_way_out(config, missing)})")
    try:
        return derive_launch(config, plan.backend, [known[name] for name in plan.hosts], plan.port, _rdzv_id(report),
                             join_timeout_s=config.training.rendezvous_timeout_s, read_timeout_s=config.launch.rdzv_read_timeout_s)
    except LaunchError as e:
        raise Refusal(str(e)) from None


def _reliability_env(spec: Spec, backend: Backend) -> dict[str, str]:
    """What makes a hung or failed job say why, and stop: the flight recorder, its dump, the watchdog's monitor."""
    launch = spec.config.launch
    env = {"PREFLIGHT_BACKEND": backend.value,
           # init_process_group reads no variable for its timeout: the README's snippet passes this one.
           "PREFLIGHT_INIT_TIMEOUT_S": str(spec.config.training.init_timeout_s)}
    if backend == Backend.nccl:
        size = str(launch.trace_buffer_size)
        env.update({
            "TORCH_NCCL_TRACE_BUFFER_SIZE": size, "TORCH_FR_BUFFER_SIZE": size,  # the name before torch 2.7, and after
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": launch.dump_prefix, "TORCH_FR_DUMP_TEMP_FILE": launch.dump_prefix,
            "TORCH_NCCL_ENABLE_MONITORING": "1", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(launch.heartbeat_timeout_s),
        })
    return env


def _check_addresses(launch: Launch) -> None:
    for host in launch.hosts:
        address = ipaddress.ip_address(host.local_addr)
        if address.version != 4 or (address.is_loopback and launch.nnodes > 1):
            # A rendezvous on 127.0.0.1 works on one host and hangs every other: never emit one.
            raise Refusal(f"{host.name}'s address for the job is {address}, a loopback: set its interface in the cluster config")


def build_document(spec: Spec, report: Report, report_path: Path, plan: Plan, launch: Launch) -> LaunchDocument:
    """The launch as one JSON document, validated against launch.schema.json."""
    _check_addresses(launch)
    common = _reliability_env(spec, plan.backend)
    if plan.forced:
        common["PREFLIGHT_FORCED"] = "1"
    hosts: list[LaunchHost] = []
    for rank, host in enumerate(launch.hosts):
        env = {
            "MASTER_ADDR": launch.master_addr, "MASTER_PORT": str(launch.master_port), "NNODES": str(launch.nnodes),
            "NPROC_PER_NODE": str(launch.nproc_per_node), "NODE_RANK": str(rank),
            **_torchrun_options_env(host.torchrun_args, rank), **host.env, **common,
        }
        fixes = [w for w in plan.workarounds if w["host"] == host.name]
        for fix in fixes:
            env.update(fix["env"])
        hosts.append({"name": host.name, "node_rank": rank, "is_host": rank == 0, "local_addr": host.local_addr, "ifname": host.ifname,
                      "env": env, "torchrun_args": list(host.torchrun_args), "workarounds": fixes})
    document: LaunchDocument = {
        "schema": LAUNCH_SCHEMA_VERSION,
        "preflight_version": __version__,
        "cluster": report["cluster"],
        "report": {"path": str(report_path.resolve()), "created_at": report["created_at"], "status": report["status"],
                   "spec_digest": report["spec_digest"]},
        "forced": bool(plan.forced), "forced_over": plan.forced,
        # Never auto: the collective's own backend, or the one the checks resolved from the facts.
        "backend": cast(BackendName, plan.backend.value),
        "master": {"host": launch.master, "addr": launch.master_addr, "port": launch.master_port},
        "nnodes": launch.nnodes, "nproc_per_node": launch.nproc_per_node, "world_size": launch.nnodes * launch.nproc_per_node,
        "rendezvous": {"backend": "c10d", "endpoint": f"{launch.master_addr}:{launch.master_port}", "id": launch.rdzv_id,
                       "join_timeout_s": spec.config.training.rendezvous_timeout_s,
                       "read_timeout_s": spec.config.launch.rdzv_read_timeout_s},
        "init_timeout_s": spec.config.training.init_timeout_s,
        "excluded": [{"host": name, "reason": why} for name, why in plan.excluded.items()],
        "torchrun": spec.config.launch.torchrun,
        # On rails each rank runs the script through the wrapper that binds it to its rail (the env's PREFLIGHT_RAIL_*).
        "script": [*([spec.config.launch.rail_wrapper] if launch.rails else []), spec.config.launch.script,
                   *spec.config.launch.script_args],
        "hosts": hosts,
    }
    problem = schema_problem("launch", document)
    if problem is not None:
        raise Refusal(f"the derived launch is not valid: {problem}")
    return document


def _torchrun_options_env(args: Sequence[str], rank: int) -> dict[str, str]:
    """torchrun reads PET_<OPTION> for every option not on its command line: with these, `torchrun train.py` is the launch."""
    env = {"PET_NODE_RANK": str(rank)}
    for option, value in zip(args[::2], args[1::2], strict=True):
        env["PET_" + option.lstrip("-").replace("-", "_").upper()] = value
    return env


# --- formats: each renders the validated document ---------------------------------------------------------------

def _header(document: LaunchDocument, what: str) -> list[str]:
    report = document["report"]
    lines = [f"# {what}",
             f"# preflight {document['preflight_version']}: cluster {document['cluster']}, {document['nnodes']} host(s) x "
             f"{document['nproc_per_node']} rank(s), {document['backend']}, from the {report['status']} report of {report['created_at']}"]
    if document["forced"]:
        lines.append("# FORCED with --force over: " + " / ".join(" ".join(r.split()) for r in document["forced_over"]))
    lines += [f"# left out: {e['host']}: {' '.join(e['reason'].split())}" for e in document["excluded"]]
    return lines


def _workaround_comments(host: LaunchHost) -> list[str]:
    return [f"# workaround for {w['code']} ({' '.join(w['why'].split())}): " + " ".join(f"{k}={v}" for k, v in w["env"].items())
            for w in host["workarounds"]]


def render_env(document: LaunchDocument, host: LaunchHost) -> str:
    """KEY=VALUE lines for one host: `set -a; . FILE; set +a`, docker --env-file, systemd EnvironmentFile=."""
    lines = _header(document, f"launch environment for {host['name']} (node {host['node_rank']} of {document['nnodes']})")
    lines += ["# use: set -a; . THIS_FILE; set +a; torchrun " + shlex.join(document["script"]), *_workaround_comments(host)]
    if _rail_wrapper(document):
        lines.append(f"# rails: {document['script'][0]} (emit-launch wrote rail_env.py beside this file) sets each local rank's "
                     f"{', '.join(k[len(RAIL_PREFIX):] for k in host['env'] if k.startswith(RAIL_PREFIX))} from the "
                     f"{RAIL_PREFIX}* lists below, rail r for local rank r")
    lines += [f"{key}={shlex.quote(value)}" for key, value in host["env"].items()]
    return "\n".join(lines) + "\n"


def _torchrun_command(document: LaunchDocument, host: LaunchHost, torchrun: str) -> str:
    env = [f"{key}={value}" for key, value in host["env"].items() if not key.startswith("PET_")]
    return shlex.join(["env", *env, torchrun, *host["torchrun_args"], *document["script"]])


def render_torchrun(document: LaunchDocument, hosts: Sequence[LaunchHost], torchrun: str) -> str:
    """The exact command per host, its environment included."""
    lines = ["#!/bin/sh", *_header(document, "torchrun on each host: run the line under its name on that host")]
    for host in hosts:
        lines += ["", f"# {host['name']} (node {host['node_rank']})", *_workaround_comments(host),
                  _torchrun_command(document, host, torchrun)]
    return "\n".join(lines) + "\n"


def node_script(document: LaunchDocument, torchrun: str) -> str:
    """What srun runs on every node: the command of the host Slurm calls $SLURMD_NODENAME."""
    cases = [f"  {shlex.quote(host['name'])}) exec {_torchrun_command(document, host, torchrun)} ;;" for host in document["hosts"]]
    return "\n".join([
        'case "$SLURMD_NODENAME" in', *cases,
        '  *) echo "preflight: node $SLURMD_NODENAME is not in the checked launch" >&2; exit 1 ;;', "esac",
    ])


def render_slurm(document: LaunchDocument, torchrun: str) -> str:
    """An sbatch script: one task per node, each running its host's torchrun command (host names are Slurm node names)."""
    nodes = ",".join(host["name"] for host in document["hosts"])
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={document['cluster']}",
        f"#SBATCH --nodes={document['nnodes']}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --nodelist={nodes}",
        *_header(document, "sbatch script: srun starts torchrun once per node with that node's checked launch"),
        "set -euo pipefail",
        f"exec srun --nodes={document['nnodes']} --ntasks={document['nnodes']} --ntasks-per-node=1 --nodelist={nodes} "
        f"--kill-on-bad-exit=1 bash -c {shlex.quote(node_script(document, torchrun))}",
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Output:
    """One piece of output: a file name (under --out) and its text."""

    name: str
    text: str
    mode: int = 0o644


def render(document: LaunchDocument, fmt: LaunchFormat, host_names: Sequence[str]) -> list[Output]:
    """The outputs of a format for the hosts asked for (all when none is named)."""
    hosts = [h for h in document["hosts"] if not host_names or h["name"] in host_names]
    return [*_format(document, fmt, hosts), *_rail_wrapper(document)]


def _format(document: LaunchDocument, fmt: LaunchFormat, hosts: Sequence[LaunchHost]) -> list[Output]:
    torchrun = document["torchrun"]
    if fmt == "json":
        return [Output("launch.json", json.dumps(document, indent=1) + "\n")]
    if fmt == "slurm":
        return [Output("launch.sbatch", render_slurm(document, torchrun), 0o755)]
    if fmt == "torchrun":
        return [Output("torchrun.sh", render_torchrun(document, hosts, torchrun), 0o755)]
    return [Output(f"{host['name']}.env", render_env(document, host)) for host in hosts]


def _rail_wrapper(document: LaunchDocument) -> list[Output]:
    """On rails, the wrapper the script runs through (rail_env.py, the one the check ran its worker through)."""
    if not any(key.startswith(RAIL_PREFIX) for host in document["hosts"] for key in host["env"]):
        return []
    return [Output("rail_env.py", Path(rail_env.__file__).read_text(encoding="utf-8"), 0o755)]


def write_outputs(outputs: Sequence[Output], folder: Path) -> list[Path]:
    """Write each output atomically into folder."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for output in outputs:
        path = folder / output.name
        write_atomically(path, output.text, output.mode)
        paths.append(path)
    return paths


def emit(spec: Spec, report_path: Path, *, force: bool, now: dt.datetime | None = None) -> tuple[LaunchDocument, Plan]:
    """The validated launch document for spec from the report at report_path, and the plan it came from."""
    report = read_report(report_path)
    plan = plan_launch(spec, report, now=now or dt.datetime.now(dt.timezone.utc), force=force)
    launch = derive(spec, report, plan)
    return build_document(spec, report, report_path, plan, launch), plan
