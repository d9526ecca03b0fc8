"""The stages on their own: the facts stage's reading of each probe result, the report builder, and the pipeline
over the local transport (this machine, real probes)."""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from recorded import h100_facts

from preflight import checks
from preflight.checks import ClusterView
from preflight.checks.registry import Registered
from preflight.cli import main
from preflight.compose import Spec, load_spec
from preflight.emit import read_report
from preflight.findings import CLUSTER, INTERNAL_ERROR, Finding, Status
from preflight.gather import read_facts
from preflight.pipeline import run_check
from preflight.records import HostOutcome, HostRecord
from preflight.report import build_report, with_section
from preflight.report_shape import StageSections
from preflight.resources import validator
from preflight.spec import Backend, HostSpec
from preflight.stage_list import STAGES, StageEntry, all_codes, known_names, load_stage
from preflight.stages import DeclaredReads, StageContext, StageResult, UndeclaredRead
from preflight.transport.base import CommandResult

HOST = HostSpec(name="gpu17", address="10.1.0.17", python="/opt/venv/bin/python")
SENT, RECEIVED = 1_795_000_000.0, 1_795_000_000.5


def _result(**fields: Any) -> CommandResult:
    return CommandResult(**{"host": HOST.name, "sent_unix_s": SENT, "received_unix_s": RECEIVED, **fields})


def _problem(outcome: HostOutcome) -> tuple[str, Status, str]:
    assert outcome.record is None and outcome.problem is not None
    return outcome.problem.code, outcome.problem.status, outcome.problem.message


def test_an_unreachable_host_is_unknown_with_the_transport_s_reason() -> None:
    outcome = read_facts(HOST, _result(reached=False, reason="connection refused by 10.1.0.17"))
    assert _problem(outcome) == ("PF001", Status.unknown, "not checked: connection refused by 10.1.0.17")


def test_a_probe_cut_at_its_deadline_is_unknown_not_failed() -> None:
    outcome = read_facts(HOST, _result(reached=False, stdout='{"probe": ', reason="command timed out after 6 s"))
    assert _problem(outcome) == ("PF001", Status.unknown, "not checked: command timed out after 6 s")


def test_a_probe_that_failed_names_the_python_and_its_last_line() -> None:
    stderr = "Traceback (most recent call last):\n  File \"<stdin>\", line 1\nSyntaxError: invalid syntax\n\n"
    outcome = read_facts(HOST, _result(reached=True, exit_code=1, stderr=stderr))
    assert _problem(outcome) == ("PF002", Status.unknown, "the probe failed with /opt/venv/bin/python: SyntaxError: invalid syntax")


def test_a_probe_that_printed_no_json_or_bad_facts_is_a_failed_probe() -> None:
    assert _problem(read_facts(HOST, _result(reached=True, exit_code=0, stdout="motd: welcome\n")))[:2] == ("PF002", Status.unknown)
    facts = h100_facts()
    facts["resources"]["dev_shm_bytes"] = "64M"
    code, _, message = _problem(read_facts(HOST, _result(reached=True, exit_code=0, stdout=json.dumps(facts))))
    assert code == "PF002" and message.startswith("the probe's facts are malformed at resources/dev_shm_bytes")


def test_facts_and_the_clock_offset_bounded_by_the_round_trip() -> None:
    facts = h100_facts()
    outcome = read_facts(HOST, _result(reached=True, exit_code=0, stdout=json.dumps(facts)))
    assert outcome.problem is None and outcome.record is not None
    assert outcome.record.facts == facts
    started = facts["probe"]["started_unix_s"]
    assert outcome.record.clock_offset_s == (started - RECEIVED, started - SENT)


@pytest.fixture(scope="module")
def spec() -> Spec:
    return load_spec(["playbook=facts"])


def _report(spec: Spec, outcomes: list[HostOutcome], findings: list[Finding]) -> dict[str, Any]:
    report = build_report(spec, outcomes, findings, dt.datetime(2026, 11, 23, tzinfo=dt.timezone.utc), 1.25)
    validator("report").validate(report)
    return dict(report)


