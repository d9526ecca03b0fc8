"""Flight recorder dumps: which collective diverged, which ranks never entered it, and the hosts they ran on.

torch records every collective each rank issues (TORCH_FR_BUFFER_SIZE, TORCH_NCCL_TRACE_BUFFER_SIZE before 2.7) and
writes one dump per rank (TORCH_FR_DUMP_TEMP_FILE + rank) on a watchdog timeout (NCCL, TORCH_NCCL_DUMP_ON_TIMEOUT) or
when the job asks (torch._C._distributed_c10d._dump_fr_trace(), which gloo jobs need: their timeouts dump nothing).
The analysis is torch's own (torch.distributed.flight_recorder, what `torchfrtrace` runs), so this module imports torch,
lazily, and only here: diagnose on logs never does. A dump tells its rank, not its host: ranks are placed on hosts by
the folder layout DUMP_DIR/HOST/PREFIX<RANK> (the shape `scp -r HOST:/dump/dir DUMP_DIR/HOST` gives), or by the names
of dumps in one folder (HOST_rank_<RANK>, from TORCH_FR_DUMP_TEMP_FILE=/shared/dumps/$(hostname)_rank_).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from preflight.diagnose.scan import DIVERGED_CODE, Diagnosis, Excerpt, rank_ranges
from preflight.errors import EnvironmentProblem, InputError

NO_CHECK = ("none: a rank that skips a collective is the job's code; the missing ranks' logs and hosts show why "
            "(preflight check cluster=NAME on their hosts)")

PICKLE_START = b"\x80"  # a dump is a pickle (protocol 2 and up start with PROTO)
MAX_DUMPS = 1 << 14
MAX_ENTRIES = 1 << 17  # files and folders looked at under the folder
_RANK_SUFFIX = re.compile(r"^(?P<prefix>.*?)(?P<rank>\d+)$")


def looks_like_dump(path: Path) -> bool:
    """Whether the file starts as a pickle does: a flight recorder dump, not a log."""
    try:
        with open(path, "rb") as f:
            return f.read(1) == PICKLE_START
    except OSError:
        return False


@dataclass(frozen=True)
class DumpFile:
    """One rank's dump: where it is, its rank, the host it came from ('' when the folder does not say)."""

    path: Path
    rank: int
    host: str


def find_dumps(folder: Path) -> list[DumpFile]:
    """Every dump under folder, with the rank its name ends in and its host: the subfolder it is in, or else what its
    name holds before the part all names share (TORCH_FR_DUMP_TEMP_FILE=/dumps/$(hostname)_rank_ gives h1_rank_0)."""
    dumps: list[DumpFile] = []
    # Bounded: a folder given by mistake (/) ends the walk, not the machine.
    for path in sorted(itertools.islice(folder.rglob("*"), MAX_ENTRIES)):
        if len(dumps) >= MAX_DUMPS:
            break
        match = _RANK_SUFFIX.match(path.name)
        if match is None or not path.is_file() or not looks_like_dump(path):
            continue
        parts = path.relative_to(folder).parts
        dumps.append(DumpFile(path, int(match["rank"]), parts[0] if len(parts) > 1 else ""))
    flat = [d for d in dumps if not d.host]
    prefixes = [_RANK_SUFFIX.match(d.path.name)["prefix"] for d in flat]  # type: ignore[index]  # matched above
    shared = _common_ending(prefixes) if len(set(prefixes)) > 1 else ""
    named = {d.path: prefix[: len(prefix) - len(shared)].rstrip("_-.") for d, prefix in zip(flat, prefixes, strict=True)}
    return [DumpFile(d.path, d.rank, d.host or named.get(d.path, "")) for d in dumps]


def _common_ending(names: list[str]) -> str:
    """The longest ending every name shares."""
    shortest = min(names, key=len)
    size = 0
    while size < len(shortest) and all(name[-1 - size] == shortest[-1 - size] for name in names):
        size += 1
    return shortest[len(shortest) - size:]


def _torch_analysis() -> tuple[Any, Any]:
    """torch's flight recorder reader and database builder; an EnvironmentProblem without them."""
    try:
        # Importing the builder warns on stderr when tabulate is missing; the warning is the library's, not ours.
        with contextlib.redirect_stderr(io.StringIO()):
            from torch.distributed.flight_recorder.components.builder import build_db
            from torch.distributed.flight_recorder.components.loader import read_dump
    except ImportError as e:
        raise EnvironmentProblem(f"diagnose: reading flight recorder dumps needs torch 2.7 or later installed here ({e})") from None
    return read_dump, build_db


