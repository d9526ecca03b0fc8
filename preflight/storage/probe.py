"""preflight's storage test: run on every host at once, as the training user, it tries the job's checkpoint and data
folders the way the job will use them.

Sent to each host as text, joined after the shared helpers (preflight.bundle.STORAGE), and run as
``python3 - CONFIG_JSON`` (standard library only, like the probe), once per round:

- ``write``: for each path, whether it is a folder, its owner and mode, the filesystem under it (type, source and mount
  point from /proc/self/mountinfo, the longest mount point above it), free space and inodes (statvfs), and a file of
  ``write_bytes`` created, written, fsynced, read back (with O_DIRECT, else after POSIX_FADV_DONTNEED, so that the read
  comes from the filesystem rather than this host's page cache where the filesystem allows it), compared, and removed;
  for a shared path, a marker file holding the run's nonce and this host's name, left for the next round.
- ``read``: each shared path's markers, every host's by name (a listing may be cached on a network filesystem; an open
  by name is not, by NFS's close-to-open rule): the hosts whose markers this host can read.
- ``clean``: every host's marker and test file of this run removed, where this host can.

Every file is ``.preflight-<PREFLIGHT_TAG>-<nonce>-<host>.*`` in the path, so the run's reaper
(preflight.transport.reap) removes whatever an interrupt leaves. It prints one JSON object and exits 0; it reports and
never judges (preflight.storage does).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
import sys
import time

from preflight.hostlib.wire import read_config, write_output

# The types of this script's config and output live in preflight/storage/wire.py, for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from preflight.storage.wire import MarkerReport, PathReport, ProbePath, StorageProbeConfig, StorageProbeOutput, WriteTest

CHUNK = 1 << 20  # written and read a MiB at a time; a multiple of every O_DIRECT alignment
MOUNTINFO = "/proc/self/mountinfo"


def file_name(folder: str, nonce: str, host: str, kind: str) -> str:
    tag = "".join(c for c in os.environ.get("PREFLIGHT_TAG", "untagged") if c.isalnum())
    return os.path.join(folder, f".preflight-{tag}-{nonce}-{host}.{kind}")


def unescape(field: str) -> str:
    # mountinfo writes a space, a tab, a newline and a backslash in octal (\040).
    for code in ("\\040", "\\011", "\\012", "\\134"):
        field = field.replace(code, chr(int(code[1:], 8)))
    return field


def mount_of(path: str, mountinfo: str) -> tuple[str, str, str] | None:
    """(type, source, mount point) of the mount holding path: the longest mount point above it, the last one listed
    where several are stacked on the same point."""
    best: tuple[str, str, str] | None = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 2:
            continue
        point = unescape(fields[4])
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[2])):
            best = (tail[0], unescape(tail[1]), point)
    return best


def failed(test: WriteTest, step: str, e: OSError) -> WriteTest:
    test["ok"], test["step"], test["errno"], test["error"] = False, step, errno.errorcode.get(e.errno or 0), e.strerror or str(e)
    return test


def read_back(name: str, size: int, block: bytes, test: WriteTest) -> bool:
    """Read the file back, uncached where the filesystem allows, and compare it with what was written."""
    try:
        return read_once(name, size, block, test, direct=hasattr(os, "O_DIRECT"))
    except OSError as e:
        # A filesystem without O_DIRECT refuses it with EINVAL, at the open or at the first read (FUSE); the file's pages
        # were dropped from the cache after its fsync, so a plain read still comes from the filesystem where it can.
        if e.errno != errno.EINVAL or test["uncached"] == "fadvise":
            raise
        return read_once(name, size, block, test, direct=False)


def read_once(name: str, size: int, block: bytes, test: WriteTest, direct: bool) -> bool:
    began = time.monotonic()
    test["uncached"] = "direct" if direct else "fadvise"
    fd = os.open(name, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    buffer = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT needs
    try:
        done = 0
        while done < size:
            count = os.readv(fd, [buffer])
            if count <= 0:
                break
            if buffer[:count] != block[:count]:
                test["step"], test["error"] = "verify", f"the bytes read back at offset {done} differ from those written"
                return False
            done += count
        if done != size:
            test["step"], test["error"] = "verify", f"{done} bytes read back of {size}"
            return False
    finally:
        buffer.close()
        os.close(fd)
    test["read_s"] = round(time.monotonic() - began, 6)
    return True


def write_test(folder: str, size: int, name: str) -> WriteTest:
    """Create, write, fsync, read back, compare and remove a file of size bytes, timing the write and the read."""
    test: WriteTest = {"ok": False, "step": None, "errno": None, "error": None, "bytes": size, "write_s": None, "read_s": None,
                       "uncached": None}
    block = os.urandom(CHUNK)
    step = "create"
    try:
        began = time.monotonic()
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            step = "write"
            left = size
            while left > 0:
                left -= os.write(fd, block[:min(left, CHUNK)])
            step = "fsync"
            os.fsync(fd)
            test["write_s"] = round(time.monotonic() - began, 6)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        step = "read"
        if not read_back(name, size, block, test):
            return test
        step = "remove"
        os.unlink(name)
        test["ok"] = True
        return test
    except OSError as e:
        return failed(test, step, e)
    finally:
        if step != "create" and os.path.lexists(name):
            with contextlib.suppress(OSError):  # the reaper removes it, by the run's tag
                os.unlink(name)


def examine(entry: ProbePath, config: StorageProbeConfig, mountinfo: str, late: bool) -> PathReport:
    """Every fact of one path, its write test (not when late), and a shared path's marker."""
    path = entry["path"]
    report: PathReport = {"path": path, "exists": False, "is_dir": False, "owner_uid": None, "owner": None, "mode": None, "fstype": None,
                          "source": None, "mount_point": None, "read_only": None, "free_bytes": None, "total_bytes": None,
                          "free_inodes": None, "total_inodes": None, "test": None, "marker": False, "error": None}
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return report
    except OSError as e:
        report["error"] = f"stat: {e.strerror or e}"
        return report
    report["exists"], report["is_dir"] = True, stat.S_ISDIR(info.st_mode)
    report["owner_uid"], report["owner"], report["mode"] = info.st_uid, user_name(info.st_uid), f"{stat.S_IMODE(info.st_mode):04o}"
    if not report["is_dir"]:
        return report
    mount = mount_of(os.path.realpath(path), mountinfo)
    if mount is not None:
        report["fstype"], report["source"], report["mount_point"] = mount
    try:
        fs = os.statvfs(path)
        report["read_only"] = bool(fs.f_flag & os.ST_RDONLY)
        report["free_bytes"], report["total_bytes"] = fs.f_bavail * fs.f_frsize, fs.f_blocks * fs.f_frsize
        report["free_inodes"], report["total_inodes"] = fs.f_favail, fs.f_files
    except OSError as e:
        report["error"] = f"statvfs: {e.strerror or e}"
    if late:
        report["error"] = f"not tested: past the deadline of {config['deadline_s']:g} s"
        return report
    test = report["test"] = write_test(path, entry["write_bytes"], file_name(path, config["nonce"], config["host"], "probe"))
    if entry["shared"] and test["ok"]:
        try:
            marker = file_name(path, config["nonce"], config["host"], "marker")
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, f"{config['nonce']} {config['host']}\n".encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            report["marker"] = True
        except OSError as e:
            report["error"] = f"marker: {e.strerror or e}"
    return report


