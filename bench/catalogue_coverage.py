"""How much of what the sources print on failure `preflight diagnose` reads: every message of the catalogue
(tests/data/messages) at an error level, printed as its library prints it in every recorded wording, against the
signatures' patterns (playbooks/signatures.yaml) and, for the driver's kernel lines, the kernel-log reader.

A message counts as read when a signature's pattern matches one of its printed lines. INFO lines are left out (NCCL's
INFO messages are the failure-word ones, mostly retries and fallbacks NCCL goes on from). A CUDA runtime error string
is also tried as torch prints it ("CUDA error: %s"), since the bare string alone is often too common to read.

Usage: ``python bench/catalogue_coverage.py [--unread SOURCE] [--markdown]`` (--unread lists a source's messages no
signature reads; --markdown prints the table for docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from messages_catalogue import catalogue, printed_lines  # the tests' reader of the catalogue

from preflight import bundle
from preflight.diagnose import load_signatures

LEFT_OUT_LEVELS = ("INFO",)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unread", metavar="SOURCE", help="list the error messages of SOURCE that no signature reads")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = parser.parse_args()
    patterns = [p for s in load_signatures().signatures for p in s.patterns]
    probe = bundle.load(bundle.FACTS)
    read: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for name, data in catalogue().items():
        for message in data["messages"]:
            levels = {w.get("level", message.get("level")) for w in message["wordings"]}
            if levels <= set(LEFT_OUT_LEVELS):
                continue
            lines = [line for w in message["wordings"] for line in printed_lines(data, message, w)]
            if name == "cuda-runtime":
                lines += [f"RuntimeError: CUDA error: {line}" for line in lines]
            matched = any(p.search(line) for p in patterns for line in lines)
            if message.get("reader") == "xid" or name == "nvidia-driver":
                matched = matched or any(probe.xid_events([line], None, 0.0)[0] for line in lines)
            total[name] += 1
            read[name] += matched
            if not matched and args.unread == name:
                print(f"  {message['id']}: {message['wordings'][-1]['format'][:120]!r}")
    rows = [(name, read[name], total[name]) for name in sorted(total)]
    rows.append(("all", sum(read.values()), sum(total.values())))
    if args.markdown:
        print("| source | error messages read | of |\n|---|---|---|")
        for name, count, of in rows:
            print(f"| {name} | {count} | {of} |")
        return
    for name, count, of in rows:
        print(f"{name:18} {count:5}/{of:<5} read")


if __name__ == "__main__":
    main()
