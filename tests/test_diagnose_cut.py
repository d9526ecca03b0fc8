"""A log whose last line stops mid-message (preflight/diagnose/cut.py): read by the start of a signature's message where
that start names one failure alone, as the message catalogue shows, and by nothing otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import preflight
from cut_starts import PATH, cut_starts, render
from logs_corpus import CLEAN_CAUSES, CORPUS, corpus_index
from messages_catalogue import catalogue, printed_lines

from preflight.diagnose import diagnose_file, diagnose_path, diagnose_text, load_signatures
from preflight.diagnose.cut import FLOOR_CHARS, parse_cut_starts, read_cut
from preflight.errors import EnvironmentProblem

# torch's watchdog line as v2.6.0 prints it, with the catalogue's sample values (tests/data/messages/torch.yaml)
PREFIX = "[rank3]:[E1129 03:47:01.093396789 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank 3] "
WATCHDOG = ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=1048576, "
            "NumelOut=1048576, Timeout(ms)=600000) ran for 600050 milliseconds before timing out.")
STEP = "{'loss': 3.5534, 'grad_norm': 1.41, 'learning_rate': 2.05e-06, 'epoch': 0.01}\n"


def codes(text: str) -> list[str]:
    return [d.code for d in diagnose_text(text)]


def test_the_shipped_starts_are_what_the_signatures_and_the_catalogue_make() -> None:
    stale = "playbooks/cut-starts.yaml is out of date: run python3 tests/cut_starts.py"
    made = cut_starts()
    assert PATH.read_text(encoding="utf-8") == render(made), stale
    assert len(load_signatures().cut_starts) == len(made) > 50


def test_no_recorded_message_cut_anywhere_is_read_as_a_failure_it_is_not() -> None:
    # Every line the sources print, as the catalogue records it, cut after each of its characters: read as one of the
    # signatures its entry names, or as nothing (a message no signature reads, an INFO line, is never read).
    starts = load_signatures().cut_starts
    cuts = read = 0
    for data in catalogue().values():
        for message in data["messages"]:
            own = set(message["signatures"] or [])
            for wording in message["wordings"]:
                for line in printed_lines(data, message, wording):
                    for end in range(FLOOR_CHARS, len(line) + 1):
                        cuts += 1
                        reading = read_cut(line[:end], starts)
                        if reading is not None:
                            read += 1
                            assert reading.start.signature in own, (message["id"], line[:end], reading.start.signature)
    assert cuts > 100_000 and read > 1_000  # the reader did read cut messages: the test is not empty


def test_no_line_of_a_clean_log_is_read_as_a_cut_failure() -> None:
    # Healthy runs and failures of the training code (the corpus's train split): any of their lines, left last in a
    # log, must not be blamed on the cluster.
    starts = load_signatures().cut_starts
    logs = [CORPUS / e["file"] for e in corpus_index() if e["split"] == "train" and e["cause"] in CLEAN_CAUSES]
    assert len(logs) >= 30
    for log in logs:
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
            assert read_cut(line, starts) is None, (log.name, line)


def test_a_last_line_cut_inside_the_watchdogs_message_is_a_collective_timeout() -> None:
    start = "Watchdog caught collective operation timeout: WorkNCCL("
    least = next(s.least for s in load_signatures().cut_starts if s.start == start)
    whole_from = WATCHDOG.index(") ran for") + 1  # from here on the signature's pattern reads the line as it is
    for end in range(least, len(WATCHDOG)):  # inside the start, and past it inside the values
        (timeout,) = diagnose_text(STEP + PREFIX + WATCHDOG[:end] + "\n")
        cut_line = 2 if end < whole_from else 0
        assert (timeout.code, timeout.cut_line, timeout.first_line, timeout.ranks) == ("PF703", cut_line, 2, (3,)), end
    for end in range(0, least):  # too little of it to tell
        assert codes(STEP + PREFIX + WATCHDOG[:end] + "\n") == [], end


def test_only_the_last_line_is_read_by_its_start() -> None:
    cut = PREFIX + WATCHDOG[:40] + "\n"
    assert codes(STEP + cut) == ["PF703"]
    assert codes(STEP + cut + "\n\n") == ["PF703"]  # blank lines after it change nothing
    assert codes(STEP + cut.rstrip() + "...\n") == codes(STEP + cut.rstrip() + " \u2026\n") == ["PF703"]  # a marked cut
    assert codes(STEP + cut + STEP) == []  # a line after it: the log goes on, the line was not cut by its end
    assert codes(STEP + "." * (1 << 21) + " " + cut.rstrip()) == ["PF703"]  # the end of a 2 MiB line, without its newline
    whole = diagnose_text(STEP + PREFIX + WATCHDOG + "\n")
    assert [(d.code, d.cut_line) for d in whole] == [("PF703", 0)]  # read whole, as ever


def test_a_start_whose_code_hangs_on_what_follows_is_never_read_cut() -> None:
    # NCCL's IB completion error: its code is the error number at the end (12: retry exceeded; 4: protection), and
    # the signature's refine rules read it, so a cut before it names nothing.
    starts = load_signatures().cut_starts
    refined = {s.id for s in load_signatures().signatures if s.refine or s.requires}
    assert refined and not {s.signature for s in starts} & refined
    line = "node017:2210:2392 [3] NCCL INFO transport/net_ib.cc:1338 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<44> with err"
    assert codes(STEP + line + "\n") == []


def test_a_cut_inside_a_placeholders_value_is_not_read() -> None:
    # gloo's "bind: %s" with EADDRINUSE is PF739, but a cut after "bind: Address " could be EAFNOSUPPORT's "Address
    # family not supported by protocol": the start past "bind: " is the errno's text, a placeholder's value.
    line = "RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/socket.cc:95] rv != -1. -1 vs -1. bind: "
    assert codes(STEP + line + "Address already in use\n") == ["PF739"]
    for cut in ("Address ", "Address already in u"):
        assert codes(STEP + line + cut + "\n") == [], cut
    assert not any(s.start.startswith("rv != -1") for s in load_signatures().cut_starts)


def test_a_thread_that_cut_the_watchdogs_line_mid_word(tmp_path: Path) -> None:
    # LlamaFactory#8261 (the corpus's train split): the paste ends "Watchdog caught collective operati".
    log = CORPUS / "llamafactory-8261-tqdm-then-watchdog.log"
    result = diagnose_file(str(log))
    (timeout,) = result.diagnoses
    assert (timeout.code, timeout.cut_line, timeout.ranks) == ("PF703", 21, (5,))
    shown = preflight("diagnose", str(log))
    assert shown.returncode == 1 and "line 21 stops mid-message" in shown.stdout
    document = json.loads(preflight("diagnose", "--json", str(log)).stdout)
    assert document["diagnoses"][0]["cut_line"] == 21
    # In a folder of rank logs, each file's last line is its own: rank 1's cut line, rank 0's whole one.
    (tmp_path / "rank0.log").write_text(STEP + "training goes on\n")
    (tmp_path / "rank1.log").write_text(STEP + PREFIX + WATCHDOG[:45] + "\n")
    (merged,) = diagnose_path(str(tmp_path)).diagnoses
    assert (merged.code, merged.cut_line, merged.details["files"], merged.excerpts[0].source) == ("PF703", 2, ["rank1.log"], "rank1.log")


def test_a_malformed_starts_file_is_refused() -> None:
    good = {"signature": "collective-timeout", "start": "Watchdog caught collective operation timeout: ", "least": 30, "upto": 40}
    assert parse_cut_starts({"starts": [good]}, ["collective-timeout"])[0].least == 30
    with pytest.raises(EnvironmentProblem, match="needs a `signature`"):
        parse_cut_starts({"starts": [good]}, ["port-in-use"])
    for bad in ({"least": FLOOR_CHARS - 1}, {"upto": 29}, {"upto": 47}, {"upto": None}):
        with pytest.raises(EnvironmentProblem, match="`least` and `upto` from"):
            parse_cut_starts({"starts": [{**good, **bad}]}, ["collective-timeout"])
    with pytest.raises(EnvironmentProblem, match="a list `starts`"):
        parse_cut_starts([good], ["collective-timeout"])
