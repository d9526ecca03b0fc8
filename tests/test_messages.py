"""The message catalogue (tests/data/messages): what torch, NCCL, gloo, the CUDA runtime, NVML and the NVIDIA driver
print, taken from their sources per version, against the signatures of `preflight diagnose`.

Each recorded wording's format string is printed with sample values in its placeholders, behind the prefix its
library puts before it, and the line must be matched by exactly the signatures its entry names: every wording of a
message a signature claims, in every version recorded, and none that its entry says no signature reads. A signature
is written from the format string, so one pattern reads every version's wording (README there)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from messages_catalogue import LEVELS_WITHOUT_PREFIX, STYLES, catalogue, expand, holes, printed_lines

from preflight import bundle
from preflight.diagnose import load_signatures

probe = bundle.load(bundle.FACTS)  # the facts probe as hosts get it, loaded as a module
# Signatures whose messages come from none of the catalogue's sources, and where they come from instead. None left:
# hostname-does-not-resolve, once only Python's socket.gaierror, reads torch's store client's gai error too.
OUTSIDE_THE_SOURCES: dict[str, str] = {}


def wordings() -> list[tuple[str, str, int]]:
    return [(name, message["id"], index) for name, data in catalogue().items() for message in data["messages"]
            for index in range(len(message["wordings"]))]


def _wording(name: str, message_id: str, index: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    data = catalogue()[name]
    message = next(m for m in data["messages"] if m["id"] == message_id)
    return data, message, message["wordings"][index]


def test_every_file_names_its_source_and_each_wording_its_tags_and_paths() -> None:
    signatures = {s.id for s in load_signatures().signatures}
    assert {"torch", "nccl", "gloo", "cuda-runtime", "nvml", "nvidia-driver"} <= set(catalogue())
    for name, data in catalogue().items():
        # a repository, or a package registry's package (PyPI's, or Debian's for a closed binary read from its build)
        assert re.match(r"[\w.-]+/[\w.-]+|(?:pypi|debian):[\w.-]+", data["source"]), name
        assert data["how"] == "extracted" or data["how"].startswith("transcribed from https://"), name
        assert data["style"] in STYLES and data["tags_checked"], name
        ids = [m["id"] for m in data["messages"]]
        assert len(ids) == len(set(ids)), f"{name}: message ids repeat"
        for message in data["messages"]:
            named = [*(message["signatures"] or []), *message.get("details", []), *message.get("unless", []), *message.get("after", [])]
            assert set(named) <= signatures, (name, message["id"], set(named) - signatures)
            assert message["wordings"], (name, message["id"])
            for wording in message["wordings"]:
                assert wording["format"] and wording["paths"], (name, message["id"])
                assert expand(wording["tags"], data["tags_checked"]), (name, message["id"])
                level = wording.get("level", message.get("level"))
                assert level in data.get("line_formats", {}) or level in LEVELS_WITHOUT_PREFIX, (name, message["id"], level)


@pytest.mark.parametrize(("name", "message_id", "index"), wordings())
def test_each_wording_is_read_by_exactly_the_signatures_its_entry_names(name: str, message_id: str, index: int) -> None:
    data, message, wording = _wording(name, message_id, index)
    table = load_signatures()
    for line in printed_lines(data, message, wording):
        matched = {s.id for s in table.signatures if any(p.search(line) for p in s.patterns)}
        assert matched == set(message["signatures"] or []), f"{name}/{message_id} {wording['tags']}: {line!r} matched {sorted(matched)}"
        for group in ("details", "unless", "after"):
            for signature in message.get(group, []):
                patterns = next(getattr(s, group) for s in table.signatures if s.id == signature)
                assert any(p.search(line) for p in patterns), f"{name}/{message_id}: {line!r} is not one of {signature}'s {group}"
        # An unless pattern silences its signature for the whole log: one that reads a line its entry does not name
        # hides a real failure (NCCL 2.28's "NET/IB : Using [RO]; OOB eth0:..." with no device silenced the fallback).
        silenced = {s.id for s in table.signatures if any(p.search(line) for p in s.unless)}
        assert silenced <= set(message.get("unless", [])), f"{name}/{message_id}: {line!r} silences {sorted(silenced)}"
        # An `after` line makes its signature a consequence for the rest of the log: the same care.
        demotes = {s.id for s in table.signatures if any(p.search(line) for p in s.after)}
        assert demotes <= set(message.get("after", [])), f"{name}/{message_id}: {line!r} is an `after` line of {sorted(demotes)}"


def test_every_signature_reads_a_recorded_message_or_says_where_its_text_comes_from() -> None:
    claimed = {s for data in catalogue().values() for m in data["messages"] for s in m["signatures"] or []}
    for signature in load_signatures().signatures:
        assert (signature.id in claimed) != (signature.id in OUTSIDE_THE_SOURCES), signature.id


def test_the_driver_prints_xid_lines_that_the_kernel_log_reader_reads() -> None:
    data = catalogue()["nvidia-driver"]
    for message in data["messages"]:
        if message.get("reader") != "xid":
            continue
        for wording in message["wordings"]:
            for line in printed_lines(data, message, wording):
                (event,) = probe.xid_events([line], None, 0.0)[0]
                assert (event["kind"], event["code"]) == (message["kind"], message["code"]), (message["id"], line)
                assert event["pci"] and event["fatal"] == message.get("fatal"), (message["id"], line)


def test_sample_values_fill_every_placeholder_they_are_given_for() -> None:
    for name, data in catalogue().items():
        for message in data["messages"]:
            for wording in message["wordings"]:
                args = wording.get("args", message.get("args"))
                if args is None:
                    continue
                style = wording.get("style", message.get("style", data["style"]))
                assert len(args) == len(holes(wording["format"], style)), (name, message["id"], wording["format"], args)