def test_the_report_puts_the_root_cause_first_and_rolls_up_each_host(spec: Spec) -> None:
    good = read_facts(HOST, _result(reached=True, exit_code=0, stdout=json.dumps(h100_facts())))
    other = HostSpec(name="gpu18", address="10.1.0.18")
    lost = read_facts(other, _result(host="gpu18", reached=False, reason="no route to 10.1.0.18"))
    findings = [Finding("PF505", Status.warn, CLUSTER, "clock skew"), Finding("PF203", Status.passed, HOST.name, "/dev/shm 16GiB"),
                Finding("PF204", Status.fail, HOST.name, "GPU 0: 40GiB of 80GiB memory already in use", "stop it")]
    report = _report(spec, [good, lost], findings)
    assert (report["status"], report["exit_code"], report["elapsed_s"]) == ("fail", 1, 1.25)
    assert [(f["code"], f["status"], f["host"]) for f in report["findings"]] == [
        ("PF204", "fail", "gpu17"), ("PF001", "unknown", "gpu18"), ("PF505", "warn", "*"), ("PF203", "pass", "gpu17")]
    assert [(h["name"], h["status"], h["reason"], h["facts"] is None) for h in report["hosts"]] == [
        ("gpu17", "fail", None, False), ("gpu18", "unknown", "not checked: no route to 10.1.0.18", True)]
    assert report["config_digests"] == spec.group_digests() and report["spec_digest"] == spec.digest


@pytest.mark.parametrize(("statuses", "expected"), [((Status.passed, Status.warn), ("pass", 0)),
                                                    ((Status.passed, Status.unknown), ("incomplete", 3)),
                                                    ((Status.unknown, Status.fail), ("fail", 1)), ((), ("pass", 0))])
def test_the_report_s_status_and_exit_code(spec: Spec, statuses: tuple[Status, ...], expected: tuple[str, int]) -> None:
    good = read_facts(HOST, _result(reached=True, exit_code=0, stdout=json.dumps(h100_facts())))
    report = _report(spec, [good], [Finding(f"PF2{k:02d}", s, HOST.name, "x") for k, s in enumerate(statuses)])
    assert (report["status"], report["exit_code"]) == expected


def test_the_pipeline_probes_every_host_and_keeps_each_result(tmp_path: Path) -> None:
    # Two hosts on this machine's local transport: one with this python, one whose python does not exist.
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "pair.yaml").write_text(
        "name: pair\nmaster: here\nhosts:\n"
        f"  - {{name: here, address: 127.0.0.1, transport: local, python: {sys.executable}}}\n"
        "  - {name: broken, address: 127.0.0.2, transport: local, python: /nonexistent/python3}\n")
    spec = load_spec(["cluster=pair", "playbook=facts", "training.backend=gloo"], str(tmp_path))
    seen: list[str] = []
    report = run_check(spec, lambda result: seen.append(result.host))
    validator("report").validate(report)
    assert sorted(seen) == ["broken", "here"]
    here, broken = report["hosts"]
    assert here["facts"] is not None and here["facts"]["host"]["python_executable"] and here["reason"] is None
    assert (broken["status"], broken["facts"]) == ("unknown", None)
    assert broken["reason"] is not None and "/nonexistent/python3" in broken["reason"]
    assert report["status"] == "incomplete" and report["collective"] is None
    assert {f["host"] for f in report["findings"]} >= {"here", "broken"}


def test_every_stage_is_its_list_entry_s_and_reads_only_earlier_stages() -> None:
    order = list(STAGES)
    owned: list[str] = []
    for name in order:
        stage = load_stage(name)
        assert stage.name == name and stage.codes, name
        assert all(order.index(earlier) < order.index(name) for earlier in stage.reads), name
        owned += stage.codes
    assert len(owned) == len(set(owned)), "a code belongs to one stage"
    assert set(owned) | {INTERNAL_ERROR} == all_codes()
    # The parts of the collective have no entry of their own: its entry names them, and they are known names too.
    assert known_names() == ["facts", "dcgm", "connectivity", "collective", "sweep", "pairwise", "storage"]


