"""`preflight diagnose` on the stack dumps people take of a job that stopped moving: py-spy's and faulthandler's, from
real runs (tests/data/logs/make_logs.py stack-dumps: three gloo ranks, rank 2's loader stalled at step 2)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from preflight.diagnose import Diagnosis, diagnose_path, diagnose_text
from preflight.diagnose.stacks import StackReader

LOGS = Path(__file__).resolve().parent / "data" / "logs"


def _log(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


SPY = _log("hang-py-spy-dump.log")
TIMEOUT = _log("hang-faulthandler-timeout.log")
HEALTHY = _log("healthy-py-spy-dump.log")
WAITING = "waiting for the other ranks"
ELSEWHERE = "elsewhere (what the others wait for)"


def _dumps(log: str) -> str:
    """The py-spy dumps alone, as pasted without the job's output."""
    return log[log.index("\nProcess ") + 1:]


def _elsewhere(hang: Diagnosis) -> list[str]:
    """Where each rank in no collective is, without its label."""
    return [s.split(": ")[1] for s in hang.details[ELSEWHERE]]


def _pids(log: str) -> list[str]:
    return [line.split()[1].rstrip(":") for line in log.splitlines() if line.startswith("Process ")]


def test_py_spy_names_the_ranks_in_the_collective_and_the_one_elsewhere_and_the_hang_leads_the_signal() -> None:
    hang, ended = diagnose_text(SPY)
    agent, *ranks = _pids(SPY)  # torchrun's agent first, then its ranks as py-spy found them
    assert (hang.code, hang.signatures, ended.code) == ("PF713", ("stack-dump-in-collective",), "PF726")
    waiting, = hang.details[WAITING]
    assert waiting.endswith(": all_reduce called from train (stalled_loader.py:30)")
    (stalled,) = hang.details[ELSEWHERE]  # torchrun's agent is no rank: it is not what the ranks wait for
    assert stalled.endswith(": next_batch (stalled_loader.py:15)") and agent not in stalled
    assert sorted(p for p in ranks if f"process {p}" in waiting + stalled) == sorted(ranks)
    assert hang.details["stack dumps"] == ["py-spy dump"]
    assert [e.text for e in hang.excerpts].count("all_reduce (torch/distributed/distributed_c10d.py:3252)") == 2


def test_a_pasted_py_spy_dump_alone_is_read_and_no_dump_of_a_rank_in_a_collective_is_no_hang() -> None:
    (hang,) = diagnose_text(_dumps(SPY))
    assert hang.code == "PF713" and hang.first_line == _dumps(SPY).splitlines().index(
        "    all_reduce (torch/distributed/distributed_c10d.py:3252)") + 1
    # The healthy job's dumps caught every rank computing its batch: no rank waits, nothing is said.
    assert diagnose_text(HEALTHY) == () and diagnose_text(_dumps(HEALTHY)) == ()


def test_faulthandler_s_stall_watchdog_names_ranks_by_their_prefix() -> None:
    hang, ended = diagnose_text(TIMEOUT)
    assert (hang.code, ended.code) == ("PF713", "PF726")
    (waiting,) = hang.details[WAITING]
    assert waiting.startswith("rank 0 and rank 1: all_reduce called from train (") and waiting.endswith("stalled_loader.py:30)")
    (stalled,) = hang.details[ELSEWHERE]
    assert stalled.startswith("rank 2: next_batch (") and stalled.endswith("stalled_loader.py:15)")
    assert hang.details["stack dumps"] == ["faulthandler after 0:00:06 (a timeout)"]


def test_a_crash_dump_shows_where_it_crashed_not_a_wait() -> None:
    # The same stacks, printed by faulthandler for a crash: where the rank died, which a wait is not.
    crashed = TIMEOUT.replace("Timeout (0:00:06)!", "Fatal Python error: Segmentation fault")
    assert [d.code for d in diagnose_text(crashed)] == ["PF726"]


