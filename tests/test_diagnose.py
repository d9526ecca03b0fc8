"""`preflight diagnose`: the signature table, each real log excerpt in tests/data/logs, root cause first, and the CLI."""

from __future__ import annotations

import gzip
import json
import pickle
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import preflight
from logs_corpus import CORPUS, corpus_index
from messages_catalogue import all_printed_lines

from preflight.catalogue import load_catalogue
from preflight.checks.xid import XID_CATALOGUE
from preflight.diagnose import (
    EXCERPT_CHARS,
    Diagnosis,
    Scanner,
    diagnose_file,
    diagnose_text,
    load_signatures,
    parse_signatures,
    read_blocks,
    signature_codes,
)
from preflight.diagnose import reading as diagnose_reading
from preflight.errors import EnvironmentProblem, InputError

LOGS = Path(__file__).resolve().parent / "data" / "logs"
# Signature lines with no log excerpt here, each as its library prints it.
SAMPLE_LINES = {
    # NCCL's message when NCCL_SOCKET_IFNAME matches no interface (quoted in marin-community/marin#6940).
    "socket-interface-missing": "node1:2101:2101 [0] NCCL WARN Bootstrap : no socket interface found",
    # torch's DataLoader when a worker dies of SIGBUS on a full /dev/shm.
    "dev-shm-full": "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).",
    # Older torch, the spelling of the failure as torch 1.x printed it.
    "nccl-unhandled-cuda-error": "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:911, unhandled cuda error, "
                                 "NCCL version 2.7.8",
    # TORCH_NCCL_BLOCKING_WAIT=1 reports the timeout from the waiting call instead of the watchdog (huggingface/diffusers#12422).
    "collective-timeout": "[rank1]:[E1002 18:16:40.662691402 ProcessGroupNCCL.cpp:756] [Rank 1] Work WorkNCCL(SeqNum=2521, "
                          "OpType=ALLREDUCE, NumelIn=160672064, NumelOut=160672064, Timeout(ms)=600000) timed out in blocking wait.",
    # Python's own error for a port that another process holds.
    "port-in-use": "OSError: [Errno 98] Address already in use",
}


