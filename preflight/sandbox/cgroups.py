"""CPU cgroups for the sandbox's throttled hosts (Faults.throttle_cpu): a CFS quota on the processes of one host.

cgroup v1's ``cpu`` controller where it is mounted (``/sys/fs/cgroup/cpu``: ``cpu.cfs_period_us`` and
``cpu.cfs_quota_us``), else cgroup v2's ``cpu.max`` under ``/sys/fs/cgroup``. A host's group is
``preflight-sandbox-<its namespace>`` in the controller's root, so teardown finds (and removes) it by name.
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
PERIOD_US = 100_000
_NAME = "preflight-sandbox-{netns}"


def cpu_root() -> tuple[Path, int]:
    """The cpu controller's root and its cgroup version; EnvironmentProblem when this machine has none writable."""
    if (V1_ROOT / "cpu.cfs_quota_us").exists():
        return V1_ROOT, 1
    controllers = V2_ROOT / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text(encoding="utf-8").split():
        return V2_ROOT, 2
    raise EnvironmentProblem("sandbox: no cgroup cpu controller (neither /sys/fs/cgroup/cpu nor cgroup v2's cpu)")


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
    """The cgroups of sandbox prefix's hosts that exist."""
    try:
        root = cpu_root()[0]
    except EnvironmentProblem:
        return []
    pattern = re.compile(rf"^{re.escape(_NAME.format(netns=prefix))}-h[0-9]+$")
    return sorted(p for p in root.iterdir() if p.is_dir() and pattern.match(p.name))
