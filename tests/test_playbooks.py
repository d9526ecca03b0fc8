"""The shipped playbooks: what each runs, which codes it evaluates, and how repeats end."""

from __future__ import annotations

from typing import Any

import pytest
from recorded import h100_facts, variant

from preflight.checks import run_checks
from preflight.collective.judge import RunOutcome
from preflight.collective.run import SweepPlan
from preflight.collective.stage import _repeat
from preflight.compose import load_spec
from preflight.launch import Launch
from preflight.records import HostRecord
from preflight.spec import Backend


@pytest.mark.parametrize(("name", "stages", "repeats"), [
    ("gate", ["facts"], 1),
    ("facts", ["facts"], 1),
    ("full", ["facts", "connectivity", "collective", "sweep", "storage"], 1),
    ("burnin", ["facts", "connectivity", "collective", "sweep"], 5),
    ("connectivity", ["facts", "connectivity"], 1),
    ("pairwise", ["facts", "connectivity", "collective", "sweep", "pairwise"], 1),
    ("storage", ["facts", "storage"], 1),
])
def test_each_playbook_composes(name: str, stages: list[str], repeats: int) -> None:
    playbook = load_spec([f"playbook={name}"]).config.playbook
    assert playbook.name == name and playbook.stages == stages and playbook.repeats == repeats


def test_check_runs_full_by_default() -> None:
    assert load_spec([]).config.playbook.name == "full"


def test_gate_evaluates_only_node_local_codes() -> None:
    config = load_spec(["playbook=gate"]).config
    host = config.cluster.hosts[0]
    broken = variant(lambda f: f["resources"].update(dev_shm_bytes=64 << 20))
    codes = {f.code for f in run_checks([HostRecord(host=host, facts=broken)], config)}  # type: ignore[arg-type]
    assert "PF203" in codes and codes <= set(config.playbook.checks)
    everything = {f.code for f in run_checks([HostRecord(host=host, facts=h100_facts())],  # type: ignore[arg-type]
                                             load_spec([]).config)}
    assert codes <= everything


def test_a_skipped_code_is_not_evaluated_even_when_chosen() -> None:
    config = load_spec(["playbook=gate", "playbook.skip_checks=[PF203]"]).config
    broken = variant(lambda f: f["resources"].update(dev_shm_bytes=64 << 20))
    findings = run_checks([HostRecord(host=config.cluster.hosts[0], facts=broken)], config)  # type: ignore[arg-type]
    assert "PF203" not in {f.code for f in findings}


class _Launches:
    """Each launch returns the next given outcome: only the loop of repeats is under test (real launches: test_collective)."""

    def __init__(self, statuses: list[str], busbw: list[float]) -> None:
        self.outcomes = [_outcome(s, b) for s, b in zip(statuses, busbw, strict=True)]
        self.calls = 0

    def run(self, groups: Any, *, sweep: SweepPlan | None, extra_env: dict[str, str] | None = None) -> list[RunOutcome]:
        self.calls += 1
        return [self.outcomes.pop(0)]


SWEEP = SweepPlan(sizes=[65536], ops=["all_gather"], warmup=1, iters=3)


def _outcome(status: str, busbw: float) -> RunOutcome:
    launch = Launch(master="h1", master_addr="198.18.0.11", master_port=29500, nnodes=2, nproc_per_node=1,
                    backend=Backend.gloo, rdzv_id="r", hosts=[])
    sweep = [{"op": "all_gather", "bytes": 65536, "busbw_GBps": busbw, "algbw_GBps": busbw, "time_us": 1.0}]
    results = [{"rank": r, "sweep": sweep} for r in range(2)] if status == "pass" else []
    return RunOutcome(launch=launch, status=status, phase=None if status == "pass" else "verify",
                      message=f"{status} at {busbw}", results=results)


def test_repeats_stop_at_the_first_failure_and_name_it() -> None:
    launches = _Launches(["pass", "fail", "pass"], [1.0, 0.0, 1.0])
    counted, runs = _repeat(launches, ["h1", "h2"], 29500, SWEEP, 3, {})  # type: ignore[arg-type]
    assert launches.calls == 2
    assert [r["status"] for r in runs] == ["pass", "fail"]
    assert counted.status == "fail" and counted.message == "repeat 2 of 3: fail at 0.0"


def test_repeats_that_all_pass_are_judged_on_the_slowest() -> None:
    launches = _Launches(["pass", "pass", "pass"], [2.0, 0.5, 1.5])
    counted, runs = _repeat(launches, ["h1", "h2"], 29500, SWEEP, 3, {})  # type: ignore[arg-type]
    assert [r["peak_busbw_GBps"] for r in runs] == [2.0, 0.5, 1.5]
    assert counted.message == "pass at 0.5 (3 runs in a row passed)"
