"""`preflight gate`: exit codes and drain lines, run as a scheduler runs it (the installed command, no shell).

GPU hosts are the real H100 recording: the host's `python` in the cluster config is a script that prints
the recorded facts (changed only in the field under test) instead of probing, since this machine has no
GPU. Everything else (compose, host matching, checks, the report, the line) is the gate's own code.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from conftest import preflight, preflight_exe, skip_or_fail
from recorded import variant

from preflight.gate import REASON_MAX_CHARS, drain_line
from preflight.resources import load_schema


def gate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return preflight("gate", *args, cwd=cwd, timeout=60)


def recorded_host(tmp_path: Path, change: Callable[[dict[str, Any]], None] = lambda facts: None, *,
                  script: str | None = None) -> list[str]:
    """A config folder whose one host is the H100 recording (with one change); the arguments that select it."""
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(variant(change)))
    python = tmp_path / "recorded-python"
    python.write_text(script or f"#!/bin/sh\ncat {facts}\n")
    python.chmod(0o755)
    cluster = tmp_path / "conf" / "cluster" / "gpu1.yaml"
    cluster.parent.mkdir(parents=True)
    cluster.write_text(f"name: gpu1\nmaster: gpu1\nhosts:\n  - name: gpu1\n    address: 127.0.0.1\n"
                       f"    transport: local\n    python: {python}\n")
    return ["--config-dir", str(tmp_path / "conf"), "cluster=gpu1"]


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_healthy_h100_passes_with_one_ok_line(tmp_path: Path) -> None:
    result = gate(*recorded_host(tmp_path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert one_line(result).startswith("preflight: ok, ")
    assert "on gpu1" in result.stdout
    assert not (tmp_path / ".preflight").exists(), "the gate saves nothing where the scheduler runs it"


def test_docker_shm_fails_with_the_drain_line(tmp_path: Path) -> None:
    result = gate(*recorded_host(tmp_path, lambda f: f["resources"].update(dev_shm_bytes=64 << 20)), cwd=tmp_path)
    assert result.returncode == 1
    assert one_line(result) == "preflight: PF203 /dev/shm 64MiB < 1GiB"


def test_a_recovery_action_the_driver_asks_for_drains(tmp_path: Path) -> None:
    result = gate(*recorded_host(tmp_path, lambda f: f["gpu"]["devices"][0].update(recovery_action="drain_and_reset")),
                  cwd=tmp_path)
    assert result.returncode == 1
    assert one_line(result) == "preflight: PF870 GPU 0: the driver asks for recovery: drain_and_reset"


def test_root_cause_first_and_the_rest_counted(tmp_path: Path) -> None:
    def broken(facts: dict[str, Any]) -> None:
        facts["gpu"]["driver_version"] = "545.23.08"
        facts["resources"]["dev_shm_bytes"] = 64 << 20
        facts["gpu"]["devices"][0]["memory_used_bytes"] = 70 << 30

    line = one_line(gate(*recorded_host(tmp_path, broken), cwd=tmp_path))
    assert line.startswith("preflight: PF102 NVIDIA driver 545.23.08 is denylisted"), line
    assert line.endswith("(+2 more: PF203, PF204)"), line
    assert len(line) <= REASON_MAX_CHARS


def test_json_is_the_report_with_the_gate_playbook_only(tmp_path: Path) -> None:
    result = gate("--json", *recorded_host(tmp_path, lambda f: f["resources"].update(dev_shm_bytes=64 << 20)), cwd=tmp_path)
    report = json.loads(result.stdout)
    jsonschema.validate(report, load_schema("report"))
    assert result.returncode == report["exit_code"] == 1
    assert report["playbook"] == "gate" and report["collective"] is None
    assert [h["name"] for h in report["hosts"]] == ["gpu1"]
    assert report["hosts"][0]["facts"]["gpu"]["driver_version"] == "580.159.04"
    # Nothing of the cross-host or collective kind, and the line is the report's root cause.
    assert {f["code"][:3] for f in report["findings"]} <= {"PF1", "PF2", "PF3", "PF4", "PF8"}
    assert not {f["code"] for f in report["findings"]} & {"PF814", "PF826", "PF834", "PF841", "PF843"}
    assert drain_line(report) == "preflight: PF203 /dev/shm 64MiB < 1GiB"


def test_probe_that_fails_is_could_not_check(tmp_path: Path) -> None:
    result = gate(*recorded_host(tmp_path, script="#!/bin/sh\necho 'libcuda.so: cannot open' >&2\nexit 1\n"), cwd=tmp_path)
    assert result.returncode == 3
    line = one_line(result)
    assert line.startswith("preflight: PF002 the probe failed with "), line
    assert line.endswith("libcuda.so: cannot open"), line


def test_probe_that_hangs_is_cut_at_the_playbook_deadline(tmp_path: Path) -> None:
    began = time.monotonic()
    result = gate(*recorded_host(tmp_path, script="#!/bin/sh\nsleep 120\n"), "playbook.deadline_s=2", cwd=tmp_path)
    elapsed = time.monotonic() - began
    assert result.returncode == 3
    assert one_line(result) == "preflight: PF001 not checked: command timed out after 2 s"
    assert elapsed < 2 + 8, elapsed  # the deadline, plus start-up and compose


@pytest.mark.parametrize(("args", "message"), [
    (["thresholds.dev_shm_min_bytes=lots"], "thresholds.dev_shm_min_bytes"),
    (["playbook=nope"], "playbook: no config named 'nope'"),
    (["--host", "nope"], "gate --host: 'nope' is not a host of cluster local"),
    (["cluster=prod"], "matches no host of cluster prod by name or address; give --host NAME"),
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    result = gate(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


def test_this_machine_in_a_container_sized_shm(tmp_path: Path) -> None:
    """The real thing: this machine's probe under Docker's 64 MiB /dev/shm (a private mount namespace)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        skip_or_fail("a private /dev/shm needs root and unshare")
    script = f"mount -t tmpfs -o size=64m tmpfs /dev/shm && exec {preflight_exe()} gate"
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    assert one_line(result) == "preflight: PF203 /dev/shm 64MiB < 1GiB"
    # The host's own /dev/shm is left as it was, and passes.
    passed = gate(cwd=tmp_path)
    assert passed.returncode == 0 and one_line(passed).startswith("preflight: ok, ")


def test_this_machine_with_a_full_tmp_drains(tmp_path: Path) -> None:
    """The real thing: this machine's probe where /tmp is a 64 MiB filesystem with 60 MiB of it taken (a private mount
    namespace), where torchrun's log folder and torch.compile's cache would fail with ENOSPC."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        skip_or_fail("a private /tmp needs root and unshare")
    script = f"mount -t tmpfs -o size=64m tmpfs /tmp && head -c {60 << 20} /dev/zero > /tmp/fill && exec {preflight_exe()} gate"
    env = {k: v for k, v in os.environ.items() if k not in ("TMPDIR", "TEMP", "TMP")}
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    assert one_line(result) == "preflight: PF209 /tmp: 4MiB free of 64MiB, under 1GiB (thresholds.tmp_min_free_bytes)"
    # The machine's own /tmp is left as it was, and passes.
    passed = preflight("gate", "--json", cwd=tmp_path, env=env, timeout=60)
    (tmp,) = [f for f in json.loads(passed.stdout)["findings"] if f["code"] == "PF209"]
    assert tmp["status"] == "pass" and tmp["message"].startswith("/tmp: "), tmp