def test_a_job_that_says_it_finished_did_not_hang_whatever_a_dump_caught() -> None:
    assert diagnose_text(_dumps(SPY) + "[rank0]: Training finished\n") == ()


def test_the_same_diagnosis_wherever_the_log_is_cut_into_blocks() -> None:
    whole = StackReader()
    whole.feed(TIMEOUT)
    expected = whole.diagnosis()
    assert expected is not None
    lines = TIMEOUT.splitlines(keepends=True)
    for cut in range(1, len(lines)):
        reader = StackReader()
        reader.feed("".join(lines[:cut]))
        reader.feed("".join(lines[cut:]))
        assert reader.diagnosis() == expected, cut


@pytest.fixture
def rank_folder(tmp_path: Path) -> Path:
    for rank in range(3):
        prefix = f"[default{rank}]:"
        own = [line[len(prefix):] for line in TIMEOUT.splitlines(keepends=True) if line.startswith(prefix)]
        (tmp_path / f"rank{rank}.log").write_text("".join(own), encoding="utf-8")
    agent = [line for line in TIMEOUT.splitlines(keepends=True) if not line.startswith("[default")]
    (tmp_path / "agent.log").write_text("".join(agent), encoding="utf-8")  # torchrun's own lines: its SIGTERM
    return tmp_path


def test_each_rank_s_own_file_names_it(rank_folder: Path) -> None:
    hang, ended = diagnose_path(str(rank_folder)).diagnoses  # the hang first, torchrun's SIGTERM after it
    assert (hang.code, ended.code) == ("PF713", "PF726")
    (waiting,) = hang.details[WAITING]
    assert waiting.startswith("rank 0 and rank 1: all_reduce")
    (stalled,) = hang.details[ELSEWHERE]
    assert stalled.startswith("rank 2: next_batch (")
    assert {e.source for e in hang.excerpts} <= {"rank0.log", "rank1.log", "rank2.log"}


def test_a_dump_interleaved_with_another_rank_s_lines_is_still_read() -> None:
    # Two ranks dumping at once through torchrun --tee: their lines alternate.
    ranks = [[line for line in TIMEOUT.splitlines(keepends=True) if line.startswith(f"[default{r}]:")] for r in range(3)]
    mixed = "".join(line for pair in zip(ranks[0], ranks[2], strict=False) for line in pair)
    (hang,) = diagnose_text(mixed)
    assert hang.details[WAITING][0].startswith("rank 0: all_reduce") and hang.details[ELSEWHERE][0].startswith("rank 2: next_batch")


def _as_py_spy_0_1(dumps: str) -> str:
    """py-spy 0.4.3's dumps in py-spy 0.1's shape, as 0.1.11 printed a Python 3.6 process here: its executable's path,
    "Python version 3.6.15", then "Thread 0x7F2510B69B80 (active)" and frames "\\t all_reduce (sleeper.py:3)", with no
    "Process" line and no thread names (0.1.11 reads no Python past 3.7, so no torch 2.13 job). Built: only the dumps'
    own lines are rewritten."""
    out = []
    for line in dumps.splitlines():
        if line.startswith("Process "):
            out.append("/usr/bin/python3.7")
        elif line.startswith("Python v"):
            out.append("Python version 3.7.3")
        elif line.startswith("Thread "):
            thread, status = line.split()[1:3]
            out.append(f"Thread 0x{int(thread):X} {status.rstrip(':')}")
        elif line.startswith("    "):
            out.append("\t " + line.strip())
    return "\n".join(out) + "\n"


def test_py_spy_0_1_s_dumps_are_read_too() -> None:
    (hang,) = diagnose_text(_as_py_spy_0_1(_dumps(SPY)))
    (waiting,) = hang.details[WAITING]
    (stalled,) = hang.details[ELSEWHERE]
    # dump 1 is torchrun's agent (py-spy --subprocesses prints the parent first): no rank; the others in py-spy's order
    both = re.fullmatch(r"dump (\d) and dump (\d): all_reduce called from train \(stalled_loader\.py:30\)", waiting)
    alone = re.fullmatch(r"dump (\d): next_batch \(stalled_loader\.py:15\)", stalled)
    assert both is not None and alone is not None and {both[1], both[2], alone[1]} == {"2", "3", "4"}


