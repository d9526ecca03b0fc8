"""How fast `preflight diagnose` reads a big log, against reading the same file and doing nothing with it.

A job at scale leaves gigabytes: NCCL_DEBUG=INFO's init chatter on every rank, a line per training step. Each shape is a
log of --mb megabytes written to a temporary folder, ending with a real failure that diagnose must still name first:

- ``nccl-init``: the corpus's train-split healthy logs (tests/data/logs/corpus, captured from public threads: NCCL INFO
  lines, launcher warnings, nccl-tests tables), repeated to the size;
- ``training-steps``: built lines, one per step as a training loop logs them (``[rank3]: 2026-11-27 03:34:00,123 INFO
  epoch 2 step 1234 loss 2.314 lr 3.0e-04``), the shape where every line is a progress line to keep.

Both end with the train-split log ``vllm-19670-client-timeout.log`` (PF717). The baseline is the floor any reader of the
file pays: the same file read through diagnose's own block reader (decoding, gzip where it is), each block's lines
counted and nothing else, alternated with diagnose in each round so that both see the same machine load.

Usage: ``python bench/diagnose_speed.py [--mb 64] [--repeat 3] [--markdown] [--smoke]``; ``--smoke`` is 2 MB, once.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from preflight.diagnose.log import diagnose_text
from preflight.diagnose.merge import diagnose_path
from preflight.diagnose.reading import log_blocks

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from logs_corpus import CORPUS, corpus_index  # the tests' reader of the corpus index

FAILURE = "vllm-19670-client-timeout.log"


def failure_tail(entries: list[dict[str, Any]]) -> tuple[str, str]:
    """The failure every log ends with, and the code diagnose must name first; it must be a train-split log."""
    (entry,) = [e for e in entries if e["file"] == FAILURE]
    if entry["split"] != "train" or not entry["code"]:
        raise SystemExit(f"{FAILURE} must be a train-split failure with a code")
    return (CORPUS / FAILURE).read_text(encoding="utf-8"), str(entry["code"])


def nccl_init_text(entries: list[dict[str, Any]]) -> str:
    files = sorted(str(e["file"]) for e in entries if e["split"] == "train" and e["cause"] == "healthy")
    return "".join((CORPUS / name).read_text(encoding="utf-8").rstrip("\n") + "\n" for name in files)


def training_steps_text(lines: int = 4000) -> str:
    return "".join(f"[rank{n % 8}]: 2026-11-27 03:{n // 60 % 60:02d}:{n % 60:02d},123 INFO epoch {n // 1000} step {n} "
                   f"loss {2.5 - n / 1e5:.3f} lr 3.0e-04 grad_norm 0.81\n" for n in range(lines))


def write_log(path: Path, unit: str, megabytes: float, tail: str) -> int:
    """unit repeated to the size, then tail; the file's size in bytes."""
    size, data = int(megabytes * 1e6), unit.encode()
    with open(path, "wb") as f:
        for _ in range(max(1, size // len(data))):
            f.write(data)
        f.write(tail.encode())
    return path.stat().st_size


def floor(path: str) -> int:
    """What any reader of the log pays: its blocks, decoded, and their lines counted."""
    return sum(block.count("\n") for block in log_blocks(path))


def timed(run: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    result = run()
    return time.perf_counter() - start, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=64.0, help="size of each log in MB (default 64)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per shape (default 3)")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    parser.add_argument("--smoke", action="store_true", help="2 MB, one round")
    args = parser.parse_args()
    if args.smoke:
        args.mb, args.repeat = 2.0, 1
    if args.mb <= 0 or args.repeat < 1:
        parser.error("--mb must be above 0 and --repeat at least 1")
    entries = corpus_index()
    tail, code = failure_tail(entries)
    diagnose_text(tail)  # the signature table compiled and the catalogue read once, as in any run, before timing
    rows = []
    with tempfile.TemporaryDirectory(prefix="preflight-bench-diagnose-") as folder:
        for shape, unit in (("nccl-init", nccl_init_text(entries)), ("training-steps", training_steps_text())):
            path = Path(folder) / f"{shape}.log"
            size = write_log(path, unit, args.mb, tail)
            floor(str(path))  # the page cache warm for both
            read_s, diagnose_s = [], []
            for _ in range(args.repeat):
                read_s.append(timed(lambda p=str(path): floor(p))[0])
                seconds, result = timed(lambda p=str(path): diagnose_path(p))
                diagnose_s.append(seconds)
                named = [d.code for d in result.diagnoses]  # type: ignore[attr-defined]  # a LogDiagnosis
                if not named or named[0] != code:
                    raise SystemExit(f"{shape}: diagnose named {named or 'nothing'}, not {code} first")
            rows.append((shape, size, statistics.median(read_s), statistics.median(diagnose_s)))
    print(f"machine: {platform.node()} ({platform.machine()}, {len(os.sched_getaffinity(0))} cpus); python "
          f"{platform.python_version()}; {args.repeat} round(s) of each; every log ends in {FAILURE}, named {code} first")
    if args.markdown:
        print("| log | size | read alone (floor) | diagnose | diagnose MB/s | diagnose / floor |\n|---|---|---|---|---|---|")
    for shape, size, read, diagnose in rows:
        cells = (shape, f"{size / 1e6:.1f} MB", f"{read:.2f} s", f"{diagnose:.2f} s", f"{size / 1e6 / diagnose:.1f}",
                 f"{diagnose / read:.1f}x")
        print("| " + " | ".join(cells) + " |" if args.markdown else "  ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
