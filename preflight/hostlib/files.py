"""Small readers of the files a host script reads (sysfs, procfs, cgroupfs)."""

from __future__ import annotations


def read_text(path: str) -> str | None:
    """The stripped text of a small file, or None when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:  # also EINVAL, which sysfs gives for a value the device does not have (a down link's speed)
        return None


def read_int(path: str) -> int | None:
    """An integer file (decimal, or hex with 0x), or None."""
    text = read_text(path)
    try:
        return int(text, 16 if text.startswith("0x") else 10) if text else None
    except ValueError:
        return None
