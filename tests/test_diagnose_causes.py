"""`preflight diagnose` on the causes a failed job needs (#36 item 2): a GPU out of memory, a job ended from outside, a
peer that exited, an InfiniBand async event, an NCCL topology or graph file that does not fit, a stall right after
init. Each from a real log (tests/data/logs, the H100 capture) or from the text the sources print (the message
catalogue's format strings, filled in as the libraries fill them), and each with the healthy input it must leave alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import preflight

from preflight.diagnose import Diagnosis, diagnose_file, diagnose_path, diagnose_text, parse_signatures
from preflight.diagnose.timeline import Seen, mpirun_first_process_reports, root_cause_reports, srun_task_reports
from preflight.errors import EnvironmentProblem

DATA = Path(__file__).resolve().parent / "data"
LOGS = DATA / "logs"
H100 = DATA / "h100-lent-2026-11-27"
H200 = DATA / "h200-lent-2026-11-27"
NCCL_WARN = "node1:2101:2130 [0] misc/socket.cc:47 NCCL WARN "  # debug.cc's prefix, as NCCL 2.16 to 2.29 print it


def codes(diagnoses: tuple[Diagnosis, ...]) -> list[str]:
    return [d.code for d in diagnoses]


def one(text: str) -> Diagnosis:
    (found,) = diagnose_text(text)
    return found


# --- a GPU out of memory -----------------------------------------------------------------------------------------


def test_the_h100_oom_is_the_gpu_out_of_memory_and_not_the_child_failed_error_after_it() -> None:
    # torch 2.11 under torchrun on a lent H100: torch.OutOfMemoryError, then torchrun's ChildFailedError (exitcode 1).
    (oom,) = diagnose_file(str(H100 / "torchrun-cuda-oom.log")).diagnoses
    assert (oom.code, oom.tier, oom.codes) == ("PF725", "cause", ("PF725", "PF204", "PF205"))
    assert oom.details == {"requested": ["200.00 GiB"], "gpu": ["0"], "gpu_total": ["79.18 GiB"], "gpu_free": ["78.66 GiB"]}
    assert oom.first_line == 5 and "PF204" in oom.before_job


def test_the_h100s_nccl_and_uncached_out_of_memory() -> None:
    # NCCL 2.28.9 initializing on a GPU torch had filled: NCCL's CUDA error first, the GPU out of memory next.
    (nccl,) = diagnose_file(str(H100 / "torchrun-nccl-oom.log")).diagnoses
    assert nccl.codes == ("PF701", "PF725", "PF204") and nccl.details["host"] == ["vm"] and nccl.details["nccl_version"] == ["2.28.9"]
    # The caching allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1): torch 2.11's AcceleratorError "CUDA error: out of memory".
    (plain,) = diagnose_file(str(H100 / "torchrun-cuda-error-oom.log")).diagnoses
    assert (plain.code, plain.first_line) == ("PF725", 5)


def test_the_h200s_full_gpu_seen_by_cublas_is_the_gpu_out_of_memory_and_by_cudnn_stays_unknown() -> None:
    # torch 2.11 on a lent H200 whose memory the caching allocator held to the last 9 MiB: the first matmul's cublasCreate
    # failed with CUBLAS_STATUS_ALLOC_FAILED (cuBLAS documents it as a failed cudaMalloc), diagnosed before this read it
    # as no known failure. The first conv2d printed CUDNN_STATUS_INTERNAL_ERROR, which names no one cause: unknown.
    (oom,) = diagnose_file(str(H200 / "torchrun-cublas-full-gpu.log")).diagnoses
    assert (oom.code, oom.tier, oom.first_line) == ("PF725", "cause", 6)
    assert oom.details == {"call": ["cublasCreate(handle)"]}
    assert diagnose_file(str(H200 / "torchrun-cudnn-full-gpu.log")).diagnoses == ()


def test_a_build_without_the_gpus_architecture_is_named_from_the_h200_capture_and_torchs_warnings() -> None:
    # An extension built for sm_80 only, launched on a lent H200 (sm_90): torch 2.11's AcceleratorError with
    # cudaErrorNoKernelImageForDevice, then ChildFailedError. It was no known failure before PF730.
    (found,) = diagnose_file(str(H200 / "torchrun-no-kernel-image.log")).diagnoses
    assert (found.code, found.tier, found.first_line) == ("PF730", "cause", 5)
    # torch's warnings when CUDA starts on a GPU the build lacks (torch/cuda/__init__.py, v1.13.1 to v2.13.0) name it
    # first, with the capability, before the kernel's error.
    log = ("/usr/lib/python3/site-packages/torch/cuda/__init__.py:287: UserWarning:\n"
           "NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible with the current PyTorch installation.\n"
           "The current PyTorch install supports CUDA capabilities sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90.\n"
           "RuntimeError: CUDA error: no kernel image is available for execution on the device\n")
    (warned,) = diagnose_text(log)
    assert (warned.code, warned.first_line, warned.details) == ("PF730", 2, {"capability": ["120"]})


def test_oom_wordings_of_older_torch_and_cuda_errors() -> None:
    # v1.13.1's allocator message (RuntimeError before 1.13, torch.cuda.OutOfMemoryError in 1.13).
    older = one("[rank3]: RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 3; 7.93 GiB total capacity; "
                "6.94 GiB already allocated; 13.88 MiB free; 7.18 GiB reserved in total by PyTorch) If reserved memory is >> "
                "allocated memory try setting max_split_size_mb to avoid fragmentation.\n")
    assert older.code == "PF725" and older.ranks == (3,)
    assert older.details == {"requested": ["20.00 MiB"], "gpu": ["3"], "gpu_total": ["7.93 GiB"], "gpu_free": ["13.88 MiB"]}
    # C10_CUDA_CHECK's message for a cudaMalloc outside the caching allocator.
    assert one("torch.AcceleratorError: CUDA error: out of memory\n").code == "PF725"


def test_oom_with_another_process_on_the_gpu_names_it_first() -> None:
    text = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.10 GiB "
            "of which 1.06 GiB is free. Process 48211 has 60.12 GiB memory in use. Including non-PyTorch memory, this process "
            "has 17.90 GiB memory in use. Of the allocated memory 16.20 GiB is allocated by PyTorch, and 640.00 MiB is reserved "
            "by PyTorch but unallocated.\n")
    oom = one(text)
    assert oom.codes == ("PF725", "PF205", "PF204")
    assert oom.details["other_process"] == ["48211"] and oom.details["other_process_memory"] == ["60.12 GiB"]


def test_nccls_own_out_of_memory_stays_nccls_cuda_error_with_the_gpu_oom_next() -> None:
    cuda = one("ng30903:3063028:3066152 [3] include/alloc.h:178 NCCL WARN Cuda failure 2 'out of memory'\n")
    assert cuda.codes == ("PF701", "PF725", "PF204") and cuda.details["cuda_error"] == ["out of memory"]


def test_a_host_oom_kill_is_not_the_gpu_out_of_memory() -> None:
    host = one("  exitcode  : -9 (pid: 2847)  (SIGKILL)\n  traceback : Signal 9 (SIGKILL) received by PID 2847\n")
    assert host.code == "PF721" and "PF725" not in host.codes


# --- a job ended from outside ------------------------------------------------------------------------------------


def test_torchrun_sent_sigterm_is_the_job_ended_from_outside() -> None:
    # make_logs.py's sigterm case: two ranks training, SIGTERM to torchrun after step 3 (as scancel or a pod's deletion).
    result = diagnose_file(str(LOGS / "torchrun-sigterm.log"))
    (ended,) = result.diagnoses  # not a hang: the log says why it stopped
    assert (ended.code, ended.tier, ended.details["signal"]) == ("PF726", "cause", ["15"])
    assert [e.line for e in ended.excerpts] == [13, 43]  # "Received 15 death signal", then the SignalException


@pytest.mark.parametrize(("line", "reason"), [
    ("slurmstepd: error: *** JOB 4242 ON node017 CANCELLED AT 2026-11-27T03:34:06 DUE TO TIME LIMIT ***", "TIME LIMIT"),
    ("slurmstepd: error: *** STEP 4242.0 ON gpu-a100-03 CANCELLED AT 2026-11-27T03:34:06 DUE TO PREEMPTION ***", "PREEMPTION"),
    ("slurmstepd: error: *** JOB 4242 ON node017 CANCELLED AT 2026-11-27T03:34:06 DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR "
     "DETAILS ***", "NODE FAILURE"),
    ("slurmstepd: error: *** JOB 4242 ON node017 CANCELLED AT 2026-11-27T03:34:06 DUE to SIGNAL Terminated ***", "SIGNAL Terminated"),
    ("slurmstepd: error: *** STEP 4242.0 ON node017 CANCELLED AT 2026-11-27T03:34:06 ***", None),
])
def test_slurms_cancellations_name_the_reason_and_the_node(line: str, reason: str | None) -> None:
    ended = one(f"rank 0: epoch 3 step 1200\n{line}\n")
    assert (ended.code, ended.tier, ended.details["node"][0]) == ("PF726", "cause", line.split(" ON ")[1].split()[0])
    assert ended.details.get("reason") == ([reason] if reason else None)


def test_a_task_failure_and_the_agents_own_sigterm_are_not_from_outside() -> None:
    # Slurm 25.05's cancellation of the other tasks after one failed is the failure's consequence, not a cause.
    assert diagnose_text("slurmstepd: error: *** STEP 4242.0 ON node017 CANCELLED AT 2026-11-27T03:34:06 DUE TO TASK FAILURE ***\n") == ()
    # torchrun's report of the rank it stopped with SIGTERM once the other failed (make_logs.py's sampler-with-shuffle).
    assert codes(diagnose_file(str(LOGS / "sampler-with-shuffle.log")).diagnoses) == ["PF708"]


def test_a_cancellation_after_another_failure_is_its_consequence() -> None:
    text = ("[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of "
            "79.10 GiB of which 1.06 GiB is free.\n"
            "slurmstepd: error: *** STEP 4242.0 ON node017 CANCELLED AT 2026-11-27T03:34:06 ***\n")
    oom, cancelled = diagnose_text(text)
    assert (oom.code, oom.tier) == ("PF725", "cause") and (cancelled.code, cancelled.tier) == ("PF726", "consequence")
    # Alone, or before the other failure, it stays a cause.
    assert one(text.splitlines()[1] + "\n").tier == "cause"


def test_in_a_folder_a_cancelled_node_follows_the_node_that_failed(tmp_path: Path) -> None:
    # Slurm's per-node output files: node-a was cancelled when node-b's rank ran out of GPU memory. Files have no order
    # between them (node-a sorts first), so the other file's cause makes the cancellation its consequence.
    (tmp_path / "node-a.out").write_text("slurmstepd: error: *** STEP 4242.0 ON node-a CANCELLED AT 2026-11-27T03:34:06 ***\n")
    (tmp_path / "node-b.out").write_text("[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 "
                                         "has a total capacity of 79.10 GiB of which 1.06 GiB is free.\n")
    oom, cancelled = diagnose_path(str(tmp_path)).diagnoses
    assert (oom.code, oom.tier) == ("PF725", "cause") and (cancelled.code, cancelled.tier) == ("PF726", "consequence")
    # A node cancelled by the time limit, beside a node whose peer connection closed: the time limit is the cause.
    (tmp_path / "node-a.out").write_text("slurmstepd: error: *** JOB 4242 ON node-a CANCELLED AT 2026-11-27T03:34:06 DUE TO "
                                         "TIME LIMIT ***\n")
    (tmp_path / "node-b.out").write_text(NCCL_WARN + "socketProgress: Connection closed by remote peer node-a<50226>\n")
    limit, closed = diagnose_path(str(tmp_path)).diagnoses
    assert (limit.code, limit.tier) == ("PF726", "cause") and (closed.code, closed.tier) == ("PF727", "consequence")


def test_after_error_must_name_a_tier() -> None:
    good = {"id": "x", "tier": "cause", "codes": ["PF726"], "patterns": ["abc"], "check": "none: a test"}
    assert parse_signatures({"signatures": [{**good, "after_error": "consequence"}]}).signatures[0].after_error == "consequence"
    with pytest.raises(EnvironmentProblem, match="after_error must be one of"):
        parse_signatures({"signatures": [{**good, "after_error": "later"}]})
    with pytest.raises(EnvironmentProblem, match="`after` lines need after_error"):
        parse_signatures({"signatures": [{**good, "after": ["failed"]}]})


LOOPBACK_CONNECT = ("RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:152] timed out "
                    "connecting: SO_ERROR: Connection refused, remote=[127.0.0.1]:20866\n")
WORKER_FAILED = ("E1129 03:47:00.563000 19713 site-packages/torch/distributed/elastic/multiprocessing/api.py:1002] failed "
                 "(exitcode: -6) local_rank: 1 (pid: 19719) of binary: /usr/bin/python3\n")


def test_a_loopback_connect_after_a_failed_worker_is_a_restarts_echo_not_the_hostname() -> None:
    # make_logs.py restart-c10d: torchrun --max-restarts 1 with a c10d rendezvous on one host; rank 1 raises at step 3,
    # and the restarted rank 0's gloo connects to the port rank 1 had in the first attempt. The log's only failure line
    # before it is the agent's own "failed (exitcode: ...)", which no signature names.
    (connect,) = diagnose_file(str(LOGS / "torchrun-restart-c10d.log")).diagnoses
    assert (connect.code, connect.tier) == ("PF301", "consequence")
    assert one(WORKER_FAILED + LOOPBACK_CONNECT).tier == "consequence"
    assert one(LOOPBACK_CONNECT).tier == "cause" and one(LOOPBACK_CONNECT + WORKER_FAILED).tier == "cause"
    # A paste that wraps gloo's error: its first half (gloo-connect-failed, PF711 with PF301 among its codes) is the same
    # failure, so the loopback connect on the next line still leads as the cause.
    wrapped = LOOPBACK_CONNECT.replace(" timed out connecting", "\n  timed out connecting")
    assert [(d.code, d.tier) for d in diagnose_text(wrapped)] == [("PF301", "cause"), ("PF711", "consequence")]


# --- a peer that exited ----------------------------------------------------------------------------------------


def test_a_peer_that_exited_is_a_consequence_naming_its_address_and_torchruns_failed_rank() -> None:
    # make_logs.py's peer-exits case: rank 1 exits without a word at step 3; rank 0's gloo all_reduce is reset.
    (closed,) = diagnose_file(str(LOGS / "gloo-peer-exits.log")).diagnoses
    assert (closed.code, closed.tier, closed.ranks) == ("PF727", "consequence", (0,))
    assert closed.details["peer"] == ["127.0.0.1"] and closed.details["error"] == ["Connection reset by peer"]
    assert closed.details["first_failed_local_rank"] == ["1"] and closed.details["first_failed_exitcode"] == ["3"]


def test_a_rendezvous_host_lost_mid_job_is_a_consequence_not_an_endpoint_never_reached() -> None:
    # make_logs.py node-loss: two namespace hosts, a c10d rendezvous at h1; at step 5 every process of h1's job is
    # SIGKILLed. h2's rank sees gloo's connection to h1 closed; its agent's store call gets "Failed to recv, got 0 bytes"
    # and elastic wraps it as RendezvousConnectionError, the same text as a start that never reached the store.
    text = (LOGS / "rendezvous-host-lost-h2.log").read_text(encoding="utf-8")
    assert "RendezvousConnectionError: The connection to the C10d store has failed" in text
    (closed,) = diagnose_file(str(LOGS / "rendezvous-host-lost-h2.log")).diagnoses
    assert (closed.code, closed.tier, closed.ranks) == ("PF727", "consequence", (1,))
    assert closed.details["peer"] == ["198.18.190.11"]  # h1's address: the host that went away
    # The wrapper with no closed connection before it (pytorch/pytorch#64926's start, whose error file holds only it)
    # is still an endpoint never reached.
    assert one('"message": "RendezvousConnectionError: The connection to the C10d store has failed. See inner exception '
               'for details.",\n').code == "PF717"


def test_a_store_connect_that_timed_out_is_the_endpoint_out_of_reach_and_an_unreachable_twin_address_is_not() -> None:
    # make_logs.py rendezvous-dropped under torch 1.12.1: h1 drops every packet, and h2's store client ended each of the
    # endpoint's addresses on ETIMEDOUT before its "any network address" error. The warning alone (a paste of one line,
    # hiyouga/LlamaFactory#3715's title, a train log) is read the same way.
    log = LOGS / "rendezvous-dropped-torch1.12.1.log"
    (unreachable,) = diagnose_file(str(log)).diagnoses
    assert (unreachable.code, unreachable.first_line) == ("PF717", 1)
    warning = ("[W socket.cpp:663] [c10d] The client socket has failed to connect to [::ffff:10.0.0.5]:29500 "
               "(errno: 110 - Connection timed out).\n")
    found = one(warning)
    assert (found.code, found.details["endpoint"]) == ("PF717", ["[::ffff:10.0.0.5]:29500"])
    # The same warning for an address that is unreachable or cannot be assigned (no IPv6 route, localhost's ::1 on a
    # host without IPv6) is often the twin of an address that then connects: no diagnosis, unless the whole connect fails.
    for errno in ("101 - Network is unreachable", "113 - No route to host", "99 - Cannot assign requested address"):
        assert diagnose_text(warning.replace("110 - Connection timed out", errno)) == ()
    # 2.13.0 retries a connect that timed out; its retry warning alone is no failure, its final timeout is.
    retried = (LOGS / "rendezvous-dropped.log").read_text(encoding="utf-8").splitlines(keepends=True)
    assert "has timed out, will retry" in retried[1] and diagnose_text(retried[1]) == ()
    assert codes(diagnose_file(str(LOGS / "rendezvous-dropped.log")).diagnoses) == ["PF717"]


def test_the_rank_that_saw_a_peer_exit_is_not_the_first_failure_torchruns_root_cause_is() -> None:
    # gloo-peer-exits.log: rank 1 left without a word, so the only error a signature reads is rank 0's reset (PF727);
    # torchrun's summary names rank 1 (exit code 3) as its root cause, and the reset echoes it.
    text = (LOGS / "gloo-peer-exits.log").read_text(encoding="utf-8")
    result = diagnose_file(str(LOGS / "gloo-peer-exits.log"))
    first = result.first_failure
    assert first is not None and (first.code, first.rank, first.host, first.exitcode, first.line) == ("", "1", "localhost", "3", 53)
    assert first.stamp is not None and first.stamp.to_json() == "2026-11-27 04:12:14"
    (closed,) = result.diagnoses
    assert closed.details["echoes"] == ["rank 1 on host localhost's exit code 3 at 04:12:14"]
    assert "first failure: rank 1 on host localhost: exit code 3 (torchrun's root cause; no known signature) at 04:12:14" in result.render()
    assert result.to_json()["first_failure"]["code"] is None and result.to_json()["first_failure"]["exitcode"] == "3"
    # torch 1.9's summary ("Root Cause:", no host, "rank: 1 (local_rank: 1)") names it the same way.
    old_summary = text.replace("Root Cause (first observed failure):", "Root Cause:").replace("  host      : localhost\n", "")
    for field in ("rank", "exitcode", "time"):
        old_summary = old_summary.replace(f"  {field:<10}:", f"  {field}:")
    (first_of_old,) = _reports(old_summary)
    assert (first_of_old.rank, first_of_old.exitcode, first_of_old.host) == ("1", "3", "")


def test_where_no_signature_reads_an_error_the_launchers_report_still_names_the_first_failure(tmp_path: Path) -> None:
    # The same job under PyPI's torch 2.14.1 (bench/version_sweep.py's run): torchrun stopped rank 0 before its next
    # all_reduce met the reset, so no line a signature reads is left; torchrun's root cause (rank 1, exit code 3) is.
    result = diagnose_file(str(LOGS / "gloo-peer-exits-torch2.14.1.log"))
    first = result.first_failure
    assert result.diagnoses == () and first is not None
    assert (first.rank, first.host, first.exitcode, first.file) == ("1", "localhost", "3", str(LOGS / "gloo-peer-exits-torch2.14.1.log"))
    assert "first failure: rank 1 on host localhost: exit code 3 (torchrun's root cause; no known signature)" in result.render()
    assert result.to_json()["status"] == "none" and result.to_json()["first_failure"]["exitcode"] == "3"
    # A signal by its name (SIGSEGV under torchrun, srun's "Segmentation fault"); a healthy run has no report to name.
    forced = diagnose_file(str(LOGS / "torchrun-forced-kill.log")).first_failure
    assert forced is not None and forced.exitcode == "-11"
    srun = diagnose_file(str(LOGS / "srun-kill-on-bad-exit-segfault.log")).first_failure
    assert srun is not None and (srun.rank, srun.ended()) == ("1", "Segmentation fault")
    assert diagnose_file(str(LOGS / "clean-ddp-train.log")).first_failure is None
    # A folder of such logs the same: its launcher's report names the rank.
    (tmp_path / "torchrun.log").write_bytes((LOGS / "gloo-peer-exits-torch2.14.1.log").read_bytes())
    folder = diagnose_path(str(tmp_path))
    assert folder.diagnoses == () and folder.first_failure is not None
    assert (folder.first_failure.rank, folder.first_failure.exitcode) == ("1", "3")


def test_spawns_failed_process_is_the_first_failure_where_no_rank_showed_a_consequence() -> None:
    # make_logs.py spawn-signal and old-spawn (torch 2.13.0, 1.7.1): spawn's join raises for the process it found failed.
    for name, ended in (("spawn-rank-segfault.log", "signal SIGSEGV"), ("spawn-rank-killed.log", "signal SIGKILL"),
                        ("spawn-rank-killed-torch1.7.1.log", "signal SIGKILL"),  # "Exception: process 1 terminated with ..."
                        ("spawn-invalid-device-ordinal.log", "an exception (its traceback follows)")):
        result = diagnose_file(str(LOGS / name))
        first = result.first_failure
        assert first is not None and (first.process, first.rank, first.ended()) == ("1", "", ended), name
        assert f"first failure: process 1: {ended} (torch.multiprocessing.spawn's failed process" in result.render(), name
        assert result.to_json()["first_failure"]["process"] == "1"
    # spawn's index is not a rank: where rank 0 reported the others late at a monitored barrier (a consequence on a known
    # rank), spawn's "-- Process 0 terminated" is that report's own process, and names no first failure.
    barrier = diagnose_file(str(LOGS / "monitored-barrier-two-late.log"))
    assert "-- Process 0 terminated with the following error:" in (LOGS / "monitored-barrier-two-late.log").read_text()
    assert [d.code for d in barrier.diagnoses] == ["PF703"] and barrier.first_failure is None


def test_sruns_first_failed_task_is_the_first_failure_where_srun_started_the_ranks() -> None:
    # Captured on this machine's one-node Slurm (tests/test_slurm.py's cluster, by a throwaway test): `srun -n 2 --label`
    # of a gloo job whose rank 1 raises ValueError, then leaves with os._exit(3), at step 3. Rank 0's reset is the only
    # recognized line; srun's "vm: task 1: Exited with exit code N", printed as srun learns of each task, names rank 1.
    for name, exitcode, line in (("srun-label-rank-raises.log", "1", 20), ("srun-label-rank-exits.log", "3", 7)):
        result = diagnose_file(str(LOGS / name))
        (closed,) = result.diagnoses
        first = result.first_failure
        assert closed.code == "PF727" and closed.ranks == (0,)
        assert first is not None and (first.rank, first.host, first.exitcode, first.line) == ("1", "vm", exitcode, line), name
        assert f"rank 1 on host vm: exit code {exitcode} (srun's first failed task; no known signature)" in result.render()
        assert closed.details["echoes"] == [f"rank 1 on host vm's exit code {exitcode}"]
    # A report of several tasks at once names none of them; a signal is named by its text.
    (report,) = srun_task_reports("3: srun: error: vm: task 2: Segmentation fault (core dumped)\n", 1, "job.log")
    assert (report.rank, report.ended()) == ("2", "Segmentation fault (core dumped)")
    assert srun_task_reports("srun: error: vm: tasks 0-7: Exited with exit code 1\n", 1, "job.log") == []


def test_mpiruns_first_failed_process_is_the_first_failure() -> None:
    # make_logs.py openmpi-exit (Debian's Open MPI 4.1.4): mpirun of 2 gloo ranks, rank 1 raising, then leaving with
    # os._exit(3). mpirun names "The first process to do so was:" with "Process name: [[JOB,1],1]" and its exit code.
    for name, exitcode in (("openmpi-rank-raise.log", "1"), ("openmpi-rank-exit.log", "3")):
        result = diagnose_file(str(LOGS / name))
        first = result.first_failure
        assert [d.code for d in result.diagnoses] == ["PF727"]
        assert first is not None and (first.rank, first.exitcode, first.reporter) == ("1", exitcode, "mpirun's first failed process")
    # PRRTE's (Open MPI 5) wording, wrapped from 3.0.7, and its [NSPACE,RANK] names
    prrte = ("prterun detected that one or more processes exited with non-zero status,\nthus causing the job to be terminated. "
             "The first process to do so was:\n\n   Process name: [prterun-vm-4242@1,7]\n   Exit code:    3\n")
    (report,) = mpirun_first_process_reports(prrte, 1, "job.log")
    assert (report.rank, report.exitcode, report.line) == ("7", "3", 4)


def test_lightning_which_reports_no_failed_rank_leaves_the_first_failure_unnamed() -> None:
    # Captured here: Lightning 2.5.2 (PyPI's wheel, in a venv over this machine's torch 2.13.0), Trainer(devices=2,
    # strategy="ddp") on CPU, rank 1's training_step raising ValueError at batch 3. Lightning starts the ranks itself and
    # prints no report of which failed. Rank 0's reset is a consequence, so rank 0 is not named; rank 1's traceback is
    # read by no signature, and an unread error line is not taken for the first failure (it can be an echo too).
    result = diagnose_file(str(LOGS / "lightning-ddp-rank-raises.log"))
    (closed,) = result.diagnoses
    assert (closed.code, closed.tier, closed.ranks) == ("PF727", "consequence", (0,))
    assert result.first_failure is None and "\nfirst failure: " not in result.render()


def test_a_root_cause_report_naming_the_rank_that_echoed_or_an_unknown_rank_names_no_first_failure(tmp_path: Path) -> None:
    text = (LOGS / "gloo-peer-exits.log").read_text(encoding="utf-8")
    reported_rank_0 = text.replace("  rank      : 1 (local_rank: 1)\n  exitcode  : 3", "  rank      : 0 (local_rank: 0)\n  exitcode  : 3")
    no_prefixes = text.replace("[rank0]:", "")
    for name, variant in (("rank0.log", reported_rank_0), ("plain.log", no_prefixes)):
        (tmp_path / name).write_text(variant, encoding="utf-8")
        result = diagnose_file(str(tmp_path / name))
        assert [d.code for d in result.diagnoses] == ["PF727"] and result.first_failure is None, name
        assert "echoes" not in result.diagnoses[0].details


def _reports(text: str) -> list[Seen]:
    return root_cause_reports(text, 1, "job.log")


@pytest.mark.parametrize(("line", "peer", "port"), [
    (NCCL_WARN + "socketProgress: Connection closed by remote peer node2.cluster<50226>", "node2.cluster", "50226"),
    (NCCL_WARN.replace("misc/socket.cc:47", "include/socket.h:421") + "Net : Connection closed by remote peer", None, None),
    (NCCL_WARN.replace("misc/socket.cc:47", "misc/socket.cc:518") + "Net : Call to recv from 10.1.2.3<58355> failed : Broken pipe",
     "10.1.2.3", "58355"),  # NCCL 2.10 to 2.23's words for the same
    ("[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.1.2.3]:43210",
     "10.1.2.3", "43210"),
    ("[rank2]: torch.distributed.DistNetworkError: failed to recv, got 0 bytes", None, None),
    ("[rank2]: torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed. Did the remote "
     "server shutdown or crash?", None, None),
])
def test_each_librarys_closed_connection(line: str, peer: str | None, port: str | None) -> None:
    closed = one(line + "\n")
    assert closed.code == "PF727" and closed.details.get("peer") == ([peer] if peer else None)
    assert closed.details.get("port") == ([port] if port else None)


def test_a_rank_that_lost_rank_0s_store_reading_the_nccl_id_is_a_closed_connection_and_a_timeout_is_not() -> None:
    # ProcessGroupNCCL's broadcastUniqueNCCLID message (v2.6.0's words, the catalogue's), built with the store's errors.
    head = ("[rank3]: torch.distributed.DistBackendError: [3] is setting up NCCL communicator and retrieving ncclUniqueId "
            "from [0] via c10d key-value store by key '0', but store->get('0') got error: ")
    tail = ". This may indicate a possible application crash on rank 0 or a network set up issue.\n"
    closed = one(head + "Connection reset by peer" + tail)
    assert (closed.code, closed.tier, closed.details["error"]) == ("PF727", "consequence", ["Connection reset by peer"])
    assert one(head + "Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?"
               + tail).code == "PF727"
    # A timeout there is rank 0 that never got to NCCL's init, or the store's network: two causes, neither named.
    assert diagnose_text(head + "Socket Timeout" + tail) == ()


def test_the_first_error_leads_the_closed_connections_it_causes() -> None:
    text = ("[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of "
            "79.10 GiB of which 1.06 GiB is free.\n" + NCCL_WARN + "socketProgress: Connection closed by remote peer node2<50226>\n")
    assert codes(diagnose_text(text)) == ["PF725", "PF727"]
    # The closed connection may be printed first (its rank's log arrived first): the cause still leads.
    assert codes(diagnose_text("\n".join(reversed(text.splitlines())) + "\n")) == ["PF725", "PF727"]


def test_a_closed_connection_after_the_workers_succeeded_is_no_failure() -> None:
    # A clean run (make_logs.py's clean case), torch elastic's success line, then a peer's socket closing as the job ends.
    clean = (LOGS / "clean-ddp-train.log").read_text(encoding="utf-8")
    ending = ("I1127 04:12:20.100000 5006 site-packages/torch/distributed/elastic/agent/server/api.py:933] [default] worker "
              "group successfully finished. Waiting 300 seconds for other agents to finish.\n"
              + NCCL_WARN + "socketProgress: Connection closed by remote peer node2<50226>\n")
    assert diagnose_text(clean) == () and diagnose_text(clean + ending) == ()
    # ProcessGroupNCCL's heartbeat monitor when rank 0's store is gone at the end of a good run: the store client's text,
    # but as a warning, not the exception.
    heartbeat = ("[rank1]:[W1127 04:12:20.1 ProcessGroupNCCL.cpp:1682] [PG ID 0 PG GUID 0(default_pg) Rank 1] Failed to "
                 "check the \"should dump\" flag on TCPStore, (maybe TCPStore server has shut down too early), with error: "
                 "Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?\n")
    assert diagnose_text(clean + heartbeat) == ()


# --- a peer whose host or path stopped answering ----------------------------------------------------------------

GLHF = (". This is typically caused by a remote worker hanging or bugs in the application. Check the logs of the remote "
        "worker before reporting an error. GLHF! \U0001f3d6\ufe0f")  # gloo's words after strerror from f834c75 (2025)


@pytest.mark.parametrize(("line", "error"), [
    ("[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:589] Read error [10.1.2.3]:43210: "
     "Connection timed out", "Connection timed out"),
    ("[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
     "[10.1.2.3]:43210: No route to host" + GLHF, "No route to host"),
    ("[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:420] writev [10.1.2.3]:43210: Connection timed out",
     "Connection timed out"),
    (NCCL_WARN.replace("misc/socket.cc:47", "misc/socket.cc:518") + "socketProgressOpt: Call to recv from 10.1.2.3<43210> "
     "failed : Connection timed out", "Connection timed out"),
    (NCCL_WARN.replace("misc/socket.cc:47", "os/linux.cc:212") + "ncclOsSocketProgressOpt: Call to send to 10.1.2.3<43210> "
     "failed : Network is unreachable", "Network is unreachable"),
])
def test_a_connection_the_kernel_gave_up_on_is_the_path_or_the_peers_host_not_a_peer_that_exited(line: str, error: str) -> None:
    unreachable = one(line + "\n")
    assert (unreachable.code, unreachable.tier, unreachable.details["error"]) == ("PF737", "cause", [error])
    assert unreachable.details["peer"] == ["10.1.2.3"] and unreachable.details["port"] == ["43210"]
    assert unreachable.codes == ("PF737", "PF611", "PF610", "PF612") and "playbook=connectivity" in unreachable.before_job
    # The same call sites with a reset are a peer that exited, in both of gloo's wordings.
    reset = line.replace(error, "Connection reset by peer")
    assert one(reset + "\n").code == "PF727", reset


def test_a_connection_timed_out_after_another_failure_is_its_echo() -> None:
    # A host that went down after its GPU fell off the bus (a kernel panic): the Xid, the hardware's tier, leads.
    xid = "[Fri Aug 30 12:40:18 2024] NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus\n"
    timed_out = ("[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:589] Read error [10.1.2.3]:43210: "
                 "Connection timed out\n")
    assert codes(diagnose_text(timed_out + xid)) == ["PF801", "PF737"]
    # After an error a signature names, the timed out connection is read as its echo.
    oom = ("[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of "
           "79.10 GiB of which 1.06 GiB is free.\n")
    assert [(d.code, d.tier) for d in diagnose_text(oom + timed_out)] == [("PF725", "cause"), ("PF737", "consequence")]


def test_jumbo_frames_behind_a_1500_byte_bridge_time_out_one_ranks_connection_and_the_other_waits() -> None:
    # make_logs.py mtu-blackhole: two sandbox hosts at MTU 9000 on a bridge whose ports carry 1500, gloo's all_reduce of
    # 8 MB. One rank's kernel gave up on its connection; the other, alive, waited out its recv (which one varies by run).
    hosts = {name: codes(diagnose_file(str(LOGS / f"gloo-mtu-blackhole-{name}.log")).diagnoses) for name in ("h1", "h2")}
    assert sorted(hosts.values()) == [["PF703"], ["PF737"]], hosts
    result = diagnose_file(str(LOGS / "gloo-mtu-blackhole-cluster.log"))
    unreachable, timeout = result.diagnoses
    assert (unreachable.code, unreachable.details["error"], timeout.code) == ("PF737", ["Connection timed out"], "PF703")
    assert unreachable.details["peer"][0].startswith("198.18.190.") and "PF611" in unreachable.before_job
    # The merged log's "h1: [rank0]:" prefixes (a collector's, as pdsh's) name each line's host and rank.
    assert result.first_failure is not None and result.first_failure.code == "PF737"
    assert {unreachable.details["host"][0], timeout.details["host"][0]} == {"h1", "h2"}
    assert unreachable.details["host"] == [result.first_failure.host] and unreachable.ranks != timeout.ranks


def test_a_collectors_host_prefix_names_the_host_only_before_torchs_rank_prefix() -> None:
    (named,) = diagnose_text("node7: [rank3]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:589] Read "
                             "error [10.1.2.3]:43210: Connection timed out\n")
    assert named.ranks == (3,) and named.details["host"] == ["node7"] and named.first_rank == "3"
    (plain,) = diagnose_text("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:589] Read error "
                             "[10.1.2.3]:43210: Connection timed out\n")
    assert plain.ranks == () and "host" not in plain.details


def test_a_link_that_went_down_mid_job_is_a_connection_timed_out_on_one_side_and_no_route_on_the_other() -> None:
    # make_logs.py link-down: h2's link went down at the bridge once both ranks were past step 5 (tcp_retries2=5 in both
    # namespaces, so TCP gave up in seconds rather than Linux's default 15 minutes).
    (unreachable,) = diagnose_file(str(LOGS / "gloo-link-down-cluster.log")).diagnoses
    assert unreachable.code == "PF737" and sorted(unreachable.details["error"]) == ["Connection timed out", "No route to host"]
    assert [e.text[:4] for e in unreachable.excerpts] == ["h1: ", "h2: "] and unreachable.details["host"] == ["h1", "h2"]


def test_a_rank_with_no_route_to_its_peers_address_is_the_cause_and_the_peer_that_waited_its_echo() -> None:
    # make_logs.py rail-astray: GLOO_SOCKET_IFNAME=eth1 on two sandbox hosts, h2's rail addressed on another subnet.
    # h2's gloo could not connect at all ("connect: Network is unreachable", at once); h1 waited 100 s: "Connect timeout".
    (h2,) = diagnose_file(str(LOGS / "gloo-rail-astray-h2.log")).diagnoses
    assert (h2.code, h2.tier, h2.signatures) == ("PF711", "cause", ("gloo-connect-unreachable",))
    assert h2.details["error"] == ["Network is unreachable"]
    assert h2.codes[1:3] == ("PF307", "PF306") and "PF307" in h2.before_job
    (h1,) = diagnose_file(str(LOGS / "gloo-rail-astray-h1.log")).diagnoses
    assert (h1.code, h1.tier) == ("PF711", "consequence")
    result = diagnose_file(str(LOGS / "gloo-rail-astray-cluster.log"))
    (both,) = result.diagnoses
    assert (both.code, both.tier, both.excerpts[0].text[:4]) == ("PF711", "cause", "h2: ")
    assert result.first_failure is not None and (result.first_failure.rank, result.first_failure.host) == ("1", "h2")
    # gloo before its RAII socket (2023) said it from pair.cc; another errno at the same call is no route's cause.
    old = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:271] connect: No route to host\n"
    assert [(d.code, d.tier) for d in diagnose_text(old)] == [("PF711", "cause")]
    assert diagnose_text(old.replace("No route to host", "Cannot assign requested address")) == ()
    # After another failure it is that failure's echo, as the connect timeout is.
    oom = "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    assert [(d.code, d.tier) for d in diagnose_text(oom + old)] == [("PF725", "cause"), ("PF711", "consequence")]


def test_gloos_bind_that_finds_no_ephemeral_port_is_not_the_rendezvous_port_in_use() -> None:
    # make_logs.py ports-exhausted: ip_local_port_range narrowed to two ports in both namespaces, GLOO_SOCKET_IFNAME=eth0.
    # gloo binds port 0 (its listener), so "Address already in use" is the range used up; PF707 was named before.
    result = diagnose_file(str(LOGS / "gloo-ports-exhausted-h1.log"))
    (exhausted,) = result.diagnoses
    assert (exhausted.code, exhausted.tier, exhausted.codes) == ("PF739", "cause", ("PF739",))
    # gloo before 2023 (a listener per pair, pair.cc) and its device's test bind of the name's address: the same.
    old = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:176] bind: Address already in use\n"
    device = ("RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:125] bind_rv == 0. Unable to "
              "find address for node-7; bind(2) for [10.0.0.7]:0 failed with: Address already in use\n")
    assert codes(diagnose_text(old)) == codes(diagnose_text(device)) == ["PF739"]
    # NCCL's listening sockets ask for port 0 too, unless NCCL_COMM_ID forces the root's: PF739 first, PF707 beside it.
    for nccl in ("node1:2210:2392 [0] include/socket.h:333 NCCL WARN Call to bind failed : Address already in use\n",
                 "node1:2210:2392 [0] misc/socket.cc:137 NCCL WARN Call to bind failed: Address already in use\n"):
        (bind,) = diagnose_text(nccl)
        assert (bind.code, bind.codes, bind.tier) == ("PF739", ("PF739", "PF707"), "cause")
    # The store's own bind of MASTER_PORT stays PF707, in torch's words and in a bare strerror.
    store = ("[W socket.cpp:426] [c10d] The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in "
             "use).\nRuntimeError: Address already in use\n")
    assert codes(diagnose_text(store)) == ["PF707"]
    # Without GLOO_SOCKET_IFNAME torch's test bind fails first and it falls back to loopback: its warning names the
    # hostname (PF309), with PF739 beside it.
    fallback = diagnose_file(str(LOGS / "gloo-ports-exhausted-fallback-cluster.log")).diagnoses[0]
    assert (fallback.code, fallback.codes) == ("PF309", ("PF309", "PF302", "PF739"))
    # The same under torch 2.1.2 (bench/version_sweep.py --hosts): both hosts fell back to 127.0.0.1 and drew the same
    # port, so each one's peer advertised its own address: gloo's "Cannot connect to self" is the failure to connect.
    older = diagnose_file(str(LOGS / "gloo-ports-exhausted-fallback-torch2.1.2-cluster.log")).diagnoses
    assert [(d.code, d.tier) for d in older] == [("PF309", "cause"), ("PF711", "consequence")]
    assert older[0].details["gloo_failure"] == ["Cannot connect to self"]
    # The check alone, with no fallback warning beside it, is gloo's failure to connect and names no cause.
    self_only = ("RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:311] rv != 0. 0 vs 0. "
                 "Cannot connect to self\n")
    assert [(d.code, d.tier) for d in diagnose_text(self_only)] == [("PF711", "consequence")]


# --- a thread that could not be started -------------------------------------------------------------------------


def test_a_thread_the_task_limit_refused_is_read_in_each_runtimes_words() -> None:
    # make_logs.py task-limit: 2 ranks with 4 DataLoader workers each in a pids cgroup of 30 tasks.
    result = diagnose_file(str(LOGS / "torchrun-task-limit.log"))
    limit, closed = result.diagnoses
    assert (limit.code, limit.tier, closed.code) == ("PF738", "cause", "PF727") and limit.matches >= 2
    assert "ulimit -u" in limit.before_job and "pids.max" in limit.before_job
    # libgomp's and OpenBLAS's own lines (the catalogue's formats, torch 2.13.0's libgomp and numpy 2.4.6's OpenBLAS)
    gomp = one("libgomp: Thread creation failed: Resource temporarily unavailable\n")
    assert (gomp.code, gomp.details) == ("PF738", {"error": ["Resource temporarily unavailable"]})
    blas = one("OpenBLAS blas_thread_init: pthread_create failed for thread 3 of 8: Resource temporarily unavailable\n"
               "OpenBLAS blas_thread_init: RLIMIT_NPROC 4096 current, 4096 max\n")
    assert blas.code == "PF738" and blas.details["nproc_max"] == ["4096"] and blas.details["threads"] == ["8"]
    # OpenBLAS's limit line alone, printed by nothing that failed, is no failure
    assert diagnose_text("OpenBLAS blas_thread_init: RLIMIT_NPROC 4096 current, 4096 max\n") == ()


def test_a_process_the_task_limit_refused_is_read_beside_the_forks_frame_only() -> None:
    # make_logs.py fork-limit: 8 DataLoader workers per rank in a pids cgroup of 14 tasks: os.fork's EAGAIN.
    (fork,) = diagnose_file(str(LOGS / "torchrun-fork-limit.log")).diagnoses
    assert (fork.code, fork.signatures, fork.details["fork_call"]) == ("PF738", ("fork-limit",), ["os.fork"])
    # The same BlockingIOError from a non-blocking socket is not the limit.
    sock = ("  File \"/usr/lib/python3.11/socket.py\", line 706, in readinto\n    return self._sock.recv_into(b)\n"
            "BlockingIOError: [Errno 11] Resource temporarily unavailable\n")
    assert diagnose_text(sock) == ()
    spawned = "                    self.pid = _fork_exec(\nBlockingIOError: [Errno 11] Resource temporarily unavailable\n"
    assert one(spawned).details["fork_call"] == ["_fork_exec"]


# --- the launcher's first failure beside a cause no rank prefix names -----------------------------------------------


def test_gloos_enforce_on_a_collective_of_another_size_is_a_mismatch_placed_by_torchruns_report() -> None:
    # make_logs.py collective-size-mismatch: rank 0 all_reduces 1024 floats, rank 1 4096. gloo's enforce aborts rank 0 with
    # the C++ runtime's "what():" line, which no rank prefix names: torchrun's root cause report places the failure.
    result = diagnose_file(str(LOGS / "gloo-size-mismatch.log"))
    mismatch, reset = result.diagnoses
    assert (mismatch.code, mismatch.tier, mismatch.details) == (
        "PF723", "cause", {"received_bytes": ["4096"], "expected_bytes": ["1024"]})
    assert result.first_failure is not None and (result.first_failure.rank, result.first_failure.exitcode) == ("0", "-6")
    assert "no known signature" not in result.render() and "(torchrun's root cause)" in result.render()
    assert reset.code == "PF727" and reset.details["echoes"][0].startswith("rank 0 on host localhost")
    # gloo's enforce before 306281a (2025) had no words of its own: the sizes alone
    old = one("  what():  [enforce fail at ../third_party/gloo/gloo/transport/tcp/pair.cc:446] op.preamble.length <= "
              "op.nbytes. 8773880 vs 2097152\n")
    assert (old.code, old.details["received_bytes"]) == ("PF723", ["8773880"])


# --- InfiniBand async events --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "port", "event"), [
    ("NET/IB : Got async event : port error", None, "port error"),  # 2.7 to 2.19: no device named
    ("NET/IB : mlx5_0:1 Got async event : local catastrophic error", "mlx5_0:1", "local catastrophic error"),
    ("NET/IB : mlx5_2:1 Got async error event: port error", "mlx5_2:1", "port error"),
    ("NET/IB : mlx5_1:1 async fatal event: local catastrophic error", "mlx5_1:1", "local catastrophic error"),
    ("NET/IB : mlx5_0:1 async fatal event on QP (0x55d0c8a3e2f0): local work queue catastrophic error", "mlx5_0:1",
     "local work queue catastrophic error"),
    ("NET/IB : mlx5_3:1 Got non-fatal async event: port error(10)", "mlx5_3:1", "port error"),
])
def test_an_infiniband_error_event_names_the_device_and_port(line: str, port: str | None, event: str) -> None:
    found = one(f"gpu7:3001:3090 [0] transport/net_ib.cc:101 NCCL WARN {line}\n")
    assert (found.code, found.tier, found.codes[:2]) == ("PF728", "cause", ("PF728", "PF831"))
    assert found.details.get("ib_port") == ([port] if port else None) and found.details["ib_event"] == [event]
    assert found.details["host"] == ["gpu7"]


@pytest.mark.parametrize("line", [
    "NET/IB : Got async event : port active",
    "NET/IB : mlx5_0:1 Got non-fatal async event: LID change(11)",
    "NET/IB : mlx5_0:1 Got async error event: SM change",
    "NET/IB : mlx5_0:1 async fatal event on SRQ, unused for now (0x55d0c8a3e2f0): SRQ catastrophic error",
])
def test_a_port_that_comes_up_or_a_fabric_change_is_no_failure(line: str) -> None:
    assert diagnose_text(f"gpu7:3001:3090 [0] transport/net_ib.cc:101 NCCL WARN {line}\n") == ()


def test_the_port_event_leads_the_completion_errors_and_timeouts_after_it() -> None:
    text = ("gpu7:3001:3090 [0] transport/net_ib.cc:101 NCCL WARN NET/IB : mlx5_0:1 Got async event : port error\n"
            "gpu7:3001:3095 [0] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer 10.1.0.8<45871> with "
            "error 12, opcode 0, len 0, vendor err 129\n"
            "[rank0]:[E1016 03:31:38.9 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=9141, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600071 milliseconds "
            "before timing out.\n")
    assert codes(diagnose_text(text)) == ["PF728", "PF719", "PF703"]


# --- NCCL topology and graph files ---------------------------------------------------------------------------------


def test_a_graph_file_for_another_machine_names_the_file_and_the_device() -> None:
    text = ("node1:2101:2101 [0] NCCL INFO NCCL_GRAPH_FILE set by environment to /shared/nccl-graph.xml\n"
            "node1:2101:2101 [0] graph/search.cc:851 NCCL WARN XML Import Channel : dev 4 not found.\n")
    found = one(text)
    assert (found.code, found.tier) == ("PF729", "cause")
    assert found.details["graph_file"] == ["/shared/nccl-graph.xml"] and found.details["device"] == ["4"]


@pytest.mark.parametrize("message", [
    "XML Topology has wrong version 1, 2 needed",
    "Could not open XML graph file /shared/nccl-graph.xml : No such file or directory",
    "XML Parse : Unexpected EOF",
    "XML Mismatch : gpu / pci",
])
def test_topology_and_graph_file_errors(message: str) -> None:
    assert one(f"node1:2101:2101 [0] graph/xml.cc:374 NCCL WARN {message}\n").code == "PF729"


def test_a_topology_file_nccl_skips_is_no_failure() -> None:
    # NCCL goes on without it and detects the topology (a WARN before 2.27, an INFO since).
    assert diagnose_text("node1:2101:2101 [0] graph/xml.cc:306 NCCL WARN Could not open XML topology file "
                         "/etc/nccl/topo.xml : No such file or directory\n") == ()


# --- a stall right after init ----------------------------------------------------------------------------------


def test_a_stall_right_after_init_points_at_the_hosts_topology() -> None:
    # pytorch/pytorch#54232: both ranks reach NCCL's Init COMPLETE, DDP is constructed, and nothing follows.
    (hang,) = diagnose_file(str(LOGS / "nccl-init-then-ddp-hang.log")).diagnoses
    assert hang.code == "PF713" and hang.codes[:4] == ("PF713", "PF102", "PF822", "PF823")
    assert "ACS and the IOMMU" in hang.before_job
    # A job that never finished joining is not there yet: the topology of a collective that never ran is not suspect.
    (joining,) = diagnose_file(str(LOGS / "hang-store-barrier.log")).diagnoses
    assert "PF822" not in joining.codes


# --- the command ----------------------------------------------------------------------------------------------------


def test_explain_prints_each_new_codes_remedy() -> None:
    for code, words in (("PF725", "expandable_segments:True"), ("PF726", "DUE TO TIME LIMIT"),
                        ("PF727", "first error on the other rank"), ("PF728", "local catastrophic error"),
                        ("PF729", "NCCL_GRAPH_FILE"), ("PF732", "create-dev-char-symlinks"),
                        ("PF733", "set_sharing_strategy('file_system')"), ("PF734", "TORCHINDUCTOR_CACHE_DIR"),
                        ("PF735", "--format torchrun"), ("PF736", "--node-rank"), ("PF737", "ping -M do"),
                        ("PF738", "--pids-limit"), ("PF739", "ip_local_port_range")):
        result = preflight("explain", code)
        assert result.returncode == 0 and words in result.stdout, code


def test_a_kernel_module_of_another_driver_version_is_named_from_each_sides_words() -> None:
    # Built from the sources' format strings (tests/data/messages: nvidia-driver-libraries.yaml, read from the driver's
    # 535.261.03 binaries, and nvidia-driver.yaml's osapi.c), not captured: nvidia-smi on a host whose driver was
    # upgraded without a reboot, then the kernel log of 580's module.
    smi = one("$ nvidia-smi\nFailed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.126\n")
    assert (smi.code, smi.tier, smi.first_line, smi.details) == ("PF731", "cause", 2, {"library_version": ["580.126"]})
    kernel = one("[ 8812.114] NVRM: API mismatch: the client 'nvidia-smi' (pid 4242)\n"
                 "[ 8812.114] NVRM: has the version 580.126.18, but this kernel module has\n"
                 "[ 8812.114] NVRM: the version 580.119.02.  Please make sure that this\n"
                 "[ 8812.114] NVRM: kernel module and all NVIDIA driver components\n")
    assert (kernel.code, kernel.details) == ("PF731", {"library_version": ["580.126.18"], "module_version": ["580.119.02"]})
    # torch finding no GPU through CUDA's cudaErrorSystemDriverMismatch (c10/cuda/CUDAFunctions.cpp's error, as
    # torch/cuda/__init__.py warns it)
    cuda = one("UserWarning: CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you run some cuda "
               "functions before calling NumCudaDevices() that might have already set an error? Error 803: system has "
               "unsupported display driver / cuda driver combination\n")
    assert cuda.code == "PF731"


def test_a_container_that_lost_its_gpus_is_read_from_nvidia_smis_line_alone() -> None:
    # nvidia-smi's "Failed to initialize NVML: %s" (the driver's binary, nvidia-driver-libraries.yaml) with 999's text, as
    # NVIDIA's notice NVIDIA/nvidia-docker#1730 prints it (tests/data/logs/nvml-container-lost-gpus.log); built, not captured.
    found = one("$ nvidia-smi\nFailed to initialize NVML: Unknown Error\n")
    assert (found.code, found.codes, found.tier) == ("PF732", ("PF732", "PF100"), "cause")
    assert "PF100" in found.before_job and "container" in found.before_job
    # NVML's Unknown Error from another call, or the words alone, name no cause: a call on a GPU in a bad state says it too.
    for text in ("pynvml.nvml.NVMLError_Unknown: Unknown Error\n", "nvmlDeviceGetPowerUsage failed: Unknown Error\n",
                 "Failed to initialize NVML: Driver Not Loaded\n"):
        assert all(d.code != "PF732" for d in diagnose_text(text)), text


def test_the_open_file_limit_is_read_from_emfiles_words_and_not_from_the_kernels_table() -> None:
    # Built from the sources' formats (tests/data/messages: cpython.yaml, torch.yaml, gloo.yaml), not captured; the real
    # DataLoader run is tests/data/logs/dataloader-open-file-limit.log.
    for line in ("RuntimeError: Too many open files. Communication with the workers is no longer possible. Please "
                 "increase the limit using `ulimit -n` in the shell",
                 "  File \"/usr/lib/python3.11/multiprocessing/reduction.py\", line 164, in recvfds\n"
                 "RuntimeError: received 0 items of ancdata",
                 "[../third_party/gloo/gloo/transport/tcp/listener.cc:63] false. accept: Too many open files"):
        found = one(line + "\n")
        assert (found.code, found.tier) == ("PF733", "cause"), line
    # ENFILE is the kernel's whole file table (fs.file-max), another limit: not this cause.
    assert diagnose_text("OSError: [Errno 23] Too many open files in system: '/data/shard-0007'\n") == ()


def test_a_full_filesystem_is_read_from_enospc_and_edquot_and_not_from_dev_shm_or_another_errno() -> None:
    # Built from the sources' formats (tests/data/messages: cpython.yaml's OSError text, torch.yaml's zip writer), not
    # captured; the real torch.save to a full folder is tests/data/logs/checkpoint-filesystem-full.log.
    for line, seen in (
            ("OSError: [Errno 28] No space left on device: '/tmp/torchinductor_trainer/fxgraph/ab/fabc123'",
             {"errno": "28", "path": "/tmp/torchinductor_trainer/fxgraph/ab/fabc123"}),
            ("OSError: [Errno 28] No space left on device", {"errno": "28"}),
            ("OSError: [Errno 122] Disk quota exceeded: '/home/trainer/.cache/huggingface/datasets/shard-0007.arrow'",
             {"errno": "122", "path": "/home/trainer/.cache/huggingface/datasets/shard-0007.arrow"}),
            ("RuntimeError: PytorchStreamWriter failed writing file data/0: file write failed", {"record": "data/0"}),
            ("RuntimeError: PytorchStreamWriter failed writing file data.pkl.", {"record": "data.pkl"})):
        found = one(line + "\n")
        assert (found.code, found.tier) == ("PF734", "cause"), line
        assert found.details == {k: [v] for k, v in seen.items()}, (line, found.details)
    # A file under /dev/shm is /dev/shm's size (PF203), another errno another cause, and a reader's failure no write at all.
    for line in ("OSError: [Errno 5] Input/output error: '/ckpt/step-1000.pt'",
                 "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory"):
        assert diagnose_text(line + "\n") == (), line
    found = one("OSError: [Errno 28] No space left on device: '/dev/shm/torch_1234_567_0'\n")
    assert (found.code, found.signatures, found.details) == ("PF203", ("dev-shm-full",), {"file": ["/dev/shm/torch_1234_567_0"]})


def test_a_semaphores_enospc_is_dev_shm_and_only_under_multiprocessings_frame() -> None:
    # Built from CPython's own traceback (tests/data/messages/cpython.yaml: 3.6 to 3.13 print this frame, the source line
    # under it differs); the real run is tests/data/logs/dev-shm-semaphore.log.
    enospc = "OSError: [Errno 28] No space left on device\n"
    for frame in ('  File "/usr/lib/python3.10/multiprocessing/synchronize.py", line 57, in __init__\n'
                  "    sl = self._semlock = _multiprocessing.SemLock(\n",
                  '  File "/opt/conda/lib/python3.6/multiprocessing/synchronize.py", line 59, in __init__\n    unlink_now)\n'):
        found = one(f'Traceback (most recent call last):\n  File "train.py", line 30, in <module>\n{frame}{enospc}')
        assert (found.code, found.signatures, found.tier) == ("PF203", ("dev-shm-semaphore",), "cause"), frame
    # Without it the same ENOSPC is any write's (a checkpoint's): the filesystem, not /dev/shm.
    found = one('Traceback (most recent call last):\n  File "train.py", line 30, in <module>\n'
                "    torch.save(state, path)\n" + enospc)
    assert (found.code, found.signatures) == ("PF734", ("filesystem-full",))


def test_a_rank_without_its_launchers_environment_is_read_from_torchs_rendezvous_and_os_environs_keyerror() -> None:
    # Built from the sources (tests/data/messages: torch.yaml's rendezvous errors, cpython.yaml's KeyError and frame
    # line), not captured; the real runs are tests/data/logs/launch-without-torchrun.log and launch-local-rank-unset.log.
    rendezvous = "ValueError: Error initializing torch.distributed using "
    for line, seen in ((rendezvous + "env:// rendezvous: environment variable MASTER_PORT expected, but not set",
                        {"variable": "MASTER_PORT"}),
                       (rendezvous + "tcp:// rendezvous: world size parameter missing",
                        {"init_method": "tcp", "missing": "world size parameter"}),
                       (rendezvous + "file:// rendezvous: path missing", {"init_method": "file", "missing": "path"})):
        found = one(line + "\n")
        assert (found.code, found.tier, found.details) == ("PF735", "cause", {k: [v] for k, v in seen.items()}), line
    frame = '  File "/usr/lib/python3.8/os.py", line 675, in __getitem__\n    raise KeyError(key) from None\n'
    found = one(f'Traceback (most recent call last):\n  File "train.py", line 4, in <module>\n{frame}KeyError: \'WORLD_SIZE\'\n')
    assert found.code == "PF735" and found.details["variable"] == ["WORLD_SIZE"]
    # Without os.environ's frame the same KeyError is a dict of the job's; a name torchrun does not set is no launcher's.
    for text in ('Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n    cfg["RANK"]\n'
                 "KeyError: 'RANK'\n",
                 f"{frame}KeyError: 'SLURM_PROCID'\n",
                 f"{frame}KeyError: 'RANK_OFFSET'\n"):
        assert all(d.code != "PF735" for d in diagnose_text(text)), text


def test_the_container_toolkits_refusal_names_the_hosts_driver_from_its_own_words() -> None:
    # Built from the source (tests/data/messages/libnvidia-container.yaml), not captured: no driver or toolkit here. The
    # runtime quotes the hook's stderr inside its own error, a literal \\n before it.
    wrapper = ("docker: Error response from daemon: failed to create task for container: failed to create shim task: OCI "
               "runtime create failed: runc create failed: unable to start container process: error during container "
               "init: error running hook #0: error running hook: exit status 1, stdout: , stderr: Auto-detected mode as "
               "'legacy'\\n")
    for hook, codes, seen in (
            ("requirement error: unsatisfied condition: cuda>=12.4, please update your driver to a newer version, or use "
             "an earlier cuda container", ("PF715", "PF106"), {"image_cuda": "12.4"}),
            ("initialization error: nvml error: driver not loaded", ("PF100",), {"nvml_error": "driver not loaded"}),
            ("initialization error: nvml error: driver/library version mismatch", ("PF731", "PF100"),
             {"nvml_error": "driver/library version mismatch"}),
            ("initialization error: load library failed: libnvidia-ml.so.1: cannot open shared object file: no such file "
             "or directory", ("PF100",), {"library": "libnvidia-ml.so.1"})):
        found = one(f"{wrapper}nvidia-container-cli: {hook}: unknown.\n")
        assert (found.codes, found.tier, found.details) == (codes, "cause", {k: [v] for k, v in seen.items()}), hook
    # What the image asked for that no host fault explains, and an NVML refusal of the caller's rights, are not read.
    for hook in ("requirement error: unsatisfied condition: arch>=9.0", "initialization error: nvml error: insufficient permissions"):
        assert diagnose_text(f"{wrapper}nvidia-container-cli: {hook}: unknown.\n") == (), hook


def test_ranks_that_disagree_on_the_launch_are_read_from_nccls_bootstrap_root() -> None:
    # Built from the source's formats behind NCCL's WARN prefix (tests/data/messages/nccl.yaml, src/bootstrap.cc), not
    # captured; the other ranks' timeout that follows is a consequence.
    warn = "node-1:4242:4301 [0] bootstrap.cc:158 NCCL WARN Bootstrap Root : "
    timeout = ("[rank3]:[E1127 03:44:00.000000 7 ProcessGroupNCCL.cpp:1] Watchdog caught collective operation timeout: "
               "WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600001 milliseconds\n")
    for line, seen in (("rank 0 of 16 ranks has already checked in", {"duplicate_rank": "0", "nranks": "16"}),
                       ("mismatch in rank count from procs 16 : 8", {"nranks": "16", "nranks_other": "8"}),
                       ("mismatch in info from procs, nranks 16 vs 8, nroots 1 vs 1, iroot 0 vs 0, offset 0 vs 0",
                        {"nranks": "16", "nranks_other": "8"})):
        first, *rest = diagnose_text(f"{warn}{line}\n{timeout}")
        assert (first.code, first.tier) == ("PF736", "cause") and [d.code for d in rest] == ["PF703"], line
        assert {k: v for k, v in first.details.items() if k in seen} == {k: [v] for k, v in seen.items()}, first.details
    # Another of the root's checks (a rank out of its range) names no launch of its own: not read.
    assert all(d.code != "PF736" for d in diagnose_text(f"{warn}localId 9 is out of range\n"))


def test_the_locked_memory_limit_is_read_from_nccls_enomem_and_no_other_error() -> None:
    # Built from ibvwrap.cc's format (with errno from 2.13.4) behind NCCL's WARN prefix, not captured; the exception's
    # Last error repeats it.
    prefix = "node1:3162:3270 [0] misc/ibvwrap.cc:278 NCCL WARN "
    found = one(f"{prefix}Call to ibv_reg_mr_iova2 failed with error Cannot allocate memory\n"
                "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.\n"
                "Last error:\nCall to ibv_reg_mr_iova2 failed with error Cannot allocate memory\n")
    assert (found.code, found.tier, found.first_line, found.details["call"]) == ("PF202", "cause", 1, ["ibv_reg_mr_iova2"])
    assert one(f"{prefix}Call to ibv_create_cq failed with error Cannot allocate memory\n").code == "PF202"
    # A GPU buffer that GPUDirect RDMA could not register, and the errno-less wording before 2.13: not the limit.
    assert diagnose_text(f"{prefix}Call to ibv_reg_mr failed with error Bad address\n") == ()
    assert diagnose_text(f"{prefix}Call to ibv_reg_mr failed\n") == ()


def test_nccls_nvml_library_missing_is_the_driver_only_where_the_init_then_fails() -> None:
    # Built from nvmlwrap.cc's WARN (2.12 to 2.29) and linux.cc's (2.30, with dlerror) behind NCCL's prefix, then
    # torch's exception for the ncclSystemError that commAlloc returns: not captured.
    warn = "node1:2101:2101 [0] misc/nvmlwrap.cc:67 NCCL WARN Failed to open libnvidia-ml.so.1\n"
    torch_error = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, "
                   "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n"
                   "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. \n")
    found = one(warn + "node1:2101:2101 [0] NCCL INFO init.cc:415 -> 2\n" + torch_error)
    assert (found.code, found.tier, found.first_line) == ("PF100", "cause", 1)
    assert found.details == {"host": ["node1"], "nccl_error": ["system error"]}
    dlerror = ("node1:2101:2101 [0] os/linux.cc:615 NCCL WARN Failed to open libnvidia-ml.so.1: libnvidia-ml.so.1: cannot "
               "open shared object file: No such file or directory\n")
    assert one(dlerror + torch_error).code == "PF100"
    # 2.7 to 2.11 went on without NVML (no NVLink detection): the warning alone, in a run that trained, is no cause.
    went_on = ("node1:2101:2101 [0] NCCL INFO comm 0x55d0 rank 0 nranks 2 - Init COMPLETE\nepoch 0 step 10 loss 2.31\n"
               "epoch 0 step 20 loss 2.02\nINFO:torch.distributed.elastic.agent.server.api:[default] worker group successfully "
               "finished. Waiting 300 seconds for other agents to finish.\n")
    assert diagnose_text(warn.replace("nvmlwrap.cc:67", "nvmlwrap.cc:50") + went_on) == ()


def test_no_driver_and_a_driver_too_old_in_torchs_and_nvidia_smis_words() -> None:
    # c10/cuda/CUDAFunctions.cpp's messages (libc10_cuda.so of the 1.13.1 to 2.12.0 wheels) and nvidia-smi's (535.261.03),
    # as the catalogue records them: built from the strings, not captured.
    assert one("RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
               "installed a driver from http://www.nvidia.com/Download/index.aspx\n").code == "PF100"
    assert one("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
               "NVIDIA driver is installed and running.\n").code == "PF100"
    old = one("UserWarning: CUDA initialization: The NVIDIA driver on your system is too old (found version 11040). "
              "Please update your GPU driver by downloading and installing a new version from the URL: "
              "http://www.nvidia.com/Download/index.aspx\n")
    assert (old.code, old.details) == ("PF715", {"driver_cuda": ["11040"]})
    assert one("RuntimeError: No CUDA GPUs are available\n").code == "PF201"


def test_ptx_from_a_newer_toolkit_than_the_driver_is_the_driver_too_old() -> None:
    # cudaErrorUnsupportedPtxVersion's string (libcudart 11.8 to 13.0, as the catalogue records it), which driver_types.h
    # documents as PTX from a compiler newer than the driver supports: built from the string, not captured. torch's
    # "CUDA error: ", Triton's driver-API error and NCCL's Cuda failure all name the driver too old.
    ptx = "the provided PTX was compiled with an unsupported toolchain."
    assert one(f"RuntimeError: CUDA error: {ptx}\n").codes == ("PF715", "PF106")
    assert one(f"RuntimeError: Triton Error [CUDA]: {ptx}\n").code == "PF715"
    nccl = one(f"{NCCL_WARN}Cuda failure 222 '{ptx}'\n")
    assert nccl.codes == ("PF715", "PF106") and "nccl-unhandled-cuda-error" in nccl.signatures
    # A PTX JIT that failed for another reason (the compiler library missing, JIT disabled) is not read as the driver.
    assert diagnose_text("RuntimeError: CUDA error: a PTX JIT compilation failed\n") == ()


# --- a hostname that resolves to no address of its host --------------------------------------------------------------

GLOO_FALLBACK = ("[rank9]:[W ProcessGroupGloo.cpp:721] Warning: Unable to resolve hostname to a (local) address. Using the "
                 "loopback address as fallback. Manually set the network interface to bind to with GLOO_SOCKET_IFNAME. "
                 "(function operator())\n")


def test_torchs_gloo_fallback_to_loopback_is_the_hostname_only_beside_a_gloo_failure() -> None:
    # The real run (tests/data/logs/gloo-hostname-foreign-*.log) is read in test_diagnose.py; here the warning as the
    # catalogue records it (torch 1.13.1 to 2.13.0), with and without the connect failure it leads to.
    failed, consequence = diagnose_text(GLOO_FALLBACK + "[rank8]:[E ProcessGroupGloo.cpp:144] Gloo connectFullMesh failed "
                                        "with [../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error\n")
    # torch's warning says the same when no ephemeral port was left for its test bind (make_logs.py ports-exhausted): PF739
    assert (failed.code, failed.codes, failed.first_line) == ("PF309", ("PF309", "PF302", "PF739"), 1)
    assert (consequence.code, consequence.tier) == ("PF711", "consequence")
    # Alone, on one host or where no peer needed it, the warning is no failure: healthy single-host runs print it.
    assert diagnose_text(GLOO_FALLBACK + "all_reduce [1.0, 1.0, 1.0, 1.0]\n") == ()


def test_glooss_own_bind_failure_for_the_hostname_is_the_name_not_local() -> None:
    # gloo/transport/tcp/device.cc's GLOO_ENFORCE, as the catalogue records it: EADDRNOTAVAIL, the address not this host's.
    line = ("RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:125] bind_rv == 0. Unable to find "
            "address for node-7; bind(2) for [10.0.0.7]:0 failed with: Cannot assign requested address\n")
    found = one(line)
    assert found.code == "PF309" and found.details["hostname"] == ["node-7"] and found.details["address"] == ["[10.0.0.7]:0"]


def test_a_process_group_nccl_without_gpus_is_the_gpu_count() -> None:
    # ProcessGroupNCCL's constructor (libtorch_cuda of torch 1.13.1 to 2.13.0), as the catalogue records it.
    assert one("torch.distributed.DistBackendError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!\n").codes == (
        "PF201", "PF100", "PF207")
    # A torch without NCCL is a CPU build or a Windows or macOS build: two causes, unread.
    assert diagnose_text("RuntimeError: Distributed package doesn't have NCCL built in\n") == ()


def test_torch_2_15s_default_nccl_backend_is_read_from_its_own_words() -> None:
    # torch 2.15.0 makes nccl2 the "nccl" backend (2.14.1: TORCH_DIST_USE_NCCL2=1): its timeout and its NCCL errors are
    # worded by its own sources (tests/data/messages/torch.yaml's nccl2-*), which ProcessGroupNCCL's patterns never
    # read. Built from those formats behind c10's log prefix, not captured: no GPU here.
    log = "[E1129 01:02:03.000000 4242 torch/csrc/distributed/c10d/nccl2/{}] [TC][rank=1][name=0] {}\n"
    timeout = one(log.format("WorkNCCL.cpp:192", "Operation timed out after 600012 ms")
                  + log.format("ProcessGroupNCCL.cpp:480", "Aborting process on rank 1 due to timeout - timeout watchdog "
                               "detected operation timeout")
                  + "torch.distributed.DistBackendError: Watchdog caught collective operation timeout: NCCL operation "
                  "timed out\n")
    assert (timeout.code, timeout.tier, timeout.ranks, timeout.details["ran_ms"]) == ("PF703", "consequence", (1,), ["600012"])
    # 2.14.1's exception alone, without the watchdog's prefix
    assert one("torch.distributed.DistBackendError: NCCL operation timed out\n").code == "PF703"
    # 2.15's init on a host where the process sees no GPU (distributed_c10d.py's own count, before any NCCL call)
    assert one("RuntimeError: nccl2 requires at least one CUDA device\n").code == "PF201"
    # An init that failed on a full GPU: NCCL's WARN first, then the bootstrap's exception and NCCLException's last error.
    oom = one(f"{NCCL_WARN}Cuda failure 2 'out of memory'\n"
              "RuntimeError: Failed to initialize NCCL communicator: unhandled cuda error (run with NCCL_DEBUG=INFO for "
              "details)\n")
    assert (oom.code, oom.codes[:2], oom.details["cuda_error"]) == ("PF701", ("PF701", "PF725"), ["out of memory"])
    failed = one("NCCL AllReduce failed: unhandled cuda error (run with NCCL_DEBUG=INFO for details) \n"
                 "NCCL Last Error: Cuda failure 700 'an illegal memory access was encountered'\n")
    assert (failed.code, failed.details["cuda_error"]) == ("PF722", ["an illegal memory access was encountered"])
    # Its log prefix names the rank for every line, here a peer that went away (a consequence: PF727).
    remote = one(log.format("ProcessGroupNCCL.cpp:510", "nccl hit async error on rank 1: remote process exited or there "
                            "was a network error"))
    assert (remote.code, remote.ranks) == ("PF727", (1,))
    # A work that ended in an error names no cause by itself; the error's own line does.
    assert diagnose_text(log.format("ProcessGroupNCCL.cpp:480", "Aborting process on rank 1 due to error - timeout "
                                    "watchdog detected operation error")) == ()


def test_cuda_13_4s_fabric_not_ready_is_the_gpus_nvlink_fabric_registration() -> None:
    # cudaErrorFabricNotReady (919), new in libcudart 13.4.92 (tests/data/messages/cuda-runtime.yaml): its string as
    # torch's CUDA check and its device count put it, and after NCCL's Cuda failure. Built, not captured.
    text = "GPU fabric is not ready within the probe wait budget; application may retry (see CUDA_FABRIC_INIT_TIMEOUT_MS)"
    for line in (f"RuntimeError: CUDA error: {text}",
                 "UserWarning: CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you run some cuda "
                 f"functions before calling NumCudaDevices() that might have already set an error? Error 919: {text}"):
        found = one(line + "\n")
        assert (found.code, found.tier, found.codes) == ("PF811", "cause", ("PF811", "PF812")), line
    assert "PF811" in codes(diagnose_text(f"{NCCL_WARN}Cuda failure 919 '{text}'\n"))


def test_open_mpi_5s_launcher_reports_a_killed_rank_over_two_lines() -> None:
    # PRRTE 3.0.7 to 4.1.0 (tests/data/messages/prrte.yaml) wraps help-prun.txt's report after "exited on": the second
    # line names the signal, the first the rank and node. Built from the help text inside show_help's rules, not
    # captured.
    rule = "-" * 74
    for signal, code in (("9 (Killed)", ["PF721"]), ("11 (Segmentation fault)", [])):
        found = diagnose_text(f"{rule}\nprterun noticed that process rank 3 with PID 12741 on node node-2 exited on\n"
                              f"signal {signal}.\n{rule}\n")
        assert codes(found) == code, signal
        if found:
            assert (found[0].ranks, found[0].details["node"], found[0].first_line) == ((3,), ["node-2"], 3)


def test_mpichs_report_of_a_killed_rank_and_not_of_a_crash_whose_cleanup_killed_the_others() -> None:
    # Real runs of Debian's MPICH 4.0.2 (make_logs.py mpich-signal): rank 1 of 2 ended by SIGKILL, then by SIGSEGV.
    # hydra SIGKILLs the other rank and may report that one in its block: the segfault's run printed "EXIT CODE: 9"
    # too, and only mpiexec's exit string ("Segmentation fault (signal 11)") tells the two apart.
    killed = diagnose_file(str(LOGS / "mpich-rank-killed.log")).diagnoses
    assert [(d.code, d.signatures) for d in killed] == [("PF721", ("mpich-rank-killed",))]
    crashed = diagnose_file(str(LOGS / "mpich-rank-segfault.log"))
    assert "EXIT CODE: 9" in (LOGS / "mpich-rank-segfault.log").read_text() and crashed.diagnoses == ()
    # The block alone, as a paste often has it (the corpus's MPLBM-UT#92), still reads as the SIGKILL it reports.
    rule = "=" * 83
    block = (f"{rule}\n=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n=   PID 12741 RUNNING AT node-2\n"
             "=   EXIT CODE: {}\n=   CLEANING UP REMAINING PROCESSES\n=   YOU CAN IGNORE THE BELOW CLEANUP MESSAGES\n"
             f"{rule}\n")
    assert one(block.format(9)).code == "PF721"
    assert diagnose_text(block.format(11)) == ()  # a crash of the program: not the host


def test_open_mpis_report_names_the_rank_a_signal_ended() -> None:
    # Real runs of Debian's Open MPI 4.1.4 (make_logs.py openmpi-signal): 3 ranks, rank 1 ended by SIGKILL, then by
    # SIGSEGV. Unlike MPICH's block, mpirun's report named the rank that failed in every run here.
    (killed,) = diagnose_file(str(LOGS / "openmpi-rank-killed.log")).diagnoses
    assert (killed.code, killed.ranks, killed.details["node"]) == ("PF721", (1,), ["vm"])
    assert diagnose_file(str(LOGS / "openmpi-rank-segfault.log")).diagnoses == ()


def test_a_rank_that_reached_init_process_group_late_leaves_the_others_waiting_in_the_store() -> None:
    # make_logs.py late-rank: rank 1 sleeps 60 s before init_process_group; rank 0's gloo group waits 15 s for rank 1's
    # address in the store: "DistStoreError: wait timeout after 15000ms, keys: /default_pg/0//cpu//0/1".
    (waited,) = diagnose_file(str(LOGS / "init-late-rank.log")).diagnoses
    assert (waited.code, waited.tier) == ("PF712", "consequence")
    assert waited.details["waited_ms"] == ["15000"] and waited.details["key"] == ["/default_pg/0//cpu//0/1"]


def test_torch_multiprocessing_spawns_report_of_a_process_killed_from_outside() -> None:
    # make_logs.py spawn-signal: mp.spawn of 2 gloo ranks, rank 1 ended by SIGKILL, then by SIGSEGV. spawn names the first
    # process it found failed, before it stops the others, so its SIGKILL is not spawn's own.
    (killed,) = diagnose_file(str(LOGS / "spawn-rank-killed.log")).diagnoses
    assert (killed.code, killed.signatures, killed.details["process_index"]) == ("PF721", ("host-oom-kill",), ["1"])
    assert diagnose_file(str(LOGS / "spawn-rank-segfault.log")).diagnoses == ()


def test_a_worker_torchrun_itself_killed_with_sigkill_is_no_host_oom_kill() -> None:
    # make_logs.py forced-kill (torch 2.13 under torchrun, 2 ranks): rank 1 ends by SIGSEGV; rank 0 traps the agent's SIGTERM,
    # so the agent kills it with SIGKILL ("Unable to shutdown process ... forcefully exiting via 9") and its report
    # lists rank 0 as "exitcode  : -9 ... (SIGKILL)" beside the root cause's -11. That -9 names no cause.
    text = (LOGS / "torchrun-forced-kill.log").read_text()
    assert "exitcode  : -9" in text and "forcefully exiting via 9" in text
    assert diagnose_file(str(LOGS / "torchrun-forced-kill.log")).diagnoses == ()
    # Without the agent's line, the same report's -9 is a SIGKILL from outside the job (the OOM killer, most often).
    killed = one("\n".join(line for line in text.splitlines() if "forcefully exiting" not in line) + "\n")
    assert (killed.code, killed.signatures) == ("PF721", ("torchrun-rank-killed",))


def test_a_rank_the_kernels_oom_killer_ended_in_a_memory_cgroup_is_a_host_oom_kill() -> None:
    # make_logs.py cgroup-oom: torchrun of 2 ranks in a 1.5 GiB cgroup v1 memory group; rank 1's memory grows each step
    # until the kernel kills it. torchrun's report alone says PF721 by its -9; beside the kernel's report (dmesg -T),
    # the kill is the kernel's: the memory group's constraint, and the first failure is the kernel's line.
    folder = LOGS / "torchrun-cgroup-oom"
    torchrun = diagnose_file(str(folder / "torchrun.log"))
    (alone,) = torchrun.diagnoses
    assert (alone.code, alone.signatures, alone.details["local_rank"]) == ("PF721", ("torchrun-rank-killed",), ["1"])
    # The agent's lines name the process ("failed (exitcode: -9) local_rank: 1 (pid: N)"); its root cause report names
    # the same pid's rank, so the first failure is rank 1, at the agent's line.
    first = torchrun.first_failure
    assert first is not None and (first.code, first.rank, first.host, first.line) == ("PF721", "1", "localhost", alone.first_line)
    result = diagnose_path(str(folder))
    (killed,) = result.diagnoses
    assert killed.code == "PF721" and killed.details["oom_constraint"] == ["CONSTRAINT_MEMCG"]
    assert killed.details["pid"] == [alone.details["pid"][0]]  # the process the kernel killed is torchrun's rank 1
    assert result.first_failure is not None and (result.first_failure.file, result.first_failure.line) == ("kern.log", 1)


def test_a_step_srun_ended_itself_after_a_task_failed_was_not_ended_from_outside() -> None:
    # Captured on this machine's one-node Slurm (Debian's 22.05, tests/test_slurm.py's cluster): srun -n 2
    # --kill-on-bad-exit=1, task 1 ending itself by SIGSEGV, then by SIGKILL. srun says "Terminating StepId=..." and
    # slurmstepd then prints a plain "*** STEP ... CANCELLED AT ... ***": the job's own doing, not a scancel or a limit.
    assert diagnose_file(str(LOGS / "srun-kill-on-bad-exit-segfault.log")).diagnoses == ()
    assert codes(diagnose_file(str(LOGS / "srun-kill-on-bad-exit-killed.log")).diagnoses) == ["PF721"]
    # The same CANCELLED line without srun's own termination still reads as from outside.
    assert one("slurmstepd-vm: error: *** STEP 2.0 ON vm CANCELLED AT 2026-11-29T01:56:00 ***\n").code == "PF726"
