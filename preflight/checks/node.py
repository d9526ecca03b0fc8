"""Per-host checks of the node's resources (PF2xx): its GPUs, memlock, /dev/shm, GPUs already in use."""

from __future__ import annotations

from collections.abc import Iterator

from preflight.checks.registry import ClusterView, host_check, host_finding
from preflight.findings import Finding, Status
from preflight.records import HostRecord, has_driver


def gib(n: int) -> str:
    """Bytes as a short human size."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{n}B"



@host_check("PF201")
def gpu_count(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """The host has the GPUs the cluster config expects."""
    found = len(record.facts["gpu"]["devices"])
    expected = record.host.gpus
    if expected == "auto":
        if has_driver(record.facts):
            yield host_finding("PF201", Status.passed, record, f"{found} GPU(s) found (none expected in particular)")
        return
    want = int(expected)
    if found == want:
        yield host_finding("PF201", Status.passed, record, f"{found} GPU(s), as expected")
    elif has_driver(record.facts) or want > 0:
        yield host_finding("PF201", Status.fail, record, f"{found} GPU(s) found, {want} expected",
                           "check `nvidia-smi -L` and `dmesg` for GPUs that fell off the bus (Xid 79), or fix cluster.hosts[].gpus")


@host_check("PF202")
def memlock(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """With InfiniBand, a limited memlock stops NCCL registering memory."""
    if not record.facts["net"]["infiniband"]:
        return
    limit = record.facts["resources"]["memlock"]
    if limit == "unlimited":
        yield host_finding("PF202", Status.passed, record, "memlock is unlimited")
    else:
        shown = "unknown" if limit is None else gib(limit)
        yield host_finding("PF202", Status.warn, record, f"memlock limited to {shown} with InfiniBand present",
                           "set `ulimit -l unlimited` (limits.conf, or --ulimit memlock=-1 in containers)")


@host_check("PF203")
def dev_shm(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """/dev/shm holds NCCL's shared-memory buffers and DataLoader batches."""
    size = record.facts["resources"]["dev_shm_bytes"]
    minimum = view.config.thresholds.dev_shm_min_bytes
    if size is None:
        yield host_finding("PF203", Status.fail, record, "/dev/shm is missing",
                           "mount a tmpfs on /dev/shm (containers: --shm-size=16g or --ipc=host)")
    elif size < minimum:
        yield host_finding("PF203", Status.fail, record, f"/dev/shm {gib(size)} < {gib(minimum)}",
                           "enlarge /dev/shm (Docker: --shm-size=16g or --ipc=host; Kubernetes: an emptyDir with medium Memory)",
                           # NCCL then avoids /dev/shm; a gloo job has no such switch.
                           {"NCCL_SHM_DISABLE": "1"} if view.uses_gpus else None)
    else:
        yield host_finding("PF203", Status.passed, record, f"/dev/shm {gib(size)} >= {gib(minimum)}")


@host_check("PF204", "PF205")
def gpu_occupancy(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """GPUs start the job empty: no memory held, no other compute processes."""
    limit = view.config.thresholds.gpu_memory_used_max_fraction
    for gpu in record.facts["gpu"]["devices"]:
        used, total = gpu["memory_used_bytes"], gpu["memory_total_bytes"]
        if used is not None and total:
            if used > limit * total:
                yield host_finding("PF204", Status.fail, record,
                                   f"GPU {gpu['index']}: {gib(used)} of {gib(total)} memory already in use",
                                   "stop the process holding it (`nvidia-smi --query-compute-apps=pid,used_memory --format=csv`)")
            else:
                yield host_finding("PF204", Status.passed, record, f"GPU {gpu['index']}: {gib(used)} of {gib(total)} in use")
        processes = gpu["processes"]
        if processes:
            listed = ", ".join(f"{p['pid']} ({p['name'] or '?'})" for p in processes[:4])
            yield host_finding("PF205", Status.warn, record, f"GPU {gpu['index']}: {len(processes)} other compute process(es): {listed}",
                               "make sure no earlier job is still running on this GPU")
