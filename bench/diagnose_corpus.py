"""How well `preflight diagnose` names the cause of the logs people paste: every log of the corpus copied from public
issues (tests/data/logs/corpus), read as a user would read it, against the cause its thread gives.

For each class and split: the logs whose first diagnosis is the thread's cause (right), another code (wrong: worse
than none), or nothing recognized (unknown); healthy logs must come out as no known failure. The held-out split is
what the signatures were not written from: its figures are the recall docs/benchmarks.md states and
tests/test_diagnose_corpus.py holds.

Usage: ``python bench/diagnose_corpus.py [--markdown]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from logs_corpus import CORPUS, corpus_index  # the tests' reader of the corpus index

from preflight.diagnose import diagnose_file

OUTCOMES = ("right", "wrong", "unknown")


def outcome(expected: str | None, got: str | None) -> str:
    if expected is None:
        return "right" if got is None else "wrong"
    return "right" if got == expected else "unknown" if got is None else "wrong"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print the per-class table as markdown")
    args = parser.parse_args()
    table: Counter[tuple[str, str, str]] = Counter()
    started = time.perf_counter()
    for entry in corpus_index():
        diagnoses = diagnose_file(str(CORPUS / entry["file"])).diagnoses
        table[(entry["cause"], entry["split"], outcome(entry["code"], diagnoses[0].code if diagnoses else None))] += 1
    seconds = time.perf_counter() - started
    causes = sorted({cause for cause, _, _ in table})
    rows = [(cause, *(f"{table[(cause, split, 'right')]}/{sum(table[(cause, split, o)] for o in OUTCOMES)}"
                      f" ({table[(cause, split, 'wrong')]} wrong)" for split in ("train", "held-out"))) for cause in causes]
    if args.markdown:
        print("| cause | train right/all | held-out right/all |\n|---|---|---|")
        print("\n".join(f"| {cause} | {train} | {held} |" for cause, train, held in rows))
    else:
        print("\n".join(f"{cause:28} train {train:16} held-out {held}" for cause, train, held in rows))
    for split in ("train", "held-out"):
        failures = Counter({o: sum(table[(c, split, o)] for c in causes if c != "healthy") for o in OUTCOMES})
        healthy = sum(table[("healthy", split, o)] for o in OUTCOMES)
        print(f"{split}: failures right {failures['right']}/{sum(failures.values())}, wrong {failures['wrong']}, "
              f"unknown {failures['unknown']}; healthy clean {table[('healthy', split, 'right')]}/{healthy}")
    print(f"{sum(table.values())} logs read in {seconds:.2f} s")


if __name__ == "__main__":
    main()
