"""Reading a log: text blocks of whole lines from a file, stdin or a folder's files, gzip-compressed or not (a support
bundle: nvidia-bug-report.log.gz, a rotated kern.log.1.gz), refusing binary ones."""

from __future__ import annotations

import codecs
import itertools
import re
import sys
import zlib
from collections.abc import Iterator
from typing import IO

from preflight.errors import InputError

BLOCK_BYTES = 1 << 20
LONGEST_LINE_CHARS = 4 << 20  # a longer line (a progress bar without newlines) is scanned in pieces
_GZIP_MAGIC = b"\x1f\x8b"
# What no text log holds: C0 controls but the whitespace, backspace and ESC (a colour code), DEL, and bytes that are
# not UTF-8 (decoded as U+FFFD). NUL is not among them, see _binary.
_NON_TEXT = re.compile("[\x01-\x07\x0e-\x1a\x1c-\x1f\x7f\ufffd]")
NON_TEXT_SHARE = 0.05  # more than this share of a NUL-holding head, NULs left out, is not text: a binary file


def _binary(head: bytes) -> bool:
    """Whether the file whose first block is head is binary. A real log can hold NULs: torch's DataLoader worker
    writes its "ERROR: Unexpected bus error encountered in worker..." with the string's terminating NUL
    (torch/csrc/DataLoader.cpp's SIGNAL_HANDLER writes sizeof(ERROR_MSG) bytes, in every version since 2017), and a
    node that crashed can leave its log's last blocks as zeros. So a NUL alone does not make a file binary; a head
    that, NULs left out, is empty or not mostly text does (an ELF, a pickle, a checkpoint). A head with no NUL is
    read as text whatever its encoding, as before."""
    if b"\0" not in head:
        return False
    text = head.replace(b"\0", b"").decode("utf-8", errors="replace")
    return not text or len(_NON_TEXT.findall(text)) > NON_TEXT_SHARE * len(text)


def _raw(stream: IO[bytes], source: str) -> Iterator[bytes]:
    while True:
        try:
            chunk = stream.read(BLOCK_BYTES)
        except OSError as e:
            raise InputError(f"diagnose: cannot read {source}: {e.strerror or e}") from None
        if not chunk:
            return
        yield chunk


def _chunks(stream: IO[bytes], source: str) -> Iterator[bytes]:
    """The stream's bytes, BLOCK_BYTES at a time, inflated where it is gzip (member after member, as `zcat` reads
    them); a file cut short gives what it holds."""
    raw = _raw(stream, source)
    first = next(raw, b"")
    if not first.startswith(_GZIP_MAGIC):
        if first:
            yield first
        yield from raw
        return
    inflate = zlib.decompressobj(wbits=31)  # 31: a gzip header and trailer around the deflate stream
    for chunk in itertools.chain([first], raw):
        while chunk:
            try:
                out = inflate.decompress(chunk, BLOCK_BYTES)  # bounded: a small file may inflate a thousandfold
            except zlib.error as e:
                raise InputError(f"diagnose: {source} is not a readable gzip file: {e}") from None
            if out:
                yield out
            if inflate.eof:  # one member done; the next, if any, starts in what is left
                chunk, inflate = inflate.unused_data, zlib.decompressobj(wbits=31)
            else:
                chunk = inflate.unconsumed_tail
    rest = inflate.flush()
    if rest:
        yield rest


def read_blocks(stream: IO[bytes], source: str) -> Iterator[str]:
    """The log as text blocks of whole lines, decoded as UTF-8 (bad bytes replaced) with NULs dropped, inflated first
    where it is gzip; refuses binary files."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    first = True
    for chunk in _chunks(stream, source):
        if first:
            first = False
            if _binary(chunk[:8192]):
                raise InputError(f"diagnose: {source} is a binary file, not a text log")
        pending += decoder.decode(chunk).replace("\0", "")
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
