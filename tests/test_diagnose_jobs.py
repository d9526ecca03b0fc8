"""`preflight diagnose` beyond error lines, on recorded logs: a hang that printed no error, the versions and settings a log
names held against the denylist and pins, and a folder of one job's per-rank logs."""

from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path

import pytest
from conftest import preflight

from preflight.diagnose import Diagnosis, LogReader, Scanner, diagnose_folder, diagnose_path, diagnose_text, parse_signatures
from preflight.diagnose.merge import find_logs
from preflight.diagnose.progress import ProgressTracker, timestamp
from preflight.diagnose.timeline import Timeline
from preflight.diagnose.versions import VersionReader, shipped_pins
from preflight.spec import DenyEntry, PinsConfig

DATA = Path(__file__).resolve().parent / "data"
LOGS = DATA / "logs"
H100 = DATA / "h100-single-node"
# NCCL's INFO lines naming settings and the driver's CUDA, as rwth-i6/returnn#1469 quotes them.
NCCL_SETTING_LINES = ("ncg12:252607:252607 [1] NCCL INFO cudaDriverVersion 12000\n"
                      "ncg12:252607:253221 [1] NCCL INFO NCCL_IB_DISABLE set by environment to 1.\n"
                      "ncg12:252606:253206 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to LOC\n")


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def versions_of(*texts: str) -> VersionReader:
    reader = VersionReader()
    for text in texts:
        reader.feed(text)
    return reader


# --- hangs --------------------------------------------------------------------------------------------


def test_a_hang_without_an_error_line_names_the_last_progress_and_the_silent_ranks() -> None:
    (hang,) = diagnose_text(read(LOGS / "hang-store-barrier.log"))
    assert hang.code == "PF713" and hang.codes == ("PF713", "PF102", "PF606", "PF601")  # the checks that find each cause
    assert hang.details["last progress"] == ["joining the process group (init_process_group started)"]
    assert hang.details["ranks that reached it"] == ["0-2, 4, 6-7"]
    assert hang.details["ranks never heard from"] == ["3, 5"] and hang.details["world size"] == ["8"]
    assert hang.details["last progress at"] == ["2025-03-11 05:21:24"] and hang.first_line == 10
    assert hang.before_job.startswith("PF102, PF606, PF601: preflight check cluster=NAME")


def test_nccl_init_on_one_node_of_two_then_silence() -> None:
    (hang,) = diagnose_text(read(LOGS / "nccl-init-then-ddp-hang.log"))
    assert hang.details["last progress"] == ["process group initialized"] and hang.details["ranks that reached it"] == ["2-3"]
    assert hang.details["ranks never heard from"] == ["0-1"] and hang.details["world size"] == ["4"]


def test_a_denylisted_driver_in_the_header_is_the_root_cause_of_the_hang() -> None:
    denied, hang = diagnose_text(read(LOGS / "lightning-driver-545-hang.log"))
    assert denied.code == "PF102" and denied.tier == "cause" and denied.first_line == 1
    (driver,) = denied.details["NVIDIA driver"]
    assert driver.startswith("545.29.02 (denylisted ==545.29.*:") and denied.details["workaround"] == ["NCCL_P2P_DISABLE=1"]
    assert denied.before_job.startswith("PF102: preflight check cluster=NAME playbook=facts")
    assert hang.code == "PF713" and hang.details["last progress"] == ["process group initialized"]
    assert hang.details["ranks that reached it"] == ["0-1"]  # rank 0's banner speaks for every rank of the 2


def test_the_header_alone_names_the_denylisted_driver_in_a_note() -> None:
    # A version known to break others, in a log that shows no failure: not a failure of this job, but said.
    header = read(LOGS / "lightning-driver-545-hang.log").splitlines()[0]
    result = LogReader(Scanner())
    result.feed(header + "\n")
    (note,) = result.result("header", 1).notes
    assert result.diagnoses() == () and note.startswith("the log names a denylisted version, though it shows no failure: 545.29.02")


def test_a_log_that_says_training_finished_is_not_a_hang() -> None:
    log = read(LOGS / "lightning-driver-545-hang.log")
    assert [d.code for d in diagnose_text(log)] == ["PF102", "PF713"]
    # Lightning's own last line of a fit that reached its end: no hang, and the denylisted driver becomes a note.
    assert diagnose_text(log + "`Trainer.fit` stopped: `max_epochs=10` reached.\n") == ()


