"""Reading a log: text blocks of whole lines from a file, stdin or a folder's files, refusing binary and compressed ones."""

from __future__ import annotations

import codecs
import sys
from collections.abc import Iterator
from typing import IO

from preflight.errors import InputError

BLOCK_BYTES = 1 << 20
LONGEST_LINE_CHARS = 4 << 20  # a longer line (a progress bar without newlines) is scanned in pieces
_GZIP_MAGIC = b"\x1f\x8b"


def read_blocks(stream: IO[bytes], source: str) -> Iterator[str]:
    """The log as text blocks of whole lines, decoded as UTF-8 (bad bytes replaced); refuses binary and compressed files."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    first = True
    while True:
        try:
            chunk = stream.read(BLOCK_BYTES)
        except OSError as e:
            raise InputError(f"diagnose: cannot read {source}: {e.strerror or e}") from None
        if first:
            first = False
            if chunk.startswith(_GZIP_MAGIC):
                raise InputError(f"diagnose: {source} is gzip-compressed; decompress it first (zcat {source} | preflight diagnose -)")
            if b"\0" in chunk[:8192]:
                raise InputError(f"diagnose: {source} is a binary file, not a text log")
        if not chunk:
            break
        pending += decoder.decode(chunk)
        cut = pending.rfind("\n") + 1
        if cut == 0 and len(pending) > LONGEST_LINE_CHARS:
            cut = len(pending)
        if cut:
            yield pending[:cut]
            pending = pending[cut:]
    pending += decoder.decode(b"", final=True)
    if pending:
        yield pending


def log_blocks(path: str) -> Iterator[str]:
    """The blocks of the log at path (``-`` for stdin)."""
    if path == "-":
        yield from read_blocks(sys.stdin.buffer, "stdin")
        return
    try:
        stream = open(path, "rb")  # noqa: SIM115 - closed below; the error has to be told apart from a read error
    except OSError as e:
        raise InputError(f"diagnose: cannot open {path}: {e.strerror or e}") from None
    with stream:
        yield from read_blocks(stream, path)