def test_a_stage_section_needs_its_key_in_the_report_contract(spec: Spec) -> None:
    sections = with_section(StageSections(), "dcgm", {"level": 1, "timeout_s": 5.0, "hosts": []})
    report = build_report(spec, [], [], dt.datetime(2026, 11, 23, tzinfo=dt.timezone.utc), 0.5, sections)
    assert (report["dcgm"], report["collective"], report["connectivity"]) == ({"level": 1, "timeout_s": 5.0, "hosts": []}, None, None)
    with pytest.raises(RuntimeError, match=r"its entry in stage_list\.STAGES names no section type"):
        with_section(sections, "facts", {})


def test_a_stage_sees_only_the_sections_and_findings_of_the_stages_it_declares() -> None:
    tested = [Finding("PF609", Status.passed, CLUSTER, "every path answered")]
    found = {"facts": [Finding("PF206", Status.fail, "h2", "a tenth of a CPU")], "connectivity": tested}
    findings = DeclaredReads(found, "collective", ("connectivity", "dcgm"))
    sections = DeclaredReads({"connectivity": {"status": "pass"}, "dcgm": {"level": 1}}, "collective", ("connectivity",))
    assert (dict(findings), list(sections)) == ({"connectivity": tested}, ["connectivity"])
    assert (findings.get("connectivity"), sections.get("connectivity")) == (tested, {"status": "pass"})
    assert findings.get("dcgm", ()) == ()  # declared, and not run: nothing, as when the playbook leaves it out
    with pytest.raises(UndeclaredRead, match="the collective stage read the facts stage's results without naming it in its reads"):
        findings.get("facts", ())
    with pytest.raises(UndeclaredRead, match="read the dcgm stage's"):
        _ = "dcgm" in sections


class _UndeclaredStage:
    """In the dcgm stage's place: a stage that reads the facts stage's findings without declaring it."""

    name = "dcgm"
    codes = ("PF851", "PF852")
    needs_records = True
    reads: tuple[str, ...] = ()

    def run(self, context: StageContext) -> StageResult[object]:
        return StageResult(list(context.findings.get("facts", ())))


class _DeclaredStage:
    """In the storage stage's place: a stage that declares the facts stage, notes what it sees, then reads dcgm's section."""

    name = "storage"
    codes = tuple(f"PF{n}" for n in range(901, 911))
    needs_records = True
    reads = ("facts",)

    def __init__(self, seen: list[tuple[list[str], set[str]]]) -> None:
        self.seen = seen

    def run(self, context: StageContext) -> StageResult[object]:
        self.seen.append((list(context.findings), {f.code for f in context.findings["facts"]}))
        return StageResult([], context.sections.get("dcgm"))