def test_an_excerpt_that_just_ends_is_not_a_hang() -> None:
    # The same run's lines without the driver: every rank registered and none is behind, so nothing shows a stop.
    log = read(LOGS / "lightning-driver-545-hang.log").split("\n", 1)[1]
    assert diagnose_text(log) == ()
    # Timestamps that go on for minutes after the last progress do.
    stalled = "2024-01-05 10:00:00 INFO epoch 3 step 120\n2024-01-05 10:09:30 INFO still here\n"
    (hang,) = diagnose_text(stalled)
    assert hang.code == "PF713" and hang.details["log went on without progress for"] == ["570 s"]


def test_an_error_line_explains_the_stop_so_no_hang_is_added() -> None:
    codes = [d.code for d in diagnose_text(read(LOGS / "gloo-collective-timeout.log"))]
    assert codes == ["PF703"]


def test_progress_per_rank_from_prefixes_epochs_and_steps() -> None:
    # torch's [rankN]: prefix; a step line without its epoch belongs to the rank's current epoch.
    log = ("[rank0]: epoch 1\n[rank1]: epoch 1\n[rank0]: step 40\n[rank1]: step 39\n[rank0]: step 41\n")
    (hang,) = diagnose_text(log)
    assert hang.details["last progress"] == ["epoch 1 step 41"] and hang.details["ranks that reached it"] == ["0"]
    assert hang.details["ranks that fell silent before it"] == ["1 (last: epoch 1 step 39)"]


def test_a_progress_bar_counts_its_last_update_and_a_percentage_is_no_epoch() -> None:
    # NVIDIA/nccl#1160's first line, a run that hung in its first step: tqdm's "Training Epoch:   0%" names no epoch.
    line = ("r0 Training Epoch:   0%|" + " " * 40 + "| 0/188 [00:00<?, ?it/s][I ProcessGroupWrapper.cpp:562] [Rank 0] Running "
            "collective: CollectiveFingerPrint(SequenceNumber=0, OpType=_ALLGATHER_BASE, TensorShape=[1], TensorDtypes=Int)\n")
    assert progress_of(line).details["last progress"] == ["step 0"]
    # A bar's updates in one line, as a log file keeps them: the last one counts.
    bar = progress_of("Epoch 1:  20%|##        | 4/20 [00:01<00:04]\rEpoch 1:  45%|####5     | 9/20 [00:02<00:03]\n")
    assert bar.details["last progress"] == ["epoch 1 step 9"]


def progress_of(text: str) -> Diagnosis:
    """The hang diagnosis of text's progress, as if a version known to hang explained the stop."""
    tracker = ProgressTracker()
    tracker.feed(text)
    hang = tracker.hang(explained=True)
    assert hang is not None
    return hang


# --- versions and settings -----------------------------------------------------------------------------


def test_versions_from_nvidia_smi_pip_collect_env_and_nccl_banners() -> None:
    assert versions_of(read(H100 / "nvidia-smi.txt")).named() == {"NVIDIA driver": ["580.159.04"], "CUDA (driver API)": ["13.0"]}
    assert versions_of(read(H100 / "pip.txt")).named() == {"the NCCL torch loads": ["2.28.9"], "torch": ["2.11.0"]}
    assert versions_of(read(LOGS / "collect-env-cpu.log")).named() == {"torch": ["2.13.0+cpu"]}
    named = versions_of(read(LOGS / "nccl-unhandled-cuda-error.log"), NCCL_SETTING_LINES).named()
    assert named["the NCCL torch loads"] == ["2.20.5"] and named["CUDA (driver API)"] == ["12.0"]
    assert named["settings"] == ["NCCL_DEBUG=INFO", "NCCL_IB_DISABLE=1", "NCCL_P2P_LEVEL=LOC"]


def test_the_shipped_denylist_is_the_one_check_uses() -> None:
    pins = shipped_pins()
    assert {e.specifier for e in pins.denylist if e.component == "driver"} >= {"==545.23.08", "==545.29.*"}
    assert versions_of(read(H100 / "nvidia-smi.txt")).denylisted() is None  # 580 is fine


def test_a_denylisted_nccl_is_named_with_its_reason_and_line() -> None:
    pins = PinsConfig(denylist=[DenyEntry(component="nccl", specifier="==2.20.5", reason="a reason")])
    denied = versions_of(read(LOGS / "nccl-unhandled-cuda-error.log")).denylisted(pins)
    assert denied is not None and denied.code == "PF102"
    assert denied.details["the NCCL torch loads"] == ["2.20.5 (denylisted ==2.20.5: a reason)"]
    assert "NCCL version 2.20.5" in denied.excerpts[0].text


