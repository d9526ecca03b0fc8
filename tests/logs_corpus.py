"""The corpus of failure and healthy logs copied from public issues (tests/data/logs/corpus): its index, and the fixed
rule that splits it into the logs signatures are written from (train) and the logs that are only measured (held-out)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

CORPUS = Path(__file__).resolve().parent / "data" / "logs" / "corpus"
HELD_OUT_EVERY = 3  # a source whose SHA-256, read as a number, divides by this is held out: about a third
# Causes whose logs must come out as no known failure: a working run, and a failure of the training code or its Python
# packages (diagnose names the cluster's faults; blaming them for a bug in the script is a wrong cause).
CLEAN_CAUSES = ("healthy", "user-code")


def split_of(source: str) -> str:
    """The split of a log, from its source alone (every log of one thread falls on the same side)."""
    digest = int(hashlib.sha256(source.encode("utf-8")).hexdigest(), 16)
    return "held-out" if digest % HELD_OUT_EVERY == 0 else "train"


def corpus_index() -> list[dict[str, Any]]:
    """The entries of corpus/index.yaml: file, source, cause, code, evidence, split, and note where code is None for a
    failure (a cause with no code yet, or a clean cause's failure of the training code)."""
    with open(CORPUS / "index.yaml", encoding="utf-8") as f:
        entries: list[dict[str, Any]] = yaml.safe_load(f)["logs"]
    return entries
