"""preflight diagnose: a failed job's log (or a folder of its per-rank logs, or its flight recorder dumps) mapped to
known causes as finding codes with the catalogue's cause and fix, root cause first.

scan.py: the error signatures (playbooks/signatures.yaml); progress.py: hangs that print no error; versions.py:
versions and settings the log names, against the denylist and pins; flight_recorder.py: torch's dumps (the only part
that imports torch); merge.py: a folder of logs as one job; timeline.py: the
times its errors were printed (the first failure across ranks); reading.py: blocks of a file; log.py: the result.
"""

from __future__ import annotations

from preflight.diagnose.log import LogDiagnosis, LogReader, diagnose_file, diagnose_text
from preflight.diagnose.merge import diagnose_folder, diagnose_path
from preflight.diagnose.reading import read_blocks
from preflight.diagnose.scan import (
    EXCERPT_CHARS,
    TIERS,
    Diagnosis,
    Excerpt,
    Scanner,
    Signature,
    SignatureTable,
    load_signatures,
    parse_signatures,
    signature_codes,
)

__all__ = [
    "EXCERPT_CHARS", "TIERS", "Diagnosis", "Excerpt", "LogDiagnosis", "LogReader", "Scanner", "Signature", "SignatureTable",
    "diagnose_file", "diagnose_folder", "diagnose_path", "diagnose_text", "load_signatures", "parse_signatures",
    "read_blocks", "signature_codes",
]