def test_the_pipeline_hands_a_stage_only_what_it_declares_and_an_undeclared_read_is_its_internal_error(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(STAGES, "dcgm", StageEntry(_UndeclaredStage, STAGES["dcgm"].section))
    seen: list[tuple[list[str], set[str]]] = []
    monkeypatch.setitem(STAGES, "storage", StageEntry(lambda: _DeclaredStage(seen), STAGES["storage"].section))
    overrides = ["cluster=local", "playbook=facts", "playbook.stages=[facts,dcgm,storage]", "training.backend=gloo"]
    assert main(["check", *overrides, f"state_dir={tmp_path}", "network.master_port=0", "--json"]) == 3
    report = json.loads(capsys.readouterr().out)
    assert [f["message"] for f in report["findings"] if f["code"] == "PF009"] == [
        "internal error in stage dcgm: UndeclaredRead: the dcgm stage read the facts stage's results without naming it in its reads",
        "internal error in stage storage: UndeclaredRead: the storage stage read the dcgm stage's results without naming it in its reads"]
    # The declared stage saw the facts stage's findings, and not the dcgm stage's that ran between.
    [(stages, codes)] = seen
    assert stages == ["facts"] and {"PF203", "PF301"} <= codes and "PF009" not in codes
    assert (report["dcgm"], report["storage"]) == (None, None)


class _CrashingStage:
    """In the dcgm stage's place: a stage with a bug."""

    name = "dcgm"
    codes = ("PF851", "PF852")
    needs_records = True
    reads: tuple[str, ...] = ()

    def run(self, context: StageContext) -> StageResult[object]:
        raise RuntimeError("the stage's bug\nsaid on two lines")


@pytest.fixture
def crashing(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A host check that raises (PF299, a code no check has) and a stage that raises; the hosts the check ran on."""
    ran: list[str] = []

    def broken(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
        ran.append(record.host.name)
        yield Finding("PF299", Status.passed, record.host.name, "said before the bug")
        raise KeyError("gpu")

    monkeypatch.setattr(checks, "REGISTRY", [*checks.REGISTRY, Registered(codes=("PF299",), host_check=broken)])
    monkeypatch.setitem(STAGES, "dcgm", StageEntry(_CrashingStage, STAGES["dcgm"].section))
    return ran


def test_a_raising_check_and_stage_are_findings_and_the_rest_of_the_run_goes_on(
        crashing: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    overrides = ["cluster=local", "playbook=facts", "playbook.stages=[facts,dcgm]", "training.backend=gloo", f"state_dir={tmp_path}"]
    assert main(["check", *overrides, "network.master_port=0", "--json"]) == 3
    printed = json.loads(capsys.readouterr().out)
    saved = json.loads((tmp_path / "report.json").read_text())
    assert printed == saved and saved["status"] == "incomplete"
    errors = [f for f in saved["findings"] if f["code"] == "PF009"]
    assert [(f["status"], f["host"], f["message"]) for f in errors] == [
        ("unknown", "*", "internal error in stage dcgm: RuntimeError: the stage's bug said on two lines"),
        ("unknown", "localhost", "internal error in check broken: KeyError: 'gpu'")]
    assert "skip it with playbook.skip_checks=[PF299]" in errors[1]["remedy"]
    assert errors[0]["traceback"].startswith("Traceback (most recent call last):")
    assert errors[0]["traceback"].rstrip().endswith("RuntimeError: the stage's bug\nsaid on two lines")
    assert "KeyError: 'gpu'" in errors[1]["traceback"] and 'raise KeyError("gpu")' in errors[1]["traceback"]
    # Every other check ran and passed; the raising check is its one finding, whatever it said before.
    others = {f["code"]: f["status"] for f in saved["findings"] if f["code"] != "PF009"}
    assert {"PF203", "PF301"} <= set(others) and "PF299" not in others and set(others.values()) == {"pass"}
    assert saved["hosts"][0]["facts"] is not None and saved["dcgm"] is None and crashing == ["localhost"]
    # A report of the schema before (no traceback) is still read, and so is this one.
    assert read_report(tmp_path / "report.json")["schema"] == 8
    older = {**saved, "schema": 5, "findings": [f for f in saved["findings"] if f["code"] != "PF009"]}
    (tmp_path / "old.json").write_text(json.dumps(older))
    assert read_report(tmp_path / "old.json")["schema"] == 5

    # skip_checks switches the check off before it runs: no call, no finding.
    crashing.clear()
    assert main(["check", *overrides, "network.master_port=0", "playbook.skip_checks=[PF299]", "playbook.stages=[facts]", "--json"]) == 0
    assert crashing == [] and "PF009" not in capsys.readouterr().out


def test_the_collective_is_not_run_where_the_master_has_fewer_gpus_than_ranks() -> None:
    """PF207 on the master: no launch, whose "invalid device ordinal" would be read as a hardware fault (PF606)."""
    spec = load_spec(["training.nproc_per_node=2"])
    master = spec.config.cluster.hosts[0]
    record = HostRecord(host=master, facts=h100_facts())  # type: ignore[arg-type]
    short = Finding("PF207", Status.fail, master.name,
                    "2 rank(s) per host (training.nproc_per_node) but 1 GPU(s): NCCL needs a GPU for each rank")
    context = StageContext(spec.config, None, [record], Backend.nccl, None,  # type: ignore[arg-type]
                           findings={"facts": [short]})
    result = load_stage("collective").run(context)
    (skipped,) = result.findings
    assert (skipped.code, skipped.status, skipped.host) == ("PF601", Status.unknown, CLUSTER)
    assert skipped.message == f"not run: PF207 on {master.name}: {short.message}"
    assert result.section is not None and result.section["message"] == skipped.message
