"""The storage stage's part of the report (preflight.report_shape.Report's ``storage``), as the exact JSON shapes: each
configured path, and each host's view of it."""

from __future__ import annotations

from typing import Annotated, Literal, TypedDict

from preflight.schema_marks import Amount, Count, Range
from preflight.spread import Spread


class StorageHost(TypedDict):
    """One host's view of one storage path."""

    host: str
    status: Literal["pass", "warn", "fail", "unknown"]  # the worst of its findings on this path
    message: str  # the first of those findings, or what it measured
    user: str | None  # the training user the test ran as
    uid: Count | None
    fstype: str | None  # the filesystem under the path (/proc/self/mountinfo)
    source: str | None  # its mount source: a device, server:/export, tmpfs
    read_only: bool | None
    free_bytes: Count | None  # free for the training user
    total_bytes: Count | None
    free_inodes: Count | None
    total_inodes: Count | None
    write_GBps: Amount | None  # write_bytes written and fsynced
    read_GBps: Amount | None  # read back, past the page cache where the filesystem allows (read_uncached)
    read_uncached: Literal["direct", "fadvise"] | None  # O_DIRECT, or the pages dropped with POSIX_FADV_DONTNEED
    sees: list[str] | None  # a shared path: the hosts whose files this host read; None: not a shared path, or not read


class StoragePathSection(TypedDict):
    """One configured path, from every host."""

    path: str
    shared: bool
    min_free_bytes: Count
    write_bytes: Annotated[int, Range(1)]
    status: Literal["pass", "warn", "fail", "unknown"]
    groups: list[list[str]]  # a shared path: the hosts grouped by which hosts' files they read (one group: shared)
    write_spread: Spread  # the hosts' write figures: median, MAD and the outlier threshold
    read_spread: Spread
    hosts: list[StorageHost]


class StorageSection(TypedDict):
    """The storage stage (schema 6 on): every configured path, tried from every host at once as the training user."""

    timeout_s: Annotated[float, Range(0, above=True)]
    elapsed_s: Amount
    paths: list[StoragePathSection]
