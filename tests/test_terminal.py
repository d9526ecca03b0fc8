"""The terminal report as a user reads it: 80 columns, `--quiet`, colours only on a terminal and never under NO_COLOR,
the line that replaces a one-rank sweep's zeros, and the exact torch install command when torch is missing. Every
run is a real `preflight check` of this machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import preflight
from test_collective import FAST

ESCAPE = "\x1b["


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "TERM")}
    return {**env, **extra}


@pytest.fixture(scope="module")
def python_without_torch() -> Iterator[str]:
    """A python with no torch at a short path (a venv without pip: 0.1 s), as a fresh training environment has."""
    folder = Path(tempfile.mkdtemp(prefix="pf-venv-"))
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=60)
        yield str(folder / "bin" / "python")
    finally:
        shutil.rmtree(folder)


def test_missing_torch_gives_the_install_command_in_80_columns(python_without_torch: str, tmp_path: Path) -> None:
    # gloo named: on a GPU host, auto would pick nccl and the command would be PyPI's CUDA build, without the index.
    result = preflight("check", "playbook=facts", "training.backend=gloo", f"cluster.hosts.0.python={python_without_torch}",
                       f"state_dir={tmp_path}", env=_env(COLUMNS="80"))
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, result.stdout
    assert "PF104" in result.stdout and ESCAPE not in result.stdout  # not a terminal: no colours
    # The command whole, and no path or address broken across lines.
    words = " ".join(line.split("│")[-1].strip() for line in lines).split()
    assert f"`{python_without_torch}" in words and "https://download.pytorch.org/whl/cpu`;" in words
    assert "'torch>=2.4'" in words  # pins=current's torch pin
    report = json.loads((tmp_path / "report.json").read_text())
    pf104 = next(f for f in report["findings"] if f["code"] == "PF104")
    assert f"`{python_without_torch} -m pip install 'torch>=2.4' --index-url https://download.pytorch.org/whl/cpu`" in pf104["remedy"]


def test_quiet_prints_the_verdict_line_alone(tmp_path: Path) -> None:
    result = preflight("check", "playbook=facts", "--quiet", f"state_dir={tmp_path}", env=_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("PASS  local: 1 host(s) (1 pass), playbook facts, ") and result.stdout.count("\n") == 1
    assert (tmp_path / "report.json").exists()  # quiet prints less, saves the same


@pytest.mark.parametrize(("env", "coloured"), [({}, False), ({"FORCE_COLOR": "1"}, True), ({"FORCE_COLOR": "1", "NO_COLOR": "1"}, False)])
def test_colours_only_on_a_terminal_and_never_with_no_color(env: dict[str, str], coloured: bool, tmp_path: Path) -> None:
    result = preflight("check", "playbook=facts", "--quiet", f"state_dir={tmp_path}", env=_env(**env))
    assert result.returncode == 0 and result.stdout.lstrip(ESCAPE + "0123456789;m").startswith("PASS")
    assert (ESCAPE in result.stdout) is coloured, repr(result.stdout)


def test_one_rank_says_why_there_is_no_bandwidth(tmp_path: Path) -> None:
    """training.nproc_per_node=1 on one host: the sweep runs, its busbw is 0 by definition; one line says so."""
    result = preflight("check", *FAST, "training.nproc_per_node=1", "network.master_port=0", f"state_dir={tmp_path}",
                       env=_env(COLUMNS="80"))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["collective"]["world_size"] == 1 and report["collective"]["sweep"]
    assert "bandwidth not measured: with one rank no byte crosses between processes" in " ".join(result.stdout.split())
    assert "busbw mean" not in result.stdout and "0.000" not in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
