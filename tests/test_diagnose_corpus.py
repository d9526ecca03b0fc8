"""`preflight diagnose` on the logs people paste: the corpus of real failure and healthy logs copied from public issues
(tests/data/logs/corpus, README there). Signatures are written from the train split only; the held-out split measures
them, and the figures below are the ones docs/benchmarks.md states. A wrong cause is worse than none, so it has its own
bound; every healthy log, and every failure of the training code itself, must be read as no known failure. A failure
whose cause has no code yet (code null, with a note) is kept out of the recall, and naming any code for it is a wrong
cause."""

from __future__ import annotations

import re
from collections import Counter
from functools import cache
from typing import Any

import pytest
import yaml
from logs_corpus import CLEAN_CAUSES, CORPUS, corpus_index, split_of

from preflight.catalogue import load_catalogue
from preflight.diagnose import LogDiagnosis, diagnose_file

# The held-out failures' first diagnosis, as measured (README): right, and wrong (a code other than the thread's cause;
# none recognized is neither). 36 of 41 when the split was first run; 40 of 45 once the NVSwitch SXid logs, read by the
# kernel-log reader (diagnose/kernel.py, written from tests/data/gpu-node/kernel, not from these logs), were measured
# too and two IB error 4 logs, found later, fell on the held-out side.
# Grown to 250 logs (issue #36; no signature changed): 66 of the 77 held-out failures with a code, as measured. Then the
# codes for the causes the corpus had none for (PF725-PF729, written from the sources' format strings on a branch that
# held none of these logs) and the logs of those causes labelled with them by class: 73 of 88, and one wrong,
# nccl-394-gid-table-change.log (its thread's cause an InfiniBand GID-change event, which PF728 does not count as a
# fault; diagnose names the error 12 after it, PF719), as measured (2026-11-27).
# Then signatures from the sources of the train split's misses and of the fresh batch's (measured once before, then
# training material; no held-out log read): 77 of 88, the same one wrong, as measured (2026-11-27).
# Then signatures from a sweep of the message catalogue's error messages (their format strings, no log): 78 of 88, one
# wrong, as measured once (2026-11-27). A second sweep (branch diag3): 78 of 88, one wrong, as measured once.
# Then 21 logs added blind (README: "A batch added blind"; no signature written for them), 8 on the held-out side:
# 86 of 96, one wrong, as measured once (2026-11-27).
# Then (2026-11-29) gloo's bind with EADDRINUSE read from gloo's source: gloo binds port 0, so it is no ephemeral port
# left (PF739, a run here), not the rendezvous port in use (PF707), which port-in-use had named for any "Address already
# in use". Measured once after: one held-out port-in-use log now leads with PF739, a wrong cause by its thread's label:
# 85 of 96, two wrong. That log was not opened, and nothing was changed for it: the rule is gloo's source's.
# Then gloo's connect SO_ERROR as gloo printed it until 2023 ("connect [%s]: %s", pair.cc), read from gloo's history and
# printed by torch 1.8.1 and 1.12.1 in runs here: 86 of 96, two wrong, as measured once (2026-11-29).
# Then (2026-11-29) seven train logs gathered for the thin classes, one of them the store client's connect that timed out
# (errno 110) as torch printed it before it retried one (1.12.1's socket.cpp, a run here): read as the endpoint out of
# reach. 87 of 96, two wrong, as measured once; the held-out log that changed was not opened.
HELD_OUT_RIGHT_AT_LEAST = 87
HELD_OUT_WRONG_AT_MOST = 2
# Failures whose cause has no code yet (code null, with a note), both splits: none may be named as a known failure.
# When such a cause gets a code, its entries get that code and join the recall. None left, as measured.
NO_CODE_NAMED_AT_MOST = 0
# The classes issue #27 lists, each recognized on at least three real logs (RECOGNIZED_AT_LEAST_3); the ones the corpus
# holds fewer real logs of, or that the text cannot tell apart from a healthy log, are named in the README.
RECOGNIZED_AT_LEAST_3 = ("driver-insufficient", "nccl-bootstrap-connect", "rendezvous-unreachable", "nvls-fabric",
                         "ib-retry-exceeded", "host-oom-kill", "illegal-memory-access", "collective-mismatch",
                         "nccl-socket-fallback", "nvswitch-sxid", "ib-local-protection")


@cache
def diagnosed(file: str) -> LogDiagnosis:
    return diagnose_file(str(CORPUS / file))


def first_code(file: str) -> str | None:
    diagnoses = diagnosed(file).diagnoses
    return diagnoses[0].code if diagnoses else None


