"""One run of ``preflight check``: Spec -> Facts -> Findings -> Report, in that order only."""

from __future__ import annotations

import datetime as dt
import signal
import time
from collections.abc import Callable, Sequence

from preflight.checks import evaluated
from preflight.compose import Spec
from preflight.errors import Interrupted
from preflight.findings import Finding
from preflight.gather import gather_facts, run_ssh_config
from preflight.interrupt import Activity, hosts_phrase, interrupted_line
from preflight.records import HostRecord
from preflight.report import build_report, with_section
from preflight.report_shape import Report, StageSections
from preflight.spec import PreflightConfig
from preflight.stage_list import playbook_stages
from preflight.stages import Stage, declared_context, run_stage
from preflight.transport import CommandResult, HostRouter

# On an interrupt, the hosts' cleanup gets the SSH connect deadline (a host whose kept connection died is reconnected)
# plus this much for the reaper itself; a host that has not answered by then is named in the line, not waited for.
CLEANUP_ALLOWANCE_S = 5.0


def run_check(spec: Spec, on_result: Callable[[CommandResult], None] | None = None) -> Report:
    """Probe every host, run the playbook's stages in turn, and return the validated report; on SIGINT or SIGTERM, end
    what runs on the hosts and raise Interrupted saying what was interrupted."""
    started = dt.datetime.now(dt.timezone.utc)
    began = time.monotonic()
    config = spec.config
    # Imported here (each stage's module only when the playbook names it): the facts-only path never pays for the others.
    stages = playbook_stages(config)
    # A run with no stage after the facts comes back to no host after its probe.
    transport = HostRouter(run_ssh_config(config), on_result, keep_connections=len(stages) > 1)
    activity = Activity("facts", f"the probe on {hosts_phrase(len(config.cluster.hosts))}")
    try:
        outcomes = gather_facts(config, transport)
        activity.now("facts", "the checks")
        findings, sections = run_stages(config, stages, transport, [o.record for o in outcomes if o.record is not None], activity)
    except KeyboardInterrupt as e:
        signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
        cleanup = transport.stop(within_s=config.ssh.connect_timeout_s + CLEANUP_ALLOWANCE_S)
        raise Interrupted(signum, interrupted_line(signum, activity, cleanup)) from None
    finally:
        transport.close()
    return build_report(spec, outcomes, findings, started, time.monotonic() - began, sections)


def run_stages(config: PreflightConfig, stages: Sequence[Stage], transport: HostRouter, records: Sequence[HostRecord],
               activity: Activity) -> tuple[list[Finding], StageSections]:
    """Every stage after the probe, in turn, on the hosts it reached: the findings the playbook evaluates, and the
    stages' sections. `check` and `agent` run them alike; only the transport differs."""
    findings: list[Finding] = []
    sections = StageSections(collective=None)  # each stage that runs adds its own; every report has the collective's key
    earlier: dict[str, list[Finding]] = {}
    for stage in stages:
        if stage.needs_records and not records:
            continue
        # The same connections for every stage: one per host for the whole run.
        # What it reads is cut to the stages it declares: an undeclared read raises, and becomes its PF009.
        context = declared_context(stage, config, transport, records, activity, sections, earlier)
        result = run_stage(stage, context)
        earlier[stage.name] = result.findings
        findings += [f for f in result.findings if evaluated(f.code, config)]
        if result.section is not None:
            sections = with_section(sections, stage.name, result.section)
    return findings, sections
