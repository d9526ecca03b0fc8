"""`preflight diagnose DUMP_DIR`: torch's flight recorder dumps from a real gloo job across two namespace hosts, in
which the second host's rank skips a collective; and that diagnose on a log never imports torch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import preflight

from preflight.diagnose import diagnose_path
from preflight.diagnose.flight_recorder import find_dumps
from preflight.errors import EnvironmentProblem, InputError

JOB = Path(__file__).resolve().parent / "data" / "skipped_collective_fr.py"
DEADLINE_S = 90


@pytest.fixture(scope="module")
def dump_dir(sandbox_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """Run the job on h1 (rank 0) and h2 (rank 1); each host writes its rank's dump under DUMP_DIR/HOST/."""
    sandbox = sandbox_factory(2)
    dumps = tmp_path_factory.mktemp("fr-dumps")
    master = sandbox.master.address
    outputs: dict[str, str] = {}

    def launch(node_rank: int, host: str) -> None:
        argv = ["env", "TORCH_FR_BUFFER_SIZE=2000", f"TORCH_FR_DUMP_TEMP_FILE={dumps}/{host}/rank_", "JOB_TIMEOUT_S=6",
                "timeout", "-k", "5", str(DEADLINE_S - 20), sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                "--nproc-per-node", "1", "--node-rank", str(node_rank), "--master-addr", master, "--master-port", "29533",
                str(JOB)]
        result = sandbox.run_in(host, argv, timeout=DEADLINE_S)
        outputs[host] = result.stdout + result.stderr

    started = time.monotonic()
    threads = [threading.Thread(target=launch, args=(k, name)) for k, name in enumerate(("h1", "h2"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_S + 5)
    assert time.monotonic() - started < DEADLINE_S, outputs
    return dumps, outputs


@pytest.mark.sandbox
def test_dumps_are_real_and_one_per_rank_and_host(dump_dir: tuple[Path, dict[str, str]]) -> None:
    dumps, outputs = dump_dir
    found = find_dumps(dumps)
    assert [(d.rank, d.host) for d in found] == [(0, "h1"), (1, "h2")], outputs
    assert "rank 0: all_reduce failed" in outputs["h1"]  # rank 0 waited in the collective rank 1 skipped, until its timeout


@pytest.mark.sandbox
def test_the_skipped_collective_and_the_rank_and_host_that_never_entered_it(dump_dir: tuple[Path, dict[str, str]]) -> None:
    dumps, _ = dump_dir
    result = diagnose_path(str(dumps))
    (diverged,) = result.diagnoses
    assert diverged.code == "PF714" and diverged.ranks == (1,)
    assert diverged.details["collective"] == ["gloo:all_reduce #4 in process group 0:default_pg"]
    assert diverged.details["their hosts"] == ["rank 1 on h2"] and diverged.details["ranks that entered it"] == ["0"]
    assert "skipped_collective_fr.py" in diverged.excerpts[0].text  # the call site torch recorded
    assert result.exit_code == 1


@pytest.mark.sandbox
def test_dumps_and_the_hosts_logs_in_one_folder_give_one_root_cause(dump_dir: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    dumps, outputs = dump_dir
    shutil.copytree(dumps, tmp_path / "job")
    for host, output in outputs.items():  # each host's torchrun output beside its dump
        (tmp_path / "job" / host / "torchrun.log").write_text(output, encoding="utf-8")
    result = diagnose_path(str(tmp_path / "job"))
    assert result.diagnoses[0].code == "PF714" and result.diagnoses[0].details["their hosts"] == ["rank 1 on h2"]
    assert "PF713" not in [d.code for d in result.diagnoses]  # the dumps explain the stop
    assert len(result.files) == 4


@pytest.mark.sandbox
def test_hosts_from_dump_names_in_one_flat_folder(dump_dir: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    dumps, _ = dump_dir
    for dump in find_dumps(dumps):  # as TORCH_FR_DUMP_TEMP_FILE=/shared/dumps/$(hostname)_rank_ names them
        shutil.copy(dump.path, tmp_path / f"{dump.host}_rank_{dump.rank}")
    assert [(d.rank, d.host) for d in find_dumps(tmp_path)] == [(0, "h1"), (1, "h2")]
    assert diagnose_path(str(tmp_path)).diagnoses[0].details["their hosts"] == ["rank 1 on h2"]


@pytest.mark.sandbox
def test_the_cli_reads_a_dump_folder(dump_dir: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    dumps, _ = dump_dir
    result = preflight("diagnose", "--json", str(dumps), cwd=tmp_path, timeout=60)
    assert result.returncode == 1, result.stderr
    (diverged,) = json.loads(result.stdout)["diagnoses"]
    assert diverged["code"] == "PF714" and diverged["ranks"] == [1] and diverged["details"]["their hosts"] == ["rank 1 on h2"]


def test_diagnose_on_a_log_never_imports_torch() -> None:
    log = Path(__file__).resolve().parent / "data" / "logs" / "lightning-driver-545-hang.log"
    code = ("import sys; from preflight.diagnose import diagnose_path; r = diagnose_path(sys.argv[1]); "
            "assert r.diagnoses; print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    result = subprocess.run([sys.executable, "-c", code, str(log)], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_without_torch_a_dump_folder_is_an_environment_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "rank_0").write_bytes(b"\x80\x05N.")  # a pickle: looks like a dump
    monkeypatch.setitem(sys.modules, "torch.distributed.flight_recorder.components.builder", None)  # import fails
    with pytest.raises(EnvironmentProblem, match=r"needs torch 2\.7 or later"):
        diagnose_path(str(tmp_path))


def test_a_pickle_that_is_not_a_dump_is_named(tmp_path: Path) -> None:
    (tmp_path / "rank_0").write_bytes(b"\x80\x05N.")  # pickle of None: no entries
    with pytest.raises(InputError, match="rank_0 is not a flight recorder dump"):
        diagnose_path(str(tmp_path))