def test_every_log_is_indexed_with_its_source_cause_and_the_split_its_source_gives() -> None:
    entries = corpus_index()
    files = [e["file"] for e in entries]
    assert sorted(files) == sorted(p.name for p in CORPUS.glob("*.log")) and len(set(files)) == len(files)
    catalogue = load_catalogue()
    for entry in entries:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+#\d+|https://\S+", entry["source"]), entry
        assert entry["evidence"].strip() and entry["cause"].strip()
        if entry["code"] is None:
            assert entry["cause"] == "healthy" or entry.get("note", "").strip(), entry["file"]
        else:
            assert entry["code"] in catalogue and entry["cause"] not in CLEAN_CAUSES, entry["file"]
        assert entry["split"] == split_of(entry["source"]), entry["file"]
    causes = Counter(e["cause"] for e in entries)
    assert sum(causes.values()) - causes["healthy"] >= 100 and causes["healthy"] >= 20


def test_the_readme_names_every_log_with_its_source() -> None:
    readme = (CORPUS / "README.md").read_text(encoding="utf-8")
    for entry in corpus_index():
        assert f"| `{entry['file']}` | [{entry['source']}]" in readme, entry["file"]


@pytest.mark.parametrize("file", [e["file"] for e in corpus_index() if e["cause"] in CLEAN_CAUSES])
def test_a_healthy_log_or_a_bug_in_the_training_code_is_no_known_failure(file: str) -> None:
    result = diagnosed(file)
    assert result.diagnoses == () and result.exit_code == 0


def test_held_out_recall_and_wrong_causes() -> None:
    outcome: Counter[str] = Counter()
    for entry in corpus_index():
        if entry["split"] != "held-out" or entry["code"] is None:
            continue
        got = first_code(entry["file"])
        outcome["right" if got == entry["code"] else "unknown" if got is None else "wrong"] += 1
    assert outcome["right"] >= HELD_OUT_RIGHT_AT_LEAST, outcome
    assert outcome["wrong"] <= HELD_OUT_WRONG_AT_MOST, outcome


def test_a_failure_whose_cause_has_no_code_yet_is_named_as_no_other_cause() -> None:
    pending = [e["file"] for e in corpus_index() if e["code"] is None and e["cause"] not in CLEAN_CAUSES]
    named = [(file, first_code(file)) for file in pending if first_code(file) is not None]
    assert len(named) <= NO_CODE_NAMED_AT_MOST, named


@pytest.mark.parametrize("cause", RECOGNIZED_AT_LEAST_3)
def test_each_listed_class_is_recognized_on_three_real_logs(cause: str) -> None:
    entries = [e for e in corpus_index() if e["cause"] == cause]
    assert sum(first_code(e["file"]) == e["code"] for e in entries) >= 3, [(e["file"], first_code(e["file"])) for e in entries]


def test_an_unrecognized_failure_points_at_its_first_error_line() -> None:
    # The heartbeat monitor's "should dump" warning after the store went away, which a good run's end prints too: no
    # signature reads it, so the first error-looking line is shown. (The watchdog line the thread of llamafactory-8261
    # cut mid-word, once this test's log, is read by its start now: tests/test_diagnose_cut.py.)
    result = diagnosed("vllm-gfx906-44-store-closed.log")
    assert result.diagnoses == () and result.first_error is not None and result.first_error.line == 9
    assert 'Failed to check the "should dump" flag' in result.first_error.text
    assert "the first error-looking line was: 9: " in result.render()
    assert result.to_json()["first_error"]["line"] == 9


def test_sockets_are_a_fallback_only_where_the_log_shows_infiniband() -> None:
    # A one-host machine without IB prints "NET/IB : No device found" and "Using network Socket" too: no fallback there.
    assert "PF724" not in [d.code for d in diagnosed("lrgt-13-duplicate-gpu.log").diagnoses]
    # NCCL's bootstrap socket line names the NIC, and NET/IB then takes the data: no fallback either.
    assert diagnosed("healthy-nccl-tests-29-init.log").diagnoses == ()
    (fallback,) = diagnosed("nccl-451-socket-not-ib.log").diagnoses
    assert fallback.code == "PF724" and fallback.details["infiniband"] == ["mlx5_bond_0"] and "PF841" in fallback.before_job