def test_progress_that_stopped_and_the_dumps_are_one_hang() -> None:
    # Rank 1 fell behind at step 4 (the progress reader's evidence), and the dumps say where each rank is now.
    log = "[rank0]: epoch 0 step 5\n[rank1]: epoch 0 step 4\n[rank2]: epoch 0 step 5\n" + _dumps(SPY)
    (hang,) = diagnose_text(log)
    assert hang.signatures == ("no-error-hang", "stack-dump-in-collective")
    assert hang.details["ranks that fell silent before it"] == ["1 (last: epoch 0 step 4)"]
    assert hang.details[ELSEWHERE][0].endswith(": next_batch (stalled_loader.py:15)") and len(hang.excerpts) <= 3


def test_native_frames_around_the_python_ones_change_nothing() -> None:
    # py-spy --native: libc's wait and c10d::Work::wait under all_reduce, libc's sleep under the stalled loader.
    native = _log("hang-py-spy-native-dump.log")
    assert "    c10d::Work::wait (libtorch_cpu.so)" in native.splitlines()
    (hang,) = diagnose_text(_dumps(native))
    assert hang.details[WAITING][0].endswith(": all_reduce called from train (stalled_loader.py:30)")
    assert len(hang.details[ELSEWHERE]) == 1 and hang.details[ELSEWHERE][0].endswith(": next_batch (stalled_loader.py:15)")


def test_spawn_s_parent_and_multiprocessing_s_resource_tracker_are_no_ranks() -> None:
    # torch.multiprocessing.spawn of the same job, py-spy --subprocesses of its parent: the parent waits in spawn's join,
    # the resource tracker in its loop, the ranks under spawn's _wrap; then SIGTERM to them all, which they print nothing of.
    log = _log("hang-py-spy-spawn-dump.log")
    assert "    ProcessContext.join (torch/multiprocessing/spawn.py:140)" in log.splitlines()
    assert "    main (multiprocessing/resource_tracker.py:227)" in log.splitlines()
    (hang,) = diagnose_text(log)
    (waiting,) = hang.details[WAITING]
    assert waiting.endswith(": all_reduce called from train (stalled_loader.py:30)")
    assert _elsewhere(hang) == ["next_batch (stalled_loader.py:15)"]


def test_ranks_waiting_to_join_for_one_still_loading_its_checkpoint() -> None:
    # Rank 2 loads its checkpoint (60 s) before init_process_group; ranks 0 and 1 wait inside it (gloo's group, made in
    # _new_process_group_helper): what they called is init_process_group, and rank 2 is what they wait for.
    log = _log("hang-py-spy-late-join-dump.log")
    hang, ended = diagnose_text(log)
    assert (hang.code, ended.code) == ("PF713", "PF726")
    (waiting,) = hang.details[WAITING]
    assert waiting.endswith(": init_process_group called from main (stalled_loader.py:46)")
    assert _elsewhere(hang) == ["load_checkpoint (stalled_loader.py:39)"]


def test_ranks_blocked_in_different_collectives_add_the_divergence() -> None:
    # Rank 2 broadcasts at step 2 where ranks 0 and 1 all_reduce: under gloo each blocks in a call the others never make.
    log = _log("hang-py-spy-diverged-dump.log")
    hang, _ = diagnose_text(log)
    assert hang.code == "PF713" and hang.codes[:2] == ("PF713", "PF714")
    calls = sorted(call.split(": ", 1)[1] for call in hang.details[WAITING])
    assert calls == ["all_reduce called from train (stalled_loader.py:30)", "broadcast called from train (stalled_loader.py:28)"]
    assert ELSEWHERE not in hang.details
    # One collective alone, whatever the ranks: no divergence named.
    (same,) = diagnose_text(_dumps(SPY))
    assert "PF714" not in same.codes and "the ranks wait in different collectives" not in same.details
