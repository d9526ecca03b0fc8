"""One run of ``preflight check``: Spec -> Facts -> Findings -> Report, in that order only."""

from __future__ import annotations

import datetime as dt
import signal
import time
from collections.abc import Callable

from preflight.checks import evaluated, run_checks
from preflight.compose import Spec
from preflight.contracts import Report
from preflight.errors import Interrupted
from preflight.findings import CLUSTER, Status
from preflight.gather import gather_facts, run_ssh_config
from preflight.history import last_facts
from preflight.interrupt import Activity, hosts_phrase, interrupted_line
from preflight.records import HostRecord, resolve_backend
from preflight.report import build_report
from preflight.spec import Stage
from preflight.transport import CommandResult, HostRouter

# On an interrupt, the hosts' cleanup gets the SSH connect deadline (a host whose kept connection died is reconnected)
# plus this much for the reaper itself; a host that has not answered by then is named in the line, not waited for.
CLEANUP_ALLOWANCE_S = 5.0


def run_check(spec: Spec, on_result: Callable[[CommandResult], None] | None = None) -> Report:
    """Probe every host, run every check, and return the validated report; on SIGINT or SIGTERM, end what runs on
    the hosts and raise Interrupted saying what was interrupted."""
    started = dt.datetime.now(dt.timezone.utc)
    began = time.monotonic()
    config = spec.config
    # A run without a collective comes back to no host after its probe.
    transport = HostRouter(run_ssh_config(config), on_result,
                           keep_connections=bool({Stage.connectivity, Stage.collective, Stage.storage} & set(config.playbook.stages)))
    activity = Activity("facts", f"the probe on {hosts_phrase(len(config.cluster.hosts))}")
    collective = None
    connectivity = None
    dcgm = None
    storage = None
    try:
        outcomes = gather_facts(config, transport)
        activity.now("facts", "the checks")
        records = [o.record for o in outcomes if o.record is not None]
        findings = run_checks(records, config, last_facts(config.state_dir, config.cluster.name))
        if Stage.dcgm in config.playbook.stages and records:
            from preflight.dcgm import run_dcgm_stage

            more, dcgm = run_dcgm_stage(config, transport, records, activity)
            findings += [f for f in more if evaluated(f.code, config)]
        # The hosts the collective runs on: every reached host; none when the connectivity test failed on the cluster
        # or the master; the others when it blamed hosts and their paths passed (the set emit-launch keeps once it
        # leaves the blamed hosts out).
        launchable: list[HostRecord] | None = records
        if Stage.connectivity in config.playbook.stages and records:
            from preflight.connectivity import blamed_hosts, run_connectivity_stage

            more, connectivity = run_connectivity_stage(config, transport, records, activity)
            findings += [f for f in more if evaluated(f.code, config)]
            if connectivity["status"] == "fail":
                blamed = blamed_hosts(more, config.cluster.master)
                launchable = None if blamed is None else [r for r in records if r.host.name not in blamed]
        if Stage.collective in config.playbook.stages and records and launchable is None:
            # torchrun across paths known to be broken would only wait out its deadlines, then blame the set.
            from preflight.collective import not_run

            named = dict.fromkeys(f"{f.code} on {f.host}" if f.host != CLUSTER else f.code for f in more if f.status == Status.fail)
            more, collective = not_run(config, resolve_backend(records, config), records,
                                       f"not run: the connectivity test failed ({', '.join(named)})")
            findings += [f for f in more if evaluated(f.code, config)]
        elif Stage.collective in config.playbook.stages and launchable:
            # Imported here: the facts-only path (and the gate) never pays for it.
            from preflight.collective import run_collective_stage

            # The same connections as the facts stage: one per host for the whole run.
            more, collective = run_collective_stage(config, transport, resolve_backend(launchable, config), launchable,
                                                    sweep=Stage.sweep in config.playbook.stages, activity=activity)
            findings += [f for f in more if evaluated(f.code, config)]
        if Stage.storage in config.playbook.stages and config.storage.paths and records:
            from preflight.storage import run_storage_stage

            transport.remove_on_stop([p.path for p in config.storage.paths])  # an interrupt's reaper removes the test's files
            more, storage = run_storage_stage(config, transport, records, activity)
            findings += [f for f in more if evaluated(f.code, config)]
    except KeyboardInterrupt as e:
        signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
        cleanup = transport.stop(within_s=config.ssh.connect_timeout_s + CLEANUP_ALLOWANCE_S)
        raise Interrupted(signum, interrupted_line(signum, activity, cleanup)) from None
    finally:
        transport.close()
    return build_report(spec, outcomes, findings, started, time.monotonic() - began, collective, connectivity, dcgm, storage)