def _repair_gloo_group_names(dump: dict[str, Any]) -> None:  # one dump as torch's loader returns it (raw pickle)
    """gloo's recorder (torch 2.13) files the group under the name '' in pg_config, though its entries name it ('0',
    'default_pg'); torch's analysis looks groups up by the entries' name. Only that empty key is renamed, in memory."""
    config = dump["pg_config"]
    names = {tuple(entry["process_group"]) for entry in dump["entries"]}
    if set(config) == {""} and len(names) == 1:
        ((name, desc),) = names
        config[name] = {**config.pop(""), "name": name, "desc": desc}


def analyse(folder: Path) -> Diagnosis | None:
    """PF714 naming the first collective not every rank entered, or None when every collective matched."""
    dumps = find_dumps(folder)
    if not dumps:
        raise InputError(f"diagnose: {folder} has no flight recorder dumps (files PREFIX<RANK> holding a pickle)")
    read_dump, build_db = _torch_analysis()
    details: dict[str, dict[str, Any]] = {}  # torch's loader output: one raw dump per file, as torch's builder takes it
    hosts: dict[int, str] = {}
    for dump in dumps:
        prefix = _RANK_SUFFIX.match(dump.path.name)["prefix"]  # type: ignore[index]  # find_dumps matched it
        try:
            loaded = read_dump(prefix, str(dump.path))
        except Exception as e:  # a pickle that is not a dump raises anything: name the file
            raise InputError(f"diagnose: {dump.path} is not a flight recorder dump: {e}") from None
        _repair_gloo_group_names(loaded)
        details[str(dump.path)] = loaded
        hosts[dump.rank] = dump.host
    version = str(next(iter(details.values()))["version"])
    args = argparse.Namespace(verbose=False, just_print_entries=False, allow_incomplete_ranks=True, mismatch_cap=10,
                              selected_ranks=None, pg_filters=None, print_stack_trace=False, transform_ft=False,
                              group_world_size=None, output=None, prefix=None, trace_dir=str(folder))
    quiet = logging.getLogger("Flight Recorder")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # torch's analysis logs each mismatch in its own words; ours is the diagnosis
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            database = build_db(details, args, version)
    except (AssertionError, KeyError, ValueError) as e:
        raise InputError(f"diagnose: torch's flight recorder analysis failed on {folder}: {e!r}") from None
    finally:
        quiet.setLevel(level)
    diverged = next((c for c in database.collectives if c.missing_ranks or not c.pass_check), None)
    if diverged is None:
        return None
    expected = set(diverged.expected_ranks)
    missing = set(diverged.missing_ranks or ()) | (expected - set(hosts))
    entered = sorted(expected - missing)
    where = {rank: hosts.get(rank, "") or "?" for rank in sorted(missing)}
    found: dict[str, list[str]] = {
        "collective": [f"{diverged.collective_name} #{diverged.collective_seq_id} in process group {diverged.pg_desc}"],
        "ranks that never entered it": [rank_ranges(missing)],
        "their hosts": [", ".join(f"rank {rank} on {host}" for rank, host in where.items())],
        "ranks that entered it": [rank_ranges(entered)],
    }
    if expected - set(hosts):
        found["ranks without a dump"] = [rank_ranges(expected - set(hosts))]
    if diverged.type_of_mismatch:
        found["mismatch"] = [str(diverged.type_of_mismatch)]
    frames = [f"{frame['name']} at {frame['filename']}:{frame['line']}" for frame in diverged.collective_frames[-3:]]
    excerpt = Excerpt(0, f"{diverged.collective_name} (seq {diverged.collective_seq_id}, state {diverged.collective_state})"
                         + (f" called from {frames[-1]}" if frames else ""), "flight recorder")
    return Diagnosis(code=DIVERGED_CODE, codes=(DIVERGED_CODE, "PF713", "PF601"), tier="cause", signatures=("flight-recorder",),
                     first_line=0, matches=len(missing), excerpts=(excerpt,), details=found, ranks=tuple(sorted(missing)),
                     before_job=NO_CHECK)
