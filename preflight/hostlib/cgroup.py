"""This process's CPU cgroup: the quota that bounds it (the facts probe) and the time that quota held it back (the
collective's worker), read from one walk of its cgroup folders."""

from __future__ import annotations

import os

from preflight.hostlib.files import read_int, read_text


def cgroup_folders(mount: str, path: str) -> list[str]:
    """A cgroup's folder under the hierarchy mounted at mount, then the folder of every group above it up to the mount."""
    parts = [part for part in path.split("/") if part]
    return [os.path.join(mount, *parts[:n]) for n in range(len(parts), -1, -1)]


def cpu_cgroup_folders(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> list[tuple[int, str]]:
    """This process's CPU cgroup folders that exist, its own group first and then every group above it up to the
    hierarchy's root: (1, folder) under cgroup v1's cpu controller, (2, folder) under v2. Inside a container whose
    /proc/self/cgroup names a path its /sys does not have (no cgroup namespace), the walk up reaches the container's own
    group, mounted as the root: reading the named path alone would find nothing there."""
    text = read_text(proc_cgroup)
    found: list[tuple[int, str]] = []
    for line in (text or "").splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if "cpu" in controllers.split(","):
            mount = next((m for m in (f"{root}/cpu", f"{root}/cpu,cpuacct") if os.path.isdir(m)), None)
            found += [(1, folder) for folder in (cgroup_folders(mount, path) if mount else []) if os.path.isdir(folder)]
        elif controllers == "":
            found += [(2, folder) for folder in cgroup_folders(root, path) if os.path.isdir(folder)]
    return found


def cgroup_cpu_quota(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> float | None:
    """The CPUs this process's cgroup quota lets it use: the smallest quota / period from its own group up to the
    hierarchy's root, as a parent's quota throttles every group under it (cgroup v1's cpu.cfs_quota_us over
    cpu.cfs_period_us, v2's cpu.max). None where no group on the way sets one. A container's CPU limit is such a quota."""
    limits: list[float] = []
    for version, folder in cpu_cgroup_folders(proc_cgroup, root):
        if version == 1:
            quota, period = read_int(f"{folder}/cpu.cfs_quota_us"), read_int(f"{folder}/cpu.cfs_period_us")
            if quota is not None and quota > 0 and period:
                limits.append(quota / period)
        else:
            quota_text, _, period_text = (read_text(f"{folder}/cpu.max") or "").partition(" ")
            if quota_text.isdigit() and period_text.isdigit() and int(period_text):
                limits.append(int(quota_text) / int(period_text))
    return min(limits) if limits else None


def cgroup_throttled_s(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> float | None:
    """Seconds this process's CPU cgroup has been held back by its quota so far (cgroup v1 cpu.stat's throttled_time, v2's
    throttled_usec), from the nearest group of the walk whose cpu.stat counts it; None where none does. A quota (a
    container's CPU limit, a cgroup's cfs_quota_us) shows here whatever else loads the host: the compute probe says how
    much of its time the quota took."""
    for _, folder in cpu_cgroup_folders(proc_cgroup, root):
        lines = (read_text(os.path.join(folder, "cpu.stat")) or "").splitlines()
        stat = dict(pair for pair in (line.split() for line in lines) if len(pair) == 2)
        try:
            if "throttled_time" in stat:
                return int(stat["throttled_time"]) / 1e9
            if "throttled_usec" in stat:
                return int(stat["throttled_usec"]) / 1e6
        except ValueError:
            continue
    return None
