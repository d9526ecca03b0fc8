"""How well `preflight diagnose` names the cause of the logs people paste: every log of the corpus copied from public
issues (tests/data/logs/corpus), read as a user would read it, against the cause its thread gives.

For each class and split: the logs whose first diagnosis is the thread's cause (right), another code (wrong: worse
than none), or nothing recognized (unknown). Logs that must come out as no known failure (healthy runs, and failures
of the training code itself: CLEAN_CAUSES) are right only when clean. A failure whose cause has no code yet (its index
entry has code null and a note) cannot be right: it is counted apart, as unknown or as named (some code, which is a
wrong cause), and kept out of the recall. The held-out split is what the signatures were not written from: its figures
are the recall docs/benchmarks.md states and tests/test_diagnose_corpus.py holds; train and held-out are reported apart.

Usage: ``python bench/diagnose_corpus.py [--markdown]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from logs_corpus import CLEAN_CAUSES, CORPUS, corpus_index  # the tests' reader of the corpus index

from preflight.diagnose import diagnose_file

OUTCOMES = ("right", "wrong", "unknown")


def outcome(cause: str, expected: str | None, got: str | None) -> str:
    if expected is None and cause not in CLEAN_CAUSES:  # a cause with no code yet: nothing it names can be right
        return "unknown" if got is None else "named"
    if expected is None:
        return "right" if got is None else "wrong"
    return "right" if got == expected else "unknown" if got is None else "wrong"


def cell(table: Counter[tuple[str, str, str]], cause: str, split: str, pending: bool) -> str:
    """One class's figures on one split: right/all (wrong), or for a cause with no code yet, how many were named."""
    if pending:
        named, unknown = table[(cause, split, "named")], table[(cause, split, "unknown")]
        return f"-/{named + unknown} ({named} named a code)"
    return (f"{table[(cause, split, 'right')]}/{sum(table[(cause, split, o)] for o in OUTCOMES)}"
            f" ({table[(cause, split, 'wrong')]} wrong)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print the per-class table as markdown")
    args = parser.parse_args()
    table: Counter[tuple[str, str, str]] = Counter()
    no_code: set[str] = set()  # causes with no code yet
    started = time.perf_counter()
    for entry in corpus_index():
        diagnoses = diagnose_file(str(CORPUS / entry["file"])).diagnoses
        got = diagnoses[0].code if diagnoses else None
        table[(entry["cause"], entry["split"], outcome(entry["cause"], entry["code"], got))] += 1
        if entry["code"] is None and entry["cause"] not in CLEAN_CAUSES:
            no_code.add(entry["cause"])
    seconds = time.perf_counter() - started
    causes = sorted({cause for cause, _, _ in table})
    rows = [(cause, *(cell(table, cause, split, cause in no_code) for split in ("train", "held-out"))) for cause in causes]
    if args.markdown:
        print("| cause | train right/all | held-out right/all |\n|---|---|---|")
        print("\n".join(f"| {cause} | {train} | {held} |" for cause, train, held in rows))
    else:
        print("\n".join(f"{cause:28} train {train:16} held-out {held}" for cause, train, held in rows))
    for split in ("train", "held-out"):
        coded = [c for c in causes if c not in CLEAN_CAUSES and c not in no_code]
        failures = Counter({o: sum(table[(c, split, o)] for c in coded) for o in OUTCOMES})
        clean = "; ".join(f"{c} clean {table[(c, split, 'right')]}/{sum(table[(c, split, o)] for o in OUTCOMES)}"
                          for c in CLEAN_CAUSES)
        pending = Counter({o: sum(table[(c, split, o)] for c in no_code) for o in ("unknown", "named")})
        print(f"{split}: failures right {failures['right']}/{sum(failures.values())}, wrong {failures['wrong']}, "
              f"unknown {failures['unknown']}; {clean}; no code yet {sum(pending.values())} "
              f"(named a code {pending['named']}, unknown {pending['unknown']})")
    print(f"{sum(table.values())} logs read in {seconds:.2f} s")


if __name__ == "__main__":
    main()