def markers(entry: ProbePath, config: StorageProbeConfig) -> MarkerReport:
    """The read round: whose markers this host reads. The clean round: every host's marker and test file of this run
    removed where this host can, so that a host that wrote and then stopped answering leaves nothing on a shared path."""
    path = entry["path"]
    out: MarkerReport = {"path": path, "seen": [], "removed": False, "error": None}
    if config["round"] == "clean":
        for host in config["hosts"]:
            for kind in ("marker", "probe"):
                try:
                    os.unlink(file_name(path, config["nonce"], host, kind))
                except FileNotFoundError:
                    pass
                except OSError as e:
                    out["error"] = e.strerror or str(e)
        out["removed"] = out["error"] is None
        return out
    for host in config["hosts"]:
        try:
            with open(file_name(path, config["nonce"], host, "marker"), encoding="utf-8") as f:
                if f.read(200) == f"{config['nonce']} {host}\n":
                    out["seen"].append(host)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ESTALE):
                out["error"] = e.strerror or str(e)
    return out


def user_name(uid: int) -> str | None:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return None


def main(argv: list[str]) -> int:
    config: StorageProbeConfig = read_config(argv)
    began = time.monotonic()
    out: StorageProbeOutput = {"host": config["host"], "round": config["round"], "user": user_name(os.getuid()), "uid": os.getuid(),
                               "paths": [], "markers": [], "elapsed_s": 0.0}
    try:
        with open(MOUNTINFO, encoding="utf-8", errors="replace") as f:
            mountinfo = f.read()
    except OSError:
        mountinfo = ""
    for entry in config["paths"]:
        if config["round"] == "write":
            out["paths"].append(examine(entry, config, mountinfo, late=time.monotonic() - began > config["deadline_s"]))
        else:
            out["markers"].append(markers(entry, config))
    out["elapsed_s"] = round(time.monotonic() - began, 3)
    return write_output(out)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