def test_versions_outside_the_pins_are_notes_not_failures() -> None:
    pins = PinsConfig(torch=">=2.12", nccl=">=2.20")
    assert versions_of(read(H100 / "pip.txt")).outside_pins(pins) == ["PF104 torch 2.11.0 does not satisfy >=2.12"]


# --- a folder of per-rank logs ------------------------------------------------------------------------------


def test_torchrun_log_dir_is_one_job_and_names_the_rank_that_fell_silent() -> None:
    folder = LOGS / "torchrun-log-dir-hang"
    logs = find_logs(folder)
    assert [(log.rank, log.path.name) for log in logs] == [(rank, name) for rank in "01" for name in ("stderr.log", "stdout.log")]
    result = diagnose_folder(folder)
    (hang,) = result.diagnoses
    assert hang.code == "PF713" and hang.details["last progress"] == ["epoch 0 step 3"]
    assert hang.details["ranks that reached it"] == ["0"]
    assert hang.details["ranks that fell silent before it"] == ["1 (last: epoch 0 step 2)"]
    assert hang.excerpts[-1].source.endswith("attempt_0/0/stderr.log") and result.exit_code == 1


def test_per_host_logs_give_one_root_cause_with_its_host(tmp_path: Path) -> None:
    # The two hosts' real outputs of one job (README: gloo-loopback-h1/h2), laid out as a collector keeps them.
    for host in ("h1", "h2"):
        (tmp_path / host).mkdir()
        shutil.copy(LOGS / f"gloo-loopback-{host}.log", tmp_path / host / "torchrun.log")
    result = diagnose_path(str(tmp_path))
    assert [d.code for d in result.diagnoses] == ["PF301", "PF711"]
    root, consequence = result.diagnoses
    assert root.details["hosts"] == ["h1"] and consequence.details["hosts"] == ["h2"]
    assert root.excerpts[0].source == "h1/torchrun.log"


def test_slurm_output_files_are_ranks_by_their_trailing_number(tmp_path: Path) -> None:
    for task, name in enumerate(("gloo-loopback-h1.log", "gloo-loopback-h2.log")):
        shutil.copy(LOGS / name, tmp_path / f"slurm-81234_{task}.out")
    assert [(log.rank, log.host) for log in find_logs(tmp_path)] == [("0", ""), ("1", "")]
    root = diagnose_folder(tmp_path).diagnoses[0]
    assert root.code == "PF301" and root.ranks == (0,)


def test_a_folder_with_no_known_failure_points_at_its_first_error_line(tmp_path: Path) -> None:
    (tmp_path / "rank0.log").write_text("loading data\n", encoding="utf-8")
    (tmp_path / "rank1.log").write_text("loading data\nValueError: a message no signature knows\n", encoding="utf-8")
    result = diagnose_folder(tmp_path)
    first = result.first_error
    assert result.diagnoses == () and first is not None and (first.source, first.line) == ("rank1.log", 2)
    assert "the first error-looking line was: rank1.log:2: ValueError: a message no signature knows" in result.render()


