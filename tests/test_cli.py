"""The installed console script, end to end in a subprocess, and `preflight explain`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import jsonschema
import pytest
from conftest import preflight, preflight_exe

from preflight.catalogue import FIELDS, load_catalogue, read_remedies
from preflight.cli import main
from preflight.diagnose import signature_codes
from preflight.findings import INTERNAL_ERROR
from preflight.report import EXIT_CODES
from preflight.resources import load_schema, shipped_dir
from preflight.stage_list import STAGES, StageEntry, all_codes, load_stage

REPO = Path(__file__).resolve().parent.parent
# Checks and stages emit codes, and so does `preflight diagnose` for the failures it recognizes in a job's log.
EMITTED_CODES = all_codes() | signature_codes()


def _shm_bytes() -> int:
    stat = os.statvfs("/dev/shm")
    return stat.f_blocks * stat.f_frsize


def test_check_json_on_this_machine(tmp_path: Path) -> None:
    result = preflight("check", "--json", "network.master_port=0", cwd=tmp_path)
    report = json.loads(result.stdout)
    jsonschema.validate(report, load_schema("report"))
    assert result.returncode == EXIT_CODES[report["status"]] == report["exit_code"]
    (host,) = report["hosts"]
    assert host["name"] == "localhost" and host["facts"]["host"]["hostname"] == os.uname().nodename
    codes = {f["code"]: f for f in report["findings"]}
    if host["facts"]["gpu"]["source"] == "none":  # no GPU (CI): backend auto is gloo, and a missing driver is not a fault
        assert codes["PF100"]["status"] == "pass" and "gloo" in codes["PF100"]["message"]
    else:  # a GPU host (the H100 of 2026-11-27 said "NVIDIA driver 580.159.04 read through nvml")
        assert codes["PF100"]["status"] == "pass" and "NVIDIA driver" in codes["PF100"]["message"]
    shm = codes["PF203"]
    assert shm["status"] == ("pass" if _shm_bytes() >= 1 << 30 else "fail")
    saved = json.loads((tmp_path / ".preflight" / "report.json").read_text())
    assert saved == report
    assert len(list((tmp_path / ".preflight" / "history").glob("*.json"))) == 1
    assert result.stderr == ""  # no progress bar off a terminal


def test_check_table_names_the_failure_first(tmp_path: Path) -> None:
    # Demand more /dev/shm than this machine has: a real failure through the whole pipeline.
    result = preflight("check", f"thresholds.dev_shm_min_bytes={_shm_bytes() + 1}", "state_dir=out", "network.master_port=0", cwd=tmp_path)
    assert result.returncode == 1
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    first_row = next(line for line in lines if "PF" in line)
    assert [cell.strip() for cell in first_row.split("│")][:3] == ["fail", "localhost", "PF203"]
    assert "FAIL" in result.stdout and "report saved to out/report.json" in result.stdout
    assert json.loads((tmp_path / "out" / "report.json").read_text())["status"] == "fail"


def test_unreachable_python_is_incomplete_not_failed(tmp_path: Path) -> None:
    result = preflight("check", "--json", "cluster.hosts.0.python=/nonexistent/python3", "network.master_port=0", cwd=tmp_path)
    assert result.returncode == 3
    report = json.loads(result.stdout)
    assert report["status"] == "incomplete"
    (host,) = report["hosts"]
    assert host["status"] == "unknown" and "/nonexistent/python3" in host["reason"]


def test_bad_input_through_the_console_script(tmp_path: Path) -> None:
    result = preflight("check", "cluster=nope", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == ["preflight: error: cluster: no config named 'nope' (available: local, prod)"]
    assert not (tmp_path / ".preflight").exists()


@pytest.mark.parametrize(("stages", "line"), [
    ("[facts,hostname]", "preflight: error: playbook.stages: unknown stage 'hostname' in playbook full (known: facts, dcgm, "
                         "connectivity, collective, sweep, pairwise, storage)"),
    ("[facts,Host-Name]", None)], ids=["unknown", "malformed"])
def test_a_stage_the_list_does_not_know_is_bad_input_before_any_host(tmp_path: Path, stages: str, line: str | None) -> None:
    # A host whose python does not exist: had the run reached it, the check would end incomplete (exit 3), as above.
    result = preflight("check", f"playbook.stages={stages}", "cluster.hosts.0.python=/nonexistent/python3",
                       "network.master_port=0", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    (said,) = result.stderr.strip().splitlines()
    assert said == line if line else said.startswith("preflight: error: playbook.stages") and "Host-Name" in said
    assert "Traceback" not in result.stderr and not (tmp_path / ".preflight" / "report.json").exists()


def test_every_code_has_a_catalogue_entry() -> None:
    catalogue = load_catalogue()
    assert set(catalogue) >= EMITTED_CODES, sorted(EMITTED_CODES - set(catalogue))
    assert set(catalogue) <= EMITTED_CODES, f"entries for codes nothing emits: {sorted(set(catalogue) - EMITTED_CODES)}"
    for code, entry in catalogue.items():
        assert entry["title"] and entry["cause"] and entry["fix"], code
        assert set(entry) <= {"title", *FIELDS}, code


def test_each_stage_s_remedies_explain_its_own_codes_and_no_other_s(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, entry in STAGES.items():
        assert entry.remedies is not None and set(read_remedies(entry.remedies)) == set(load_stage(name).codes), name
    shared = read_remedies(shipped_dir("playbooks") / "remedies.yaml")
    assert INTERNAL_ERROR in shared and not set(shared) & (all_codes() - {INTERNAL_ERROR})
    # A stage whose remedies explain a code another stage's do already: the catalogue refuses to pick one.
    twin = tmp_path / "remedies.yaml"
    twin.write_text("PF611:\n  title: t\n  cause: c\n  fix: f\n", encoding="utf-8")
    monkeypatch.setitem(STAGES, "twin", StageEntry(lambda: load_stage("connectivity"), remedies=twin))
    with pytest.raises(RuntimeError, match=r"remedies.yaml: PF611 already explained"):
        load_catalogue()


@pytest.mark.parametrize("code", sorted(EMITTED_CODES))
def test_explain_prints_every_code(code: str, capsys: pytest.CaptureFixture[str]) -> None:
    # In this process: the console script's own start is the test below, once, not a python start per code.
    assert main(["explain", code.lower()]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{code}  ") and "cause:" in out and "fix:" in out


def test_explain_through_the_console_script(tmp_path: Path) -> None:
    result = preflight("explain", "pf601", cwd=tmp_path, timeout=30)
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith("PF601  ") and "cause:" in result.stdout and "fix:" in result.stdout


def _reader_gone(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`preflight ARGS...` writing to a pipe whose reader has already left, as `preflight ... | head -1` leaves it once
    head has its line: every write to stdout fails with EPIPE."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([preflight_exe(), *args], cwd=cwd, stdout=write, stderr=subprocess.PIPE, text=True,
                              timeout=120, check=False)
    finally:
        os.close(write)


@pytest.mark.parametrize("json_out", [False, True], ids=["table", "json"])
def test_a_check_whose_reader_left_still_exits_with_its_verdict(tmp_path: Path, json_out: bool) -> None:
    # Before: a check that passed exited 1 ("a check failed") once `| head` had closed the pipe: rich exits 1 on a broken
    # pipe, and print() raised BrokenPipeError (a traceback) under --json.
    result = _reader_gone("check", *(["--json"] if json_out else []), "network.master_port=0", cwd=tmp_path)
    saved = json.loads((tmp_path / ".preflight" / "report.json").read_text())
    assert result.returncode == saved["exit_code"] == EXIT_CODES[saved["status"]]
    assert result.stderr == ""


@pytest.mark.parametrize(("args", "code"), [(("explain",), 0), (("diagnose", "clean.log"), 0), (("diagnose", "shm.log"), 1)])
def test_reading_commands_whose_reader_left_exit_with_their_own_code(tmp_path: Path, args: tuple[str, ...], code: int) -> None:
    (tmp_path / "clean.log").write_text("step 1 loss 2.3\n")
    (tmp_path / "shm.log").write_text("NCCL WARN Call to posix_fallocate failed : No space left on device\n")
    result = _reader_gone(*args, cwd=tmp_path)
    assert (result.returncode, result.stderr) == (code, "")


def test_text_that_stdout_cannot_encode_is_escaped_not_a_traceback(tmp_path: Path) -> None:
    # A Latin-1 byte in the log is read as U+FFFD and echoed in the finding's line, which ASCII cannot encode.
    # Before: UnicodeEncodeError's traceback, and exit 1 for whatever the diagnosis was.
    (tmp_path / "shm.log").write_bytes(b"caf\xe9: NCCL WARN Call to posix_fallocate failed : No space left on device\n")
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    diagnosed = preflight("diagnose", "shm.log", cwd=tmp_path, env=env)
    assert (diagnosed.returncode, diagnosed.stderr) == (1, "")
    assert "PF203" in diagnosed.stdout and "caf\\ufffd: NCCL WARN" in diagnosed.stdout


def test_wheel_ships_conf_and_playbooks_and_works_outside_the_repo(tmp_path: Path) -> None:
    """What `pipx install .` gets: a wheel whose package carries conf/, playbooks/, the scripts shipped to hosts (the
    probe, and each stage's in its package) and schemas."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(REPO)],
                   check=True, timeout=120)
    (wheel,) = tmp_path.glob("preflight-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("preflight/conf/config.yaml", "preflight/conf/cluster/local.yaml", "preflight/playbooks/remedies.yaml",
                   "preflight/playbooks/playbook/full.yaml", "preflight/probe/main.py", "preflight/hostlib/guard.py",
                   "preflight/connectivity/mesh/main.py",
                   "preflight/collective/host/main.py", "preflight/storage/probe.py", "preflight/schemas/report.schema.json"):
        assert needed in names, needed
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, timeout=120)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # -I: nothing from the checkout can leak onto sys.path.
    run = [str(python), "-I", "-c", "import sys; from preflight.cli import main; sys.exit(main(sys.argv[1:]))"]
    explained = subprocess.run([*run, "explain", "PF102"], cwd=elsewhere, capture_output=True, text=True, timeout=60, check=False)
    assert explained.returncode == 0 and "545.23.08" in explained.stdout
    checked = subprocess.run([*run, "check", "--json", "network.master_port=0"], cwd=elsewhere, capture_output=True, text=True,
                             timeout=120, check=False)
    report = json.loads(checked.stdout)
    assert checked.returncode == report["exit_code"]
    where = subprocess.run([str(python), "-I", "-c", "import preflight; print(preflight.__file__)"],
                           cwd=elsewhere, capture_output=True, text=True, timeout=30, check=True)
    assert where.stdout.startswith(str(env_dir))
