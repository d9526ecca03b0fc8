"""What preflight/storage/probe.py reads and prints, typed: its config (written by preflight.storage.stage) and its one
JSON object of output per round (read by preflight.storage.judge). probe.py is shipped to hosts as one file: it
imports these for the type checker only, so that a host needs nothing but the script."""

from __future__ import annotations

from typing import Literal, TypedDict

Round = Literal["write", "read", "clean"]


class ProbePath(TypedDict):
    path: str
    shared: bool
    write_bytes: int


class StorageProbeConfig(TypedDict):
    host: str  # this host's name in the cluster config: it names this host's files
    round: Round  # write: every check and this host's marker; read: the hosts' markers; clean: remove the run's files
    nonce: str  # this run's stage: its files' names and the markers' content
    hosts: list[str]  # every host of the stage, whose markers a shared path should show
    paths: list[ProbePath]
    deadline_s: float  # no path is started after this long


class WriteTest(TypedDict):
    ok: bool
    step: str | None  # what failed: create, write, fsync, read, verify, remove
    errno: str | None  # its errno's name, e.g. EACCES
    error: str | None  # its message
    bytes: int  # written and read back
    write_s: float | None  # open, write, fsync, close
    read_s: float | None  # open, read, close, with the page cache left out where the filesystem lets it
    uncached: Literal["direct", "fadvise"] | None  # how the read avoided the cache: O_DIRECT, else POSIX_FADV_DONTNEED


class PathReport(TypedDict):
    path: str
    exists: bool
    is_dir: bool
    owner_uid: int | None
    owner: str | None  # the owner's user name, as this host names it
    mode: str | None  # the folder's permission bits, e.g. 0700
    fstype: str | None  # from /proc/self/mountinfo, the longest mount point above the path
    source: str | None  # the mount's source: a device, server:/export, tmpfs
    mount_point: str | None
    read_only: bool | None  # mounted read-only (statvfs's ST_RDONLY)
    free_bytes: int | None  # free for an unprivileged user (f_bavail)
    total_bytes: int | None
    free_inodes: int | None  # f_favail; a filesystem without inode counts says 0 of 0
    total_inodes: int | None
    test: WriteTest | None  # None: not run (no folder, out of time)
    marker: bool  # a shared path: this host's marker was written
    error: str | None  # why the path could not be examined


class MarkerReport(TypedDict):
    path: str
    seen: list[str]  # the read round: the hosts whose markers this host read, with this run's nonce
    removed: bool  # the clean round: the run's files are gone from the path, as far as this host can tell
    error: str | None


class StorageProbeOutput(TypedDict):
    host: str
    round: Round
    user: str | None  # the user the script ran as, as the host names it
    uid: int
    paths: list[PathReport]  # the write round's
    markers: list[MarkerReport]  # the read and clean rounds', one per path given
    elapsed_s: float