def test_a_folder_without_logs_is_a_clear_input_error(tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("nothing\n", encoding="utf-8")
    result = preflight("diagnose", str(tmp_path), cwd=tmp_path, timeout=60)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "holds no logs" in result.stderr


def test_the_cli_diagnoses_a_folder_as_json(tmp_path: Path) -> None:
    result = preflight("diagnose", "--json", str(LOGS / "torchrun-log-dir-hang"), cwd=tmp_path, timeout=60)
    document = json.loads(result.stdout)
    assert result.returncode == 1 and [d["code"] for d in document["diagnoses"]] == ["PF713"]
    assert len(document["files"]) == 4 and document["files"][0].endswith("(rank 0, host ?)")


@pytest.mark.parametrize("name", ["hang-store-barrier.log", "lightning-driver-545-hang.log"])
def test_a_single_log_reads_the_same_through_the_file_and_in_memory(name: str) -> None:
    reader = LogReader(Scanner())
    reader.feed(read(LOGS / name))
    assert reader.diagnoses() == diagnose_path(str(LOGS / name)).diagnoses


def test_progress_then_an_error_no_signature_knows_is_a_crash_not_a_hang() -> None:
    # Rank 0's real progress lines, then a real traceback of another run, read with a table that does not know its error.
    progress = read(next((LOGS / "torchrun-log-dir-hang").rglob("0/stderr.log")))
    traceback = read(LOGS / "sampler-with-shuffle.log")
    table = parse_signatures({"signatures": [{"id": "other", "tier": "cause", "codes": ["PF701"], "patterns": ["never in these logs"],
                                              "check": "none: a test"}]})
    assert progress_of(progress).code == "PF713"
    crashed = ProgressTracker()
    crashed.feed(progress + traceback)
    assert crashed.hang(explained=True) is None and diagnose_text(progress + traceback, table) == ()


def test_a_rank_that_crashed_is_told_apart_from_one_that_fell_silent() -> None:
    log = ("[rank0]: epoch 0 step 1\n[rank1]: epoch 0 step 1\n[rank2]: epoch 0 step 1\n[rank0]: epoch 0 step 2\n"
           "[rank1]: Traceback (most recent call last):\n")
    (hang,) = diagnose_text(log)
    assert hang.details["ranks that reached it"] == ["0"]
    assert hang.details["ranks that fell silent before it"] == ["2 (last: epoch 0 step 1)"]
    assert hang.details["ranks that stopped on an error no signature knows"] == ["1 (5: [rank1]: Traceback (most recent call last):)"]


# --- the first failure across ranks, by time ------------------------------------------------------------


def test_times_in_each_format_a_log_carries() -> None:
    timeline = Timeline()
    block = ("[I1127 03:33:57.981000 882 torch/distributed/run.py:1] starting\n"  # torch's glog prefix
             "[rank3]:[E1127 03:33:58.500000 882 ProcessGroupGloo.cpp:1] failed\n"
             "[2026-11-27 03:33:59] node7:1:2 [0] NCCL INFO init\n"  # NCCL_DEBUG_TIMESTAMP_FORMAT's prefix
             "2026-11-27 03:34:00,123 INFO step 10\n"  # Python logging
             "RuntimeError: no time of its own\n"
             "  time      : 2026-11-27_03:34:06\n"  # torchrun's failure summary
             "2026-11-27T03:34:07.5Z done\n")
    timeline.feed(block, 1, {1, 2, 3, 4, 5, 6, 7})
    shown = [timeline.at(line) for line in range(1, 8)]
    assert [s.to_json() if s else None for s in shown] == [
        "11-27 03:33:57.981000", "11-27 03:33:58.500000", "2026-11-27 03:33:59", "2026-11-27 03:34:00.123000",
        "2026-11-27 03:34:00.123000", "2026-11-27 03:34:06", "2026-11-27 03:34:07.500000"]
    assert [s.exact for s in shown if s] == [True, True, True, True, False, True, True]
    assert shown[4] is not None and shown[4].shown() == "after 03:34:00"


def test_the_months_name_of_syslog_journalctl_and_dmesg_and_richs_date() -> None:
    """syslog's and journalctl's short format (RFC 3164 pads the day with a space, journald with a zero), dmesg -T's
    ctime (util-linux 2.38.1 printed "[Sat Nov 28 21:38:37 2026]" here), and rich's RichHandler with its default
    "[%x %X]" in the C locale (ColossalAI's logger); a job that logs through journald carries syslog's prefix."""
    timeline = Timeline()
    block = ("Nov 27 03:33:57 gpu07 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
             "Nov  7 03:33:58 gpu07 python[4242]: RuntimeError: x\n"
             "Nov 07 03:33:59 gpu07 kernel: y\n"
             "[Fri Nov 27 03:34:00 2026] NVRM: Xid (PCI:0000:3b:00): 79\n"
             "[Sat Nov  7 03:34:01 2026] z\n"
             "[11/27/26 03:34:02] ERROR    colossalai - colossalai - ERROR: boom\n"
             "Nov 31 03:34:03 no such day\n"
             "Novel 27 03:34:04 not a month\n")
    timeline.feed(block, 1, set(range(1, 9)))
    assert [(s.to_json(), s.exact) if (s := timeline.at(n)) else None for n in range(1, 9)] == [
        ("11-27 03:33:57", True), ("11-07 03:33:58", True), ("11-07 03:33:59", True), ("2026-11-27 03:34:00", True),
        ("2026-11-07 03:34:01", True), ("2026-11-27 03:34:02", True), ("2026-11-27 03:34:02", False),
        ("2026-11-27 03:34:02", False)]


def test_torchs_own_cpp_log_prefix_prints_month_times_100_plus_day() -> None:
    """c10/util/Logging.cpp prints ``(tm_mon + 1) * 100 + tm_mday``: January 17 is E117, October 16 E1016 (as
    Pai-Megatron-Patch-436's and sglang-1693's corpus logs print them); glog's own MMDD stays as it was."""
    timeline = Timeline()
    block = ("[E117 08:28:16.358824199 socket.cpp:1023] [c10d] The client socket has timed out\n"
             "[W105 23:59:59.000000001 ProcessGroupNCCL.cpp:1] x\n"
             "[E1016 03:31:38.928019586 ProcessGroupNCCL.cpp:1] y\n"
             "E0117 08:28:16.358824 12345 file.cc:12] glog's own\n"
             "[I101 00:00:01.5 x.cpp:1] January 1\n"
             "E1317 08:28:16.3 x.cpp:1] no month 13\n")
    timeline.feed(block, 1, set(range(1, 7)))
    assert [s.to_json() if (s := timeline.at(n)) else None for n in range(1, 7)] == [
        "01-17 08:28:16.358824", "01-05 23:59:59.000000", "10-16 03:31:38.928020", "01-17 08:28:16.358824",
        "01-01 00:00:01.500000", "01-01 00:00:01.500000"]
    assert timeline.at(6) is not None and not timeline.at(6).exact
    assert timestamp("[E117 08:28:16.358824199 socket.cpp:1023] x") == datetime(2000, 1, 17, 8, 28, 16)
    assert timestamp("[E1016 03:31:38.928019586 x.cpp:1] y") == datetime(2000, 10, 16, 3, 31, 38)


def test_vllms_logger_and_rays_prefix() -> None:
    """vLLM's "%(levelname)s %(asctime)s" with "%m-%d %H:%M:%S" (vllm/logger.py), and Ray's "(Name pid=N, ip=A) " before a
    line's own prefix, which otherwise pushes its time past the characters near the start a time is read in."""
    timeline = Timeline()
    block = ("ERROR 01-17 08:28:16 worker.py:1] boom\n"
             "(RayWorkerWrapper pid=4242, ip=10.0.0.12) [rank3]:[E117 08:29:16.358824199 ProcessGroupNCCL.cpp:1] x\n"
             "(pid=45601) INFO 11-27 03:33:57 engine.py:1] started\n"
             "(RayWorkerWrapper pid=4242, ip=10.0.0.12) the collective that failed had started a while before, at 2026-11-27 03:00:00\n"
             "INFO 11-27 03:33:5 not a time\n")
    timeline.feed(block, 1, set(range(1, 6)))
    assert [(s.to_json(), s.exact) if (s := timeline.at(n)) else None for n in range(1, 6)] == [
        ("01-17 08:28:16", True), ("01-17 08:29:16.358824", True), ("11-27 03:33:57", True), ("11-27 03:33:57", False),
        ("11-27 03:33:57", False)]


def test_a_ray_workers_line_names_its_rank_and_its_node() -> None:
    """Ray puts "(Name pid=N, ip=A) " before torch's "[rankN]:" (vLLM's workers): the rank and the node are still read."""
    line = ("(RayWorkerWrapper pid={pid}, ip={ip}) [rank{rank}]:[E528 08:52:4{rank}.164295950 ProcessGroupGloo.cpp:145] Gloo "
            "connectFullMesh failed with [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:144] no error\n")
    (found,) = diagnose_text(line.format(pid=933, ip="10.0.0.12", rank=1) + line.format(pid=934, ip="10.0.0.13", rank=2))
    assert (found.code, found.ranks, found.details.get("host"), found.first_rank) == ("PF711", (1, 2), ["10.0.0.12", "10.0.0.13"], "1")


def test_a_line_before_any_time_has_none_and_a_later_block_carries_the_last() -> None:
    timeline = Timeline()
    timeline.feed("Traceback (most recent call last):\n", 1, {1})
    timeline.feed("2026-11-27 03:34:00 INFO step\n", 2, set())
    timeline.feed("RuntimeError: boom\n", 3, {3})
    assert timeline.at(1) is None and timeline.at(3) is not None and timeline.at(3).shown() == "after 03:34:00"


OOM_LINE = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.1 GiB\n"
ILLEGAL_LINE = "RuntimeError: CUDA error: an illegal memory access was encountered\n"
WATCHDOG_LINE = ("[rank0]:[E1127 03:44:00.000000 7 ProcessGroupNCCL.cpp:1] Watchdog caught collective operation timeout: "
                 "WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600001 milliseconds\n")

def write_logs(folder: Path, logs: dict[str, str]) -> Path:
    """A folder of one job's logs, each at its path under folder (a host's subfolder where the path names one)."""
    for name, text in logs.items():
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def test_the_earliest_cause_by_time_leads_though_more_ranks_show_it(tmp_path: Path) -> None:
    # Ranks 0 and 1 on h1 ran out of memory at 03:34:10; rank 3 on h2 hit an illegal memory access at 03:33:57.
    result = diagnose_folder(write_logs(tmp_path, {
        "h1/rank0.log": f"[E1127 03:34:10.000000 7 x.py:1] step\n{OOM_LINE}",
        "h1/rank1.log": f"[E1127 03:34:11.000000 7 x.py:1] step\n{OOM_LINE}",
        "h2/rank3.log": f"[E1127 03:33:57.000000 7 x.py:1] step\n{ILLEGAL_LINE}",
        "h1/rank2.log": f"[rank2]:[E1127 03:33:50.000000 7 x.py:1] started\n{WATCHDOG_LINE}"}))
    assert [d.code for d in result.diagnoses] == ["PF722", "PF725", "PF703"]
    first = result.first_failure
    assert first is not None and (first.rank, first.host, first.line) == ("3", "h2", 2) and first.stamp is not None
    assert not first.stamp.exact  # the error line follows the time printed before it
    watchdog = result.diagnoses[2]
    assert watchdog.details["echoes"] == ["rank 3 on host h2's PF722 after 03:33:57"]
    assert "PF725" not in [d.code for d in result.diagnoses[:1]] and "echoes" not in result.diagnoses[1].details
    assert not result.notes


def test_a_kernel_logs_xid_beside_the_ranks_logs_is_the_first_failure_on_its_host(tmp_path: Path) -> None:
    # h2's GPU fell off the bus at 03:34:05 (its journalctl -k, syslog's time); rank 1 on h2 then hit an illegal memory
    # access, rank 0 on h1 waited for it until its watchdog fired.
    result = diagnose_folder(write_logs(tmp_path, {
        "h1/rank0.log": WATCHDOG_LINE,
        "h2/rank1.log": f"[E1127 03:34:11.000000 7 x.py:1] step\n{ILLEGAL_LINE}",
        "h2/kern.log": "Nov 27 03:34:01 h2 kernel: nvidia-nvlink: Nvlink Core is being initialized\n"
                       "Nov 27 03:34:05 h2 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', "
                       "name=<unknown>, GPU has fallen off the bus.\n"}))
    assert [d.code for d in result.diagnoses] == ["PF801", "PF722", "PF703"]
    first = result.first_failure
    assert first is not None and (first.code, first.file, first.line, first.host, first.rank) == ("PF801", "h2/kern.log", 2, "h2", "")
    assert first.stamp is not None and first.stamp.exact and first.stamp.to_json() == "11-27 03:34:05"
    assert "first failure: the kernel on host h2: PF801 at 03:34:05 (h2/kern.log:2)" in result.render()
    assert result.diagnoses[2].details["echoes"] == ["the kernel on host h2's PF801 at 03:34:05"]
    # A kernel log that prints no times: its Xid still leads, named by its line and host, with no time.
    (tmp_path / "h2" / "kern.log").write_text("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n")
    first = diagnose_folder(tmp_path).first_failure
    assert first is not None and (first.file, first.line, first.host, first.stamp) == ("h2/kern.log", 1, "h2", None)


def test_logs_without_times_fall_back_to_the_fewest_ranks_and_say_so(tmp_path: Path) -> None:
    result = diagnose_folder(write_logs(tmp_path, {"rank0.log": OOM_LINE, "rank1.log": OOM_LINE, "rank3.log": ILLEGAL_LINE}))
    assert [d.code for d in result.diagnoses] == ["PF722", "PF725"]  # the code on the fewest ranks
    assert result.first_failure is not None and result.first_failure.stamp is None and result.first_failure.rank == "3"
    (note,) = [n for n in result.notes if "not by time" in n]
    assert "rank0.log, rank1.log, rank3.log print no times" in note


def test_one_merged_log_with_rank_prefixes_names_the_first_failure(tmp_path: Path) -> None:
    merged = tmp_path / "job.log"  # srun --label's prefix: the ranks' lines in the order they were printed
    merged.write_text("0: 2026-11-27 03:33:50,000 INFO step 10\n3: [E1127 03:33:57.000000 7 x.py:1] step\n"
                      f"3: {ILLEGAL_LINE}0: {WATCHDOG_LINE}", encoding="utf-8")
    result = diagnose_path(str(merged))
    assert [d.code for d in result.diagnoses] == ["PF722", "PF703"]
    first = result.first_failure
    assert first is not None and (first.rank, first.line) == ("3", 3) and first.echo() == "rank 3's PF722 after 03:33:57"
    assert result.diagnoses[1].details["echoes"] == ["rank 3's PF722 after 03:33:57"]
    assert "first failure: rank 3: PF722 after 03:33:57" in result.render()


def test_a_folder_whose_only_errors_echo_a_peer_names_torchruns_root_cause(tmp_path: Path) -> None:
    # make_logs.py log-dir-peer-exits: torchrun --log-dir, rank 1 left without a word; rank 0's stderr.log has the reset.
    folder = LOGS / "torchrun-log-dir-peer-exits"
    result = diagnose_folder(folder)
    first = result.first_failure
    assert [d.code for d in result.diagnoses] == ["PF727"]
    assert first is not None and (first.code, first.rank, first.exitcode, first.file) == ("", "1", "3", "torchrun.log")
    assert result.diagnoses[0].details["echoes"] == [first.echo()]
    # Without torchrun's own output, the ranks' folders say only that rank 0 saw a reset: no rank is named first.
    ranks = shutil.copytree(folder, tmp_path / "ranks", ignore=shutil.ignore_patterns("torchrun.log"))
    alone = diagnose_folder(ranks)
    assert [d.code for d in alone.diagnoses] == ["PF727"] and alone.first_failure is None
    # Two hosts' agents each report their own workers' first failure: h1's is rank 0, which only saw rank 1's exit, and
    # is a second earlier; h2's is rank 1. The job's first failure is h2's rank 1.
    text = (folder / "torchrun.log").read_text(encoding="utf-8")
    stderr = next(folder.rglob("0/stderr.log")).read_text(encoding="utf-8")
    summary = text[text.index("Root Cause"):]
    h1 = stderr + summary.replace("rank      : 1 (local_rank: 1)", "rank      : 0 (local_rank: 0)")
    h1 = h1.replace(first.stamp.time if first.stamp else "", "00:00:00")
    (tmp_path / "hosts").mkdir()
    result = diagnose_folder(write_logs(tmp_path / "hosts", {"h1/torchrun.log": h1, "h2/torchrun.log": summary}))
    first = result.first_failure
    assert first is not None and (first.rank, first.host, first.file, first.exitcode) == ("1", "h2", "h2/torchrun.log", "3")


def test_without_a_launchers_report_a_rank_with_an_error_of_its_own_is_not_taken_for_the_first_failure(tmp_path: Path) -> None:
    # make_logs.py log-dir-rank-raises: torchrun --log-dir, rank 1 raises ValueError at step 3 (no signature names it);
    # rank 0's stderr.log has only gloo's reset (PF727). torchrun's summary names rank 1. Without it, rank 1's own
    # traceback is not named instead: an error line no signature reads can be an echo too (ProcessGroupNCCL's watchdog
    # prints more lines than the timeout's signature reads), and a wrong first failure is worse than none.
    folder = LOGS / "torchrun-log-dir-rank-raises"
    reported = diagnose_folder(folder).first_failure
    assert reported is not None and (reported.rank, reported.exitcode, reported.file) == ("1", "1", "torchrun.log")
    ranks = shutil.copytree(folder, tmp_path / "ranks", ignore=shutil.ignore_patterns("torchrun.log"))
    result = diagnose_folder(ranks)
    assert [d.code for d in result.diagnoses] == ["PF727"] and result.first_failure is None
    assert "echoes" not in result.diagnoses[0].details


def test_a_log_without_rank_prefixes_names_no_first_failure() -> None:
    result = diagnose_path(str(LOGS / "nccl-cuda-error-then-timeout.log"))  # no line has a rank prefix
    assert result.diagnoses and result.first_failure is None
    assert all("echoes" not in d.details for d in result.diagnoses)
