"""Small readers of the files a host script reads (sysfs, procfs, cgroupfs)."""

from __future__ import annotations

import os


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


def thread_run_delays_ns(tasks: str = "/proc/self/task") -> dict[str, int] | None:
    """Per thread of this process, the nanoseconds it has spent runnable on a run queue, waiting for a CPU (the second field
    of each thread's schedstat: a process's own schedstat counts its first thread only, and gloo moves bytes on threads of
    its own). None where the kernel keeps no such count."""
    try:
        threads = os.listdir(tasks)
    except OSError:
        return None
    delays = {thread: delay for thread in threads if (delay := run_delay_ns(f"{tasks}/{thread}/schedstat")) is not None}
    return delays or None


def run_delay_ns(schedstat: str = "/proc/thread-self/schedstat") -> int | None:
    """The nanoseconds one thread has spent runnable on a run queue, waiting for a CPU: the second field of its schedstat
    file (by default the calling thread's). None where the kernel keeps no such count."""
    fields = (read_text(schedstat) or "").split()
    return int(fields[1]) if len(fields) >= 2 and fields[1].isdigit() else None


def waited_ns(before: dict[str, int] | None, after: dict[str, int] | None) -> int | None:
    """The nanoseconds this process's threads waited for a CPU between two thread_run_delays_ns readings, summed over its
    threads (a thread started in between counts from its start; one ended in between is lost). None: unknown."""
    if before is None or after is None:
        return None
    return sum(max(0, delay - before.get(thread, 0)) for thread, delay in after.items())