def test_findings_name_what_varies_and_the_check_before_the_job() -> None:
    (connect,) = diagnosed("sglang-3820-no-route.log").diagnoses
    assert connect.code == "PF716" and connect.details["peer"] == ["10.0.0.4"] and connect.details["errno"] == ["113"]
    assert connect.details["host"] == ["node5"]  # NCCL's host:pid:tid prefix
    assert connect.before_job.startswith("PF610, PF303: preflight check cluster=NAME playbook=connectivity")
    (store,) = diagnosed("cppo-6-client-timeout.log").diagnoses
    assert store.code == "PF717" and store.details["endpoint"] == ["(172.18.21.4, 37907)"] and store.details["waited"] == ["600000ms"]
    ib = diagnosed("nccl-928-ib-error-4.log").diagnoses[0]
    assert ib.code == "PF720" and ib.details["ib_error"] == ["4"] and ib.details["vendor_err"] == ["81"]
    nvls = diagnosed("nccl-1338-nvls-invalid-argument.log").diagnoses[0]
    assert nvls.code == "PF718" and nvls.details["cuda_error"] == ["invalid argument"] and "PF811" in nvls.before_job
    (mismatch,) = diagnosed("ms-swift-9443-collective-mismatch.log").diagnoses
    assert mismatch.ranks == (0, 1) and mismatch.details["op"] == ["ALLREDUCE"] and mismatch.details["seq"] == ["3104"]
    for file in ("horovod-3929-duplicate-gpu.log", "llamafactory-6269-watchdog-timeout.log"):  # mpirun's and torch's prefixes
        assert diagnosed(file).diagnoses[0].ranks, file
    assert diagnosed("horovod-3929-duplicate-gpu.log").diagnoses[0].details["host"] == ["smc-gpu-03"]


def test_an_nvswitch_kernel_log_names_the_fabric_first_and_each_xid_line_once() -> None:
    # SXid 12028 on three switches, then a GPU's NVLink Xid 137 and the Xid 94s: fabric, link, memory, each line in one
    # finding (the Xid signatures that read the same lines as PF401/PF710 are gone).
    sxid, nvlink, ecc = diagnosed("sxid-sulao-1165.log").diagnoses
    assert (sxid.code, nvlink.code, ecc.code) == ("PF802", "PF801", "PF401")
    assert all("NVSwitch error" in event for event in sxid.details["event"])
    # Two switches show only their Data lines: their severity is NVIDIA's catalogue's for 12028 (RESET_FABRIC, FATAL),
    # not non-fatal; the third's headline says Non-fatal, which decides for it.
    assert [e.split("): ")[1].split(",")[0] for e in sxid.details["event"]] == ["fatal", "fatal", "not fatal"]
    assert all("NVIDIA's catalogue calls it fatal" in e for e in sxid.details["event"][:2])
    assert nvlink.details["event"][0].startswith("Xid 137 on 0000:4c:00 (4x): not fatal, NVLink error")
    shown = [e.line for d in (sxid, nvlink, ecc) for e in d.excerpts]
    assert len(shown) == len(set(shown))


FRESH = CORPUS.parent / "fresh-2026-11-27"


def fresh_index() -> list[dict[str, Any]]:
    with open(FRESH / "index.yaml", encoding="utf-8") as f:
        entries: list[dict[str, Any]] = yaml.safe_load(f)["logs"]
    return entries


# The fresh batch was measured once (docs/benchmarks.md: 19 of 26 failures right, 2 wrong); its misses were then
# studied as training material (its README), so it is a train set now: every log's first diagnosis is its thread's.
@pytest.mark.parametrize("entry", fresh_index(), ids=lambda e: e["file"])
def test_the_fresh_batch_studied_after_its_one_measure_reads_as_its_threads_say(entry: dict[str, Any]) -> None:
    diagnoses = diagnose_file(str(FRESH / entry["file"])).diagnoses
    assert (diagnoses[0].code if diagnoses else None) == entry["code"], [d.code for d in diagnoses]


def test_the_signatures_from_the_train_misses_capture_what_varies() -> None:
    (barrier,) = diagnosed("metaseq-52-store-barrier-timeout.log").diagnoses
    assert barrier.code == "PF712" and barrier.details["joined"] == ["1792"] and barrier.details["expected"] == ["2048"]
    (name,) = diagnosed("grendel-gs-9-gai-temporary-failure.log").diagnoses
    assert name.code == "PF302" and name.details["host"] == ["user"] and name.details["gai_error"] == ["-3"]
    (iface,) = diagnosed("nccl-1837-ifname-not-found.log").diagnoses
    assert iface.code == "PF303" and iface.details["family"] == ["59936"]
    (killed,) = diagnosed("mplbm-92-mpi-signal-9.log").diagnoses
    assert killed.code == "PF721"
    kingdra = diagnose_file(str(FRESH / "kingdra-2-killed.log")).diagnoses
    assert kingdra[0].code == "PF721" and kingdra[0].details["pid"] == ["318"]  # bash's job line, before the silence
