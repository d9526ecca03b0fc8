"""CPU and block I/O cgroups for the sandbox's throttled hosts (Faults.throttle_cpu, Faults.throttle_io): a CFS quota, or
a bytes-per-second limit on one block device, on the processes of one host.

cgroup v1's ``cpu`` controller where it is mounted (``/sys/fs/cgroup/cpu``: ``cpu.cfs_period_us`` and
``cpu.cfs_quota_us``), else cgroup v2's ``cpu.max`` under ``/sys/fs/cgroup``. A host's group is
``preflight-sandbox-<its namespace>`` in the controller's root, so teardown finds (and removes) it by name. Block I/O:
cgroup v1's ``blkio`` controller (``blkio.throttle.read_bps_device`` and ``write_bps_device``), else cgroup v2's
``io.max``; it limits what reaches the device (direct I/O, and the writeback a process's own fsync starts), not the page
cache.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterable
from pathlib import Path

from preflight.errors import EnvironmentProblem

V1_ROOT = Path("/sys/fs/cgroup/cpu")
V2_ROOT = Path("/sys/fs/cgroup")
BLKIO_V1_ROOT = Path("/sys/fs/cgroup/blkio")
PERIOD_US = 100_000
_NAME = "preflight-sandbox-{netns}"


def _root(v1_file: Path, v2_controller: str) -> tuple[Path, int]:
    """A controller's root and its cgroup version: v1 where its file exists, else v2 where the controller is enabled."""
    if v1_file.exists():
        return v1_file.parent, 1
    controllers = V2_ROOT / "cgroup.controllers"
    if controllers.exists() and v2_controller in controllers.read_text(encoding="utf-8").split():
        return V2_ROOT, 2
    raise EnvironmentProblem(f"sandbox: no cgroup {v2_controller} controller (neither {v1_file.parent} nor cgroup v2's {v2_controller})")


def cpu_root() -> tuple[Path, int]:
    """The cpu controller's root and its cgroup version; EnvironmentProblem when this machine has none writable."""
    return _root(V1_ROOT / "cpu.cfs_quota_us", "cpu")


def io_root() -> tuple[Path, int]:
    """The block I/O controller's root and its cgroup version; EnvironmentProblem when this machine has none writable."""
    return _root(BLKIO_V1_ROOT / "blkio.throttle.read_bps_device", "io")


def throttle_io(netns: str, device: str, bytes_per_s: int) -> Path:
    """Create (or retune) the block I/O cgroup of the host with this network namespace, reading and writing the device
    (MAJOR:MINOR) at most bytes_per_s."""
    root, version = io_root()
    path = root / _NAME.format(netns=netns)
    if version == 2:
        with contextlib.suppress(OSError):
            (root / "cgroup.subtree_control").write_text("+io", encoding="utf-8")
    path.mkdir(exist_ok=True)
    if version == 1:
        (path / "blkio.throttle.read_bps_device").write_text(f"{device} {bytes_per_s}", encoding="utf-8")
        (path / "blkio.throttle.write_bps_device").write_text(f"{device} {bytes_per_s}", encoding="utf-8")
    else:
        (path / "io.max").write_text(f"{device} rbps={bytes_per_s} wbps={bytes_per_s}", encoding="utf-8")
    return path


def group_path(netns: str) -> Path:
    """Where the cgroup of the host with this network namespace is (or would be)."""
    return cpu_root()[0] / _NAME.format(netns=netns)


def throttle(netns: str, percent: float | None) -> Path:
    """Create (or retune) the cgroup of the host with this network namespace, with a quota of percent of one CPU (None:
    no quota, the processes in it run as they would outside)."""
    root, version = cpu_root()
    path = root / _NAME.format(netns=netns)
    quota = -1 if percent is None else max(1000, int(PERIOD_US * percent / 100))
    if version == 2:
        with contextlib.suppress(OSError):  # already enabled, or enabled by whoever manages the tree
            (root / "cgroup.subtree_control").write_text("+cpu", encoding="utf-8")
    path.mkdir(exist_ok=True)
    if version == 1:
        (path / "cpu.cfs_period_us").write_text(str(PERIOD_US), encoding="utf-8")
        (path / "cpu.cfs_quota_us").write_text(str(quota), encoding="utf-8")
    else:
        (path / "cpu.max").write_text(f"{'max' if quota < 0 else quota} {PERIOD_US}", encoding="utf-8")
    return path


def move(path: Path, pids: Iterable[int]) -> list[int]:
    """Move each process (all its threads) into the cgroup at path; the ones moved (a process gone is passed over)."""
    moved = []
    for pid in pids:
        try:
            (path / "cgroup.procs").write_text(str(pid), encoding="utf-8")
        except (ProcessLookupError, OSError):
            continue
        moved.append(pid)
    return moved


def release(path: Path) -> None:
    """Move every process of the cgroup back to the controller's root and remove the cgroup."""
    if not path.exists():
        return
    deadline = time.monotonic() + 5
    while True:
        try:
            pids = [int(p) for p in (path / "cgroup.procs").read_text(encoding="utf-8").split()]
        except FileNotFoundError:
            return
        move(path.parent, pids)
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:  # EBUSY: a process forked into it meanwhile
            if time.monotonic() > deadline:
                raise EnvironmentProblem(f"sandbox: could not remove the cgroup {path}: {e}") from None
            time.sleep(0.05)


def groups_of(prefix: str) -> list[Path]:
    """The cgroups (CPU and block I/O) of sandbox prefix's hosts that exist."""
    pattern = re.compile(rf"^{re.escape(_NAME.format(netns=prefix))}-h[0-9]+$")
    found: set[Path] = set()
    for controller in (cpu_root, io_root):
        try:
            root = controller()[0]
        except EnvironmentProblem:
            continue
        found.update(p for p in root.iterdir() if p.is_dir() and pattern.match(p.name))
    return sorted(found)
