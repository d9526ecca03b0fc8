"""Every benchmark in bench/ runs to its table at its smallest size, so that none can rot unseen: the scripts are found by
listing bench/*.py (a new one cannot be forgotten), and each runs as a user runs it, a subprocess of its own with a hard
deadline, and must exit 0 having printed its table. Their figures at this size mean nothing and are not judged.

A script that builds namespace hosts is given a sandbox prefix and subnet of this session's own (conftest.py's
SandboxFactory.reserve), which the benches run in this session take in turn: no other test or session can meet its hosts.
Each such script is a work unit of its own (a quarter to a minute and a half each on the 2-core development machine), so
that xdist spreads them over its workers rather than running them all in a row."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SandboxFactory

from preflight.sandbox.layout import subnet_count

BENCH = Path(__file__).resolve().parent.parent / "bench"
# Scripts that are no benchmark of their own, each with the script that runs it (and so smoke-tests it) and why.
HELPERS = {"plain_loop.py": ("collective_speed.py", "the plain torch.distributed loop it starts under torchrun on every host")}
# The smallest run of a script whose own size flags give it; every other script takes --smoke (its docstring says what
# that runs). A script that takes --markdown is given it: the table is the one docs/benchmarks.md takes.
SMALLEST = {
    "catalogue_coverage.py": [],  # it reads the message catalogue and the signatures in about a second: no smaller size
    "diagnose_corpus.py": [],  # it reads the corpus (250 logs) in about a second: it has no smaller size
    "false_alarms.py": ["--hosts", "2", "--runs", "1"],
    "gate_speed.py": ["-n", "1"],
    "probe_speed.py": ["-n", "1"],
    "ssh_fanout.py": ["--sizes", "2", "--repeat", "1"],
}
# A script run past its deadline is stopped (SIGTERM: the sandbox's handler takes its hosts down), then killed. The
# slowest smoke run takes about a minute on the 2-core development machine, several times that under the suite's load.
HOSTS_DEADLINE_S = 420.0
LOCAL_DEADLINE_S = 120.0
STOP_GRACE_S = 30.0
_SEPARATOR = re.compile(r"\|(\s*:?-{3,}:?\s*\|)+")


def bench_scripts() -> list[Path]:
    return sorted(p for p in BENCH.glob("*.py") if p.name not in HELPERS)


def builds_hosts(source: str) -> bool:
    """Whether a bench builds namespace hosts: it takes the sandbox prefix and subnet to build them under."""
    return '"--prefix"' in source and '"--index"' in source


def unit(path: Path) -> str:
    """The xdist work unit of a script that builds hosts (conftest.HEAVIEST_SECONDS names the heavy ones)."""
    return f"test_bench_smoke-{path.stem}"


def _param(path: Path) -> object:
    hosts = builds_hosts(path.read_text(encoding="utf-8"))
    return pytest.param(path, marks=[pytest.mark.sandbox, pytest.mark.xdist_group(unit(path))] if hosts else [], id=path.stem)


def markdown_tables(text: str) -> list[list[str]]:
    """Each markdown table in text, as its lines: a header, its separator, and at least one row of as many cells."""
    lines = [line.strip() for line in text.splitlines()]
    tables = []
    for k in range(1, len(lines)):
        if _SEPARATOR.fullmatch(lines[k]) and lines[k - 1].startswith("|"):
            cells = lines[k].count("|")
            rows = []
            for line in lines[k + 1:]:
                if not (line.startswith("|") and line.count("|") == cells):
                    break
                rows.append(line)
            if lines[k - 1].count("|") == cells and rows:
                tables.append([lines[k - 1], lines[k], *rows])
    return tables


def run_bench(path: Path, args: list[str], deadline_s: float, cwd: Path) -> tuple[int, str, str, float]:
    """The script run to its end in a session of its own: exit code, stdout, stderr and wall seconds; past the deadline
    its whole process group is stopped and the test fails."""
    began = time.monotonic()
    process = subprocess.Popen([sys.executable, str(path), *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            out, err = process.communicate(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
        pytest.fail(f"{path.name} {' '.join(args)} ran past {deadline_s:g} s:\n{out[-2000:]}\n{err[-3000:]}")
    return process.returncode, out, err, time.monotonic() - began


@pytest.fixture(scope="session")
def bench_sandbox(sandbox_factory: SandboxFactory) -> Iterator[tuple[str, int]]:
    """One sandbox prefix and subnet index for every bench this session runs, each building and removing its hosts
    there in turn (a session runs one test at a time); the factory removes what a killed bench left. Its /24s are as
    many as a sandbox with 2 rails takes (bench/rail_connectivity.py's)."""
    yield sandbox_factory.reserve(subnet_count(2))


@pytest.mark.parametrize("path", [_param(p) for p in bench_scripts()])
def test_bench_runs_to_its_table_at_its_smallest_size(path: Path, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    args = list(SMALLEST.get(path.name, ["--smoke"]))
    if '"--markdown"' in source:
        args.append("--markdown")
    if builds_hosts(source):
        prefix, index = request.getfixturevalue("bench_sandbox")
        args += ["--prefix", prefix, "--index", str(index)]
    else:
        assert "Sandbox" not in source and "bench_cluster" not in source, \
            f"{path.name} builds hosts: give it --prefix and --index (Sandbox.up's) so that its smoke run has hosts of its own"
    code, out, err, seconds = run_bench(path, args, HOSTS_DEADLINE_S if builds_hosts(source) else LOCAL_DEADLINE_S, tmp_path)
    print(f"{path.name} {' '.join(args)}: exit {code} in {seconds:.1f} s\n{out}")
    assert code == 0, f"{path.name} exited {code}:\n{out[-2000:]}\n{err[-3000:]}"
    assert markdown_tables(out), f"{path.name} printed no table:\n{out[-2000:]}"


def test_the_lists_name_scripts_as_they_are() -> None:
    """Each helper exists and is started by the script named beside it, which is run here; each smallest size is a
    script's that is run here: a renamed script cannot leave a stale name behind."""
    run = {p.name for p in bench_scripts()}
    for helper, (parent, _why) in HELPERS.items():
        assert (BENCH / helper).is_file(), helper
        assert parent in run and helper in (BENCH / parent).read_text(encoding="utf-8"), (helper, parent)
    assert set(SMALLEST) <= run, set(SMALLEST) - run


def test_a_markdown_table_is_told_from_other_output() -> None:
    assert markdown_tables("x\n| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |\ndone") == [["| a | b |", "|---|---|", "| 1 | 2 |", "| 3 | 4 |"]]
    assert markdown_tables("| a | b |\n|---|---|\n") == []  # a header alone
    assert markdown_tables("| a | b |\n|---|---|---|\n| 1 | 2 | 3 |") == []  # the header's cells are not the separator's
    assert markdown_tables("a: 1.0 s\nb: 2.0 s") == []
