"""The first failure across ranks: a real gloo job over three namespace hosts whose rank 1 (on h2) is SIGKILLed in the
middle of an all_reduce loop; `preflight diagnose` on the folder of every host's output names that rank and host first,
and the other ranks' errors as consequences that echo it."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import preflight

from preflight.diagnose import diagnose_path

JOB = Path(__file__).resolve().parent / "data" / "killed_rank.py"
DEADLINE_S = 90
HOSTS = ("h1", "h2", "h3")


@pytest.fixture(scope="module")
def job_folder(sandbox_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Each host's torchrun output (the worker's lines with it), as HOST/torchrun.log."""
    sandbox = sandbox_factory(len(HOSTS))
    folder = tmp_path_factory.mktemp("killed-rank")
    master = sandbox.master.address
    outputs: dict[str, str] = {}

    def launch(node_rank: int, host: str) -> None:
        argv = ["timeout", "-k", "5", str(DEADLINE_S - 20), sys.executable, "-m", "torch.distributed.run",
                "--nnodes", str(len(HOSTS)), "--nproc-per-node", "1", "--node-rank", str(node_rank),
                "--master-addr", master, "--master-port", "29541", str(JOB)]
        result = sandbox.run_in(host, argv, timeout=DEADLINE_S)
        outputs[host] = result.stdout + result.stderr

    started = time.monotonic()
    threads = [threading.Thread(target=launch, args=(k, name)) for k, name in enumerate(HOSTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_S + 5)
    assert time.monotonic() - started < DEADLINE_S, outputs
    for host, output in outputs.items():
        (folder / host).mkdir()
        (folder / host / "torchrun.log").write_text(output, encoding="utf-8")
    return folder


@pytest.mark.sandbox
def test_the_killed_rank_and_its_host_are_the_first_failure(job_folder: Path) -> None:
    result = diagnose_path(str(job_folder))
    first = result.first_failure
    assert first is not None and (first.code, first.rank, first.host, first.file) == ("PF721", "1", "h2", "h2/torchrun.log")
    assert first.stamp is not None and first.stamp.exact  # torchrun's "failed (exitcode: -9)" line carries its time
    assert result.diagnoses[0].code == "PF721" and result.diagnoses[0].details["hosts"] == ["h2"]
    assert f"first failure: {first.describe()}" in result.render()


@pytest.mark.sandbox
def test_the_other_ranks_errors_are_consequences_that_echo_it(job_folder: Path) -> None:
    result = diagnose_path(str(job_folder))
    first = result.first_failure
    assert first is not None
    later = result.diagnoses[1:]
    assert "PF727" in [d.code for d in later]  # a rank that was in the all_reduce with it saw its sockets close
    for d in later:
        assert d.tier == "consequence" and d.details["echoes"] == [first.echo()], d
        assert set(d.details["hosts"]) <= {"h1", "h3"}
    assert first.echo().startswith("rank 1 on host h2's PF721 at ")
    # Every other rank's own error is one of those consequences. Which one is gloo's timing: a closed connection (PF727),
    # or, where a rank's send to a rank that had itself stopped hung first, gloo's send timeout (PF703). A whole-suite
    # run saw rank 2 print "Timed out waiting 60000ms for send operation to complete" 60 s after rank 0's closed connection.
    assert {rank for d in later for rank in d.ranks} == {0, 2}
    assert {d.code for d in later} <= {"PF727", "PF703"}


@pytest.mark.sandbox
def test_the_cli_names_the_first_failure(job_folder: Path, tmp_path: Path) -> None:
    result = preflight("diagnose", "--json", str(job_folder), cwd=tmp_path, timeout=60)
    assert result.returncode == 1, result.stderr
    document = json.loads(result.stdout)
    assert document["first_failure"]["host"] == "h2" and document["first_failure"]["rank"] == "1"
    assert document["first_failure"]["code"] == document["diagnoses"][0]["code"] == "PF721"