def read_log(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


def diagnosed(name: str) -> tuple[Diagnosis, ...]:
    return diagnose_text(read_log(name))


def codes_of(diagnoses: tuple[Diagnosis, ...]) -> list[str]:
    return [d.code for d in diagnoses]


# --- the table ------------------------------------------------------------------------------------


def test_every_signature_code_has_a_catalogue_entry() -> None:
    catalogue = load_catalogue()
    assert signature_codes() <= set(catalogue), sorted(signature_codes() - set(catalogue))
    for signature in load_signatures().signatures:
        assert signature.codes[0] in catalogue


def test_every_pattern_matches_a_real_line_and_starts_with_literal_text() -> None:
    table = load_signatures()
    # The shipped logs, the corpus's train split (the held-out split is only measured: test_diagnose_corpus.py) and the
    # lines the sources print (tests/data/messages, each wording of each version).
    paths = [*sorted(LOGS.glob("*.log")), *(CORPUS / e["file"] for e in corpus_index() if e["split"] == "train")]
    lines = [line for path in paths for line in path.read_text(encoding="utf-8").splitlines()]
    lines += [*SAMPLE_LINES.values(), *all_printed_lines()]
    assert len({s.id for s in table.signatures}) == len(table.signatures), "signature ids repeat"
    for signature in table.signatures:
        for pattern in (*signature.patterns, *signature.details, *signature.after):
            assert any(pattern.search(line) for line in lines), f"{signature.id}: {pattern.pattern!r} matches no log line here"
            # A literal first character keeps the combined scan fast (see signatures.yaml).
            starts_literal = re.match(r"(?:[\w \-:'\"]|\\[\[\].(])", pattern.pattern)
            assert starts_literal, f"{signature.id}: {pattern.pattern!r} starts with a metacharacter"


def test_a_broken_table_is_an_environment_problem_naming_the_signature() -> None:
    good = {"id": "x", "tier": "cause", "codes": ["PF701"], "patterns": ["abc"], "check": "none: a test"}
    parse_signatures({"signatures": [good]})
    for broken, words in [
        ({**good, "patterns": ["abc("]}, "bad pattern"),
        ({**good, "tier": "root"}, "tier must be one of"),
        ({**good, "codes": ["701"]}, "PFnnn"),
        ({**good, "patterns": []}, "at least one pattern"),
        ({key: value for key, value in good.items() if key != "check"}, "needs a `check`"),
        ({**good, "unless": ["abc("]}, "bad pattern"),
        ({**good, "requires": "infiniband"}, "requires: expected a list of strings"),
    ]:
        with pytest.raises(EnvironmentProblem, match=words):
            parse_signatures({"signatures": [broken]})


# --- each log: its codes first, with what it captured -------------------------------------------------


@pytest.mark.parametrize(("name", "codes"), [
    ("ddp-unused-parameters.log", ["PF705"]),
    ("ddp-inplace.log", ["PF706"]),
    ("port-in-use.log", ["PF707"]),
    ("sampler-with-shuffle.log", ["PF708"]),
    ("gloo-collective-timeout.log", ["PF703"]),
    ("gloo-size-mismatch.log", ["PF723", "PF727"]),  # gloo's own enforce on the rank with the smaller buffer, then the reset
    ("gloo-mtu-blackhole-cluster.log", ["PF737", "PF703"]),  # one rank's connection timed out; the other waited out its recv
    ("gloo-link-down-cluster.log", ["PF737"]),  # h2's link down mid-job: h1's connection timed out, h2's had no route
    ("gloo-rail-astray-h2.log", ["PF711"]),  # GLOO_SOCKET_IFNAME a rail on another subnet: no route to its peer's address
    ("gloo-rail-astray-h1.log", ["PF711"]),  # its peer, waiting: only "Connect timeout"
    ("torchrun-task-limit.log", ["PF738", "PF727"]),  # DataLoader workers in a pids cgroup of 30: no thread could start
    ("torchrun-fork-limit.log", ["PF738"]),  # 8 DataLoader workers per rank in a pids cgroup of 14: no worker could fork
    ("gloo-interface-missing.log", ["PF303"]),
    ("rendezvous-timeout.log", ["PF712"]),
    ("rendezvous-timeout-c10d.log", ["PF712"]),
    ("rendezvous-refused.log", ["PF717"]),  # node 1 alone: the store's port refuses every connect
    ("rendezvous-refused-c10d.log", ["PF717"]),
    ("rendezvous-dropped.log", ["PF717"]),  # the endpoint drops every packet: each connect times out, retried to 10 s
    ("rendezvous-dropped-c10d.log", ["PF717"]),
    ("rendezvous-dropped-torch1.12.1.log", ["PF717"]),  # 1.12.1 ended each address on ETIMEDOUT, then raised
    ("init-late-rank.log", ["PF712"]),  # rank 1 reached init_process_group 60 s late: rank 0's store wait timed out
    ("init-late-rank-torch2.1.2.log", ["PF712"]),  # the same before 2.5: "Socket Timeout" from init_process_group
    ("dev-shm-full.log", ["PF203"]),
    ("dev-shm-full-torch2.10.0.log", ["PF203"]),  # 2.10 and 2.11 print errno, not the error: any text is read
    ("dev-shm-full-torch2.11.0.log", ["PF203"]),
    ("dev-shm-bus-error.log", ["PF203"]),  # the worker's SIGBUS line ends in a NUL byte, as torch writes it
    ("dev-shm-semaphore.log", ["PF203"]),  # a full /dev/shm's ENOSPC from SemLock: not the disk's (PF734) as before
    ("gloo-loopback-h1.log", ["PF301"]),
    ("gloo-loopback-h2.log", ["PF711"]),
    ("gloo-loopback-cluster.log", ["PF301", "PF711"]),
    # torch 1.12.1, whose gloo reported the connect's SO_ERROR as "connect [127.0.0.1]:PORT: Connection refused"
    ("gloo-loopback-torch1.12.1-h1.log", ["PF301"]),
    ("gloo-loopback-torch1.12.1-cluster.log", ["PF301", "PF711"]),
    # torch.distributed.launch before torchrun (1.8.1): a rank SIGKILLed, then the launcher's own SIGTERM
    ("launch-rank-killed-torch1.8.1.log", ["PF721"]),
    ("launch-sigterm-torch1.8.1.log", ["PF726"]),
    # c10d's monitored barrier: rank 0 names the rank 2 of 3 that came 8 s late (then rank 1's lost connection to rank 0),
    # and with wait_all_ranks ranks 1 and 2
    ("monitored-barrier-one-late.log", ["PF703", "PF727"]),
    ("monitored-barrier-two-late.log", ["PF703"]),
    # stack dumps of ranks waiting in all_reduce for a rank whose loader stalled, then SIGTERM to torchrun: the hang leads
    ("hang-py-spy-dump.log", ["PF713", "PF726"]),
    ("hang-py-spy-native-dump.log", ["PF713", "PF726"]),  # --native: each stack's C++ frames around its Python ones
    ("hang-py-spy-spawn-dump.log", ["PF713"]),  # torch.multiprocessing.spawn's ranks, SIGTERMed silently after the dumps
    ("hang-py-spy-late-join-dump.log", ["PF713", "PF726"]),  # ranks 0 and 1 wait in init_process_group for rank 2
    ("hang-py-spy-diverged-dump.log", ["PF713", "PF726"]),  # rank 2 in a broadcast, ranks 0 and 1 in an all_reduce
    ("hang-faulthandler-timeout.log", ["PF713", "PF726"]),
    ("healthy-py-spy-dump.log", []),  # every rank computing its step when py-spy dumped it
    ("spawn-rank-killed-torch1.7.1.log", ["PF721"]),  # spawn before 1.8: "Exception: process 1 terminated with signal SIGKILL"
    # DeepSpeed's per-node launcher (0.14.4): a rank SIGKILLed ("exits with return code = -9"), then its own SIGTERM
    ("deepspeed-rank-killed-0.14.4.log", ["PF721"]),
    ("deepspeed-sigterm-0.14.4.log", ["PF726"]),
    # torchrun's etcd rendezvous backends with no etcd server at the endpoint (torch 2.13.0, python-etcd 0.4.5)
    ("rendezvous-etcd-v2-unreachable-torch2.13.0.log", ["PF717"]),
    ("rendezvous-etcd-unreachable-torch2.13.0.log", ["PF717"]),
    ("hostname-does-not-resolve.log", ["PF302"]),
    ("torch-cpu-build.log", ["PF105"]),
    ("gloo-hostname-foreign-h2.log", ["PF309", "PF711"]),
    ("gloo-hostname-foreign-cluster.log", ["PF309", "PF711"]),  # h1's connect to the 127.0.0.1 h2 fell back to: no PF301
    ("nccl-watchdog-allgather.log", ["PF703", "PF702"]),
    ("nccl-unhandled-cuda-error.log", ["PF701"]),
    ("nccl-cuda-error-then-timeout.log", ["PF701", "PF703", "PF702"]),
    ("nccl-duplicate-gpu.log", ["PF704", "PF102"]),  # NCCL 2.19.3 is denylisted (NVLS hangs); the error leads
    ("nccl-shm-fallocate.log", ["PF203"]),
    ("nccl-shm-extend.log", ["PF203"]),
    ("spawn-invalid-device-ordinal.log", ["PF709"]),
    ("xid-kernel-log.log", ["PF801", "PF401"]),  # each Xid line once (diagnose/kernel.py)
    ("nvml-container-lost-gpus.log", ["PF732"]),  # nvidia-smi -L's lines in a pod before and after a daemon-reload
    ("dataloader-open-file-limit.log", ["PF733"]),  # DataLoader workers' descriptors past a soft limit of 256
    ("checkpoint-filesystem-full.log", ["PF734"]),  # torch.save to a 1 MiB filesystem: its zip writer's short write
    ("launch-without-torchrun.log", ["PF735"]),  # python train.py: init_process_group's env:// without RANK
    ("launch-local-rank-unset.log", ["PF735"]),  # the script's own os.environ["LOCAL_RANK"], 3.11's <frozen os> frame
    ("clean-ddp-train.log", []),
    ("hang-store-barrier.log", ["PF713"]),
    ("lightning-driver-545-hang.log", ["PF102", "PF713"]),
    ("collect-env-cpu.log", []),
    ("nccl-init-then-ddp-hang.log", ["PF713"]),
])
def test_each_log_gives_its_codes_root_cause_first(name: str, codes: list[str]) -> None:
    assert codes_of(diagnosed(name)) == codes


def test_watchdog_timeout_names_the_op_the_timeout_and_the_ranks() -> None:
    timeout, failed = diagnosed("nccl-watchdog-allgather.log")
    assert timeout.details["op"] == ["ALLGATHER"] and timeout.details["timeout_ms"] == ["600000"]
    assert timeout.ranks == (0, 1) and timeout.first_line == 1 and timeout.matches == 3
    assert timeout.codes == ("PF703", "PF102", "PF304", "PF501")
    assert failed.codes[:2] == ("PF702", "PF102")  # the 545 driver's P2P hang is the likeliest cause without an earlier error


def test_cuda_error_before_the_timeouts_is_the_root_cause_and_names_the_cuda_error() -> None:
    cuda, timeout, failed = diagnosed("nccl-cuda-error-then-timeout.log")
    assert cuda.details["cuda_error"] == ["out of memory"] and cuda.details["nccl_version"] == ["2.20.5"]
    # out of memory inside NCCL: NCCL's CUDA error, then the GPU out of memory's remedies and another process on the GPU
    assert cuda.codes == ("PF701", "PF725", "PF204")
    assert cuda.ranks == (3,) and timeout.ranks == (0, 1, 2) and timeout.details["op"] == ["ALLREDUCE"]
    assert failed.tier == timeout.tier == "consequence" and cuda.tier == "cause"


def test_unhandled_cuda_error_without_a_telling_cuda_error_keeps_every_likely_code() -> None:
    (cuda,) = diagnosed("nccl-unhandled-cuda-error.log")
    assert cuda.details["cuda_error"] == ["invalid argument"] and cuda.ranks == (7,)
    assert cuda.codes == ("PF701", "PF106", "PF401", "PF204")
    (newer_driver,) = diagnose_text("[rank0]: RuntimeError: NCCL error: Unhandled Cuda Error\n"
                                    "Cuda failure 35 'CUDA driver version is insufficient for CUDA runtime version'\n")
    assert newer_driver.codes == ("PF715", "PF106")  # the driver older than torch's CUDA is the cause NCCL reports
    assert newer_driver.signatures == ("cuda-driver-insufficient", "nccl-unhandled-cuda-error")


def test_loopback_connect_failure_outranks_the_later_plain_timeout() -> None:
    loopback, plain = diagnosed("gloo-loopback-cluster.log")
    assert loopback.details["remote"] == ["127.0.0.1"] and loopback.excerpts[0].text.startswith("h1: ")
    assert "Connect timeout" in plain.details["reason"][0] and plain.excerpts[0].text.startswith("h2: ")
    assert loopback.first_line < plain.first_line and plain.codes == ("PF711", "PF301", "PF303")


def test_root_cause_tier_beats_an_earlier_consequence() -> None:
    text = ("[rank0]:[E ProcessGroupNCCL.cpp:537] Some NCCL operations have failed or timed out. Due to the asynchronous nature of "
            "CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.\n"
            "[Fri Aug 30 12:40:18 2024] NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus\n")
    fell_off, failed = diagnose_text(text)  # the Xid line once: the kernel log's own reading (diagnose/kernel.py)
    assert (fell_off.code, fell_off.codes, fell_off.tier) == ("PF801", ("PF801", "PF201"), "hardware")
    assert fell_off.details["event"][0].startswith("Xid 79 on 0000:44:00 (1x): fatal, GPU has fallen off the bus")
    assert failed.code == "PF702" and failed.first_line < fell_off.first_line


@pytest.mark.parametrize(("name", "code", "expected"), [
    ("port-in-use.log", "PF707", {"port": r"\d+"}),
    ("ddp-unused-parameters.log", "PF705", {"parameter_indices": "2 3"}),
    ("ddp-inplace.log", "PF706", {"tensor": re.escape("torch.FloatTensor [4, 8]"), "saved_as": "output 0 of Sigmoid"}),
    ("dev-shm-full.log", "PF203", {"file": r"/torch_\d+_\d+_\d+"}),
    ("nccl-shm-extend.log", "PF203", {"file": "/dev/shm/nccl-WU88OE", "bytes": "9637892"}),
    ("nccl-duplicate-gpu.log", "PF704", {"device": "f000"}),
    ("gloo-interface-missing.log", "PF303", {"interface": "ens9"}),
    ("hostname-does-not-resolve.log", "PF302", {"error": "Temporary failure in name resolution"}),
    ("rendezvous-timeout.log", "PF712", {"joined": "1", "expected": "2"}),
    ("rendezvous-refused.log", "PF717", {"endpoint": r"\(127\.0\.0\.1, \d+\)", "waited": "10000ms"}),
    ("spawn-invalid-device-ordinal.log", "PF709", {"process": "1"}),
    ("gloo-collective-timeout.log", "PF703", {"op": "recv", "timeout_ms": "5000"}),
])
def test_captured_details(name: str, code: str, expected: dict[str, str]) -> None:
    diagnosis = next(d for d in diagnosed(name) if d.code == code)
    for group, pattern in expected.items():
        assert len(diagnosis.details[group]) == 1 and re.fullmatch(pattern, diagnosis.details[group][0]), (group, diagnosis.details)


def test_duplicate_gpu_names_every_rank_on_the_shared_device() -> None:
    duplicate, denylisted_nccl = diagnosed("nccl-duplicate-gpu.log")
    assert denylisted_nccl.code == "PF102" and denylisted_nccl.details["the NCCL torch loads"][0].startswith("2.19.3 (denylisted")
    assert duplicate.ranks == (0, 3, 7) and duplicate.codes == ("PF704", "PF207", "PF502", "PF201")
    assert set(duplicate.signatures) == {"nccl-duplicate-gpu", "nccl-invalid-usage"}


def test_xid_lines_give_the_gpu_and_the_xid() -> None:
    # The probe's reader and checks/xid.py's catalogue: one event per GPU and code, the R570 message an Xid 79 of its own;
    # the ECC Xid under PF401, whose remedy explains it; the GPUs lost from the bus before the application's Xid 13.
    xid, ecc = diagnosed("xid-kernel-log.log")
    assert xid.tier == ecc.tier == "hardware" and xid.codes == ("PF801", "PF201") and xid.matches == 4
    assert [e.split("): ")[0] + ")" for e in xid.details["event"]] == [
        "Xid 79 on 0000:44:00 (1x)", "Xid 79 on 0000:b3:00 (1x)", "Xid 13 on 0000:cb:00 (2x)"]
    assert xid.details["event"][0].startswith("Xid 79 on 0000:44:00 (1x): fatal, GPU has fallen off the bus")
    assert [e.line for e in xid.excerpts] == [4, 7, 1]  # each event's first line, root cause first
    assert ecc.codes == ("PF401", "PF402", "PF801") and ecc.details["event"] == [
        "Xid 94 on 0000:9b:00 (1x): not fatal, contained ECC error: only the application that touched the memory was stopped; "
        "restart the application (NVIDIA: RESTART_APP)"]
    assert "ECC counts" in ecc.before_job and [e.line for e in ecc.excerpts] == [3]


def test_an_nvswitch_sxid_leads_the_nvlink_xids_it_causes_and_the_application_xids_last() -> None:
    text = ("[  10.1] NVRM: Xid (PCI:0000:cb:00): 13, pid=7, name=python, Graphics SM Warp Exception\n"
            "[  10.2] NVRM: Xid (PCI:0000:4c:00): 137, TLC RX interrupt hit on link 4 on GPU0: PRIV Error\n"
            "[  10.3] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 12028, Non-fatal, Link 62 egress non-posted PRIV error\n"
            "[  10.4] NVRM: Xid (PCI:0000:4c:00): 95, Uncontained: FBHUB. RST: Yes, D-RST: No\n")
    sxid, xid, ecc = diagnose_text(text)
    assert (sxid.code, sxid.tier, sxid.signatures) == ("PF802", "hardware", ("kernel-sxid",))
    assert sxid.details["event"][0].startswith("SXid 12028 on 0000:07:00.0 (1x): not fatal, non-fatal NVSwitch error")
    assert xid.code == "PF801" and [e.split(" (")[0] for e in xid.details["event"]] == ["Xid 137 on 0000:4c:00", "Xid 13 on 0000:cb:00"]
    assert xid.details["event"][0].split(": ")[1].startswith("not fatal, NVLink error")
    assert ecc.code == "PF401" and ecc.details["event"][0].startswith("Xid 95 on 0000:4c:00 (1x): fatal, uncontained ECC error")
    # An application's Xid alone is a cause, not the hardware: it reads as the job's own fault.
    (app,) = diagnose_text("NVRM: Xid (PCI:0000:cb:00): 31, pid=7, name=python, MMU Fault\n")
    assert (app.code, app.tier) == ("PF801", "cause") and "restart the application (NVIDIA: RESTART_APP)" in app.details["event"][0]


def test_every_finding_the_xid_catalogue_points_to_has_a_remedy() -> None:
    catalogue = load_catalogue()
    assert {meaning.finding for meaning in XID_CATALOGUE.values()} | {"PF802"} <= set(catalogue)


# --- reading ---------------------------------------------------------------------------------------


def test_blocks_of_any_size_give_the_same_lines(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    text = read_log("nccl-cuda-error-then-timeout.log") + "tail without newline: Some NCCL operations have failed or timed out"
    log = tmp_path / "job.log"
    log.write_text("é\r\n" + text, encoding="utf-8")  # a two-byte character that small blocks split
    whole = diagnose_file(str(log))
    monkeypatch.setattr(diagnose_reading, "BLOCK_BYTES", 7)
    pieces = diagnose_file(str(log))
    assert pieces == whole and whole.lines == len(("é\r\n" + text).splitlines())
    assert whole.diagnoses[-1].excerpts[-1].line == whole.lines


def test_a_line_longer_than_the_limit_is_scanned_in_pieces(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(diagnose_reading, "BLOCK_BYTES", 64)
    monkeypatch.setattr(diagnose_reading, "LONGEST_LINE_CHARS", 256)
    progress = "".join(f"\r  {i}%|###       | {i}/100 [00:{i:02d}<01:00]" for i in range(100))
    log = tmp_path / "progress.log"
    log.write_text(f"first\n{progress}\r[rank5]: RuntimeError: [Errno 98] Address already in use\n", encoding="utf-8")
    (port,) = diagnose_file(str(log)).diagnoses
    assert port.code == "PF707" and port.first_line == 2
    assert port.excerpts[0].text == "[rank5]: RuntimeError: [Errno 98] Address already in use"  # the visible part after \r


def test_excerpts_are_trimmed_and_without_color_codes() -> None:
    message = "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one."
    line = "\x1b[31m" + "x" * 500 + f" {message} " + "y" * 500
    (unused,) = diagnose_text(line + "\n")
    text = unused.excerpts[0].text
    assert "Expected to have finished" in text and "\x1b" not in text
    assert text.startswith("...") and text.endswith("...") and len(text) <= EXCERPT_CHARS + 6


def test_colour_codes_inside_a_message_and_rank_prefixes_do_not_hide_it() -> None:
    # A terminal's colours split the message a pattern matches; they are removed before matching.
    line = "\x1b[1;31m[rank2]: RuntimeError: CUDA error: an \x1b[0millegal memory access was encountered\x1b[0m\n"
    (illegal,) = diagnose_text(line)
    assert illegal.code == "PF722" and illegal.ranks == (2,) and "\x1b" not in illegal.excerpts[0].text
    # srun --label's "N: ", torchrun --tee's [defaultN]:, mpirun's [1,N]<stdout>: name the rank.
    for prefix, rank in (("3: ", 3), ("[default5]:", 5), ("[1,7]<stderr>:", 7)):
        (port,) = diagnose_text(f"{prefix}OSError: [Errno 98] Address already in use\n")
        assert port.ranks == (rank,), prefix


def test_kept_excerpts_are_bounded_and_matches_counted() -> None:
    line = "[rank{}]: ValueError: sampler option is mutually exclusive with shuffle\n"
    (sampler,) = diagnose_text("".join(line.format(rank) for rank in range(500)))
    assert sampler.matches == 500 and len(sampler.excerpts) == 3 and sampler.ranks == tuple(range(500))


@pytest.mark.parametrize(("content", "words"), [
    (b"\x7fELF\x02\x01\x01\x00\x00\x00", "binary file"),
    (gzip.compress(b"\x7fELF\x02\x01\x01\x00\x00\x00", mtime=0), "binary file"),  # binary inside the gzip
    (b"\x1f\x8b\x08 a gzip header over no deflate stream", "not a readable gzip file"),
])
def test_binary_and_broken_gzip_files_are_bad_input(content: bytes, words: str, tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_bytes(content)
    with pytest.raises(InputError, match=words):
        diagnose_file(str(log))


def test_a_log_with_nul_bytes_is_read_as_text_and_a_binary_file_is_not(tmp_path: Path) -> None:
    # torch's DataLoader worker writes its signal line with the C string's terminating NUL; a node that crashed can
    # leave its log's last blocks as zeros. Neither makes the log binary, and the NULs are not in the lines read.
    bus = b"ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).\n\0"
    for content in (b"step 1\n" + bus + b"Traceback (most recent call last):\n", bus * 40, b"step 1\n" + bytes(8192)):
        log = tmp_path / "job.log"
        log.write_bytes(content)
        result = diagnose_file(str(log))
        assert [d.code for d in result.diagnoses] == (["PF203"] if bus in content else [])
        assert all("\0" not in e.text for d in result.diagnoses for e in d.excerpts)
    # Binary: a file of zeros, and a head that is not text once its NULs are left out (an ELF's, a pickle's).
    elf = b"\x7fELF\x02\x01\x01\x00" + bytes(8) + bytes(range(1, 32)) * 4 + b"GLIBC_2.34 libc.so.6"
    for content in (bytes(100), elf, pickle.dumps({"step": 3, "loss": [0.5] * 20})):
        log.write_bytes(content)
        with pytest.raises(InputError, match="binary file"):
            diagnose_file(str(log))


def test_missing_file_and_folder_are_bad_input(tmp_path: Path) -> None:
    for path in (tmp_path / "nope.log", tmp_path):
        with pytest.raises(InputError, match="cannot open"):
            diagnose_file(str(path))


def test_scanner_counts_lines_across_feeds() -> None:
    scanner = Scanner()
    for block in read_blocks(_Chunks([b"one\ntwo\n", b"[rank1]: RuntimeError: ", b"EADDRINUSE\n"]), "test"):
        scanner.feed(block)
    (port,) = scanner.diagnoses()
    assert scanner.lines == 3 and port.first_line == 3 and port.ranks == (1,)


class _Chunks:
    """A stream that returns the given chunks, one per read, like a pipe."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)

    def read(self, size: int = -1) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


# --- the command --------------------------------------------------------------------------------------


def test_cli_names_the_root_cause_first_and_exits_1() -> None:
    result = preflight("diagnose", str(LOGS / "nccl-watchdog-allgather.log"))
    assert result.returncode == 1 and result.stderr == ""
    first = next(line for line in result.stdout.splitlines() if line.startswith("1. "))
    assert first.startswith("1. PF703  A collective timed out  (line 1")
    assert "ranks 0-1" in result.stdout and "op ALLGATHER" in result.stdout and "timeout_ms 600000" in result.stdout
    assert "cause: " in result.stdout and "fix: " in result.stdout and "workaround: NCCL_P2P_DISABLE=1" in result.stdout


def test_cli_json_document() -> None:
    result = preflight("diagnose", "--json", str(LOGS / "gloo-loopback-cluster.log"))
    document: dict[str, Any] = json.loads(result.stdout)
    assert result.returncode == document["exit_code"] == 1 and document["status"] == "recognized"
    loopback = document["diagnoses"][0]
    assert loopback["code"] == "PF301" and loopback["title"] == "Hostname resolves to loopback"
    assert loopback["details"] == {"remote": ["127.0.0.1"]} and loopback["lines"][0]["line"] == loopback["first_line"]
    assert "GLOO_SOCKET_IFNAME" in loopback["workaround"]
    assert loopback["also_likely"] == [{"code": "PF309", "title": "Hostname resolves to no address of this host"},
                                       {"code": "PF303", "title": "Socket interface missing, down or without IPv4"}]
    assert [a["code"] for a in document["diagnoses"][1]["also_likely"]] == ["PF301", "PF303"]


def test_cli_clean_log_from_stdin_exits_0() -> None:
    result = preflight("diagnose", "-", stdin=read_log("clean-ddp-train.log"))
    assert result.returncode == 0
    assert result.stdout.strip() == "preflight diagnose: stdin (6 lines): no known failure signature found"


def test_cli_missing_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = preflight("diagnose", str(tmp_path / "nope.log"))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [f"preflight: error: diagnose: cannot open {tmp_path / 'nope.log'}: No such file or directory"]


def test_cli_empty_path_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """"" (an unset shell variable) is no log: Path("") would be the working directory, whose logs it would read."""
    (tmp_path / "rank0.log").write_text(read_log("gloo-peer-exits.log"), encoding="utf-8")
    result = preflight("diagnose", "", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == ["preflight: error: diagnose: the path is empty: name a log, a folder of logs, or - for stdin"]
