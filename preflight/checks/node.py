"""Per-host checks of the node's resources (PF2xx): its GPUs, memlock, /dev/shm, GPUs already in use, its CPU quota, its
open-file limit, its temporary folder."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from statistics import median

from preflight.checks.registry import ClusterView, cross_check, host_check, host_finding
from preflight.findings import CLUSTER, Finding, Status
from preflight.launch import nproc_per_node
from preflight.records import HostRecord, has_driver
from preflight.spec import Backend


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


@host_check("PF207")
def ranks_per_gpu(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """On NCCL each rank needs a GPU of its own: a host given more ranks per host than it has GPUs fails its launch in
    init ("CUDA error: invalid device ordinal", or NCCL's "Duplicate GPU detected" where every rank took cuda:0), which
    the collective would otherwise report as a network or hardware failure. Seen on a one-GPU H100 host with
    training.nproc_per_node=2 (2026-11-27)."""
    if view.backend != Backend.nccl or not has_driver(record.facts):
        return
    ranks = nproc_per_node(view.config, view.backend, [record])
    found = len(record.facts["gpu"]["devices"])
    if ranks > found:
        yield host_finding("PF207", Status.fail, record,
                           f"{ranks} rank(s) per host (training.nproc_per_node) but {found} GPU(s): NCCL needs a GPU for each rank",
                           "set training.nproc_per_node to the GPU count (or auto), or bring back the missing GPUs")
    else:
        yield host_finding("PF207", Status.passed, record, f"{ranks} rank(s) per host on {found} GPU(s)")


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


@host_check("PF208")
def open_file_limit(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """Every DataLoader worker's tensor reaches its rank as a file descriptor, and every peer's socket is one: a soft
    limit of 1024 runs them out (EMFILE, "Too many open files"). Facts probed before the limit was read say nothing."""
    resources = record.facts["resources"]
    if "nofile" not in resources:
        return
    limit, minimum = resources["nofile"], view.config.thresholds.nofile_min
    if limit is None:  # a warning, as a low limit is: no reason to leave the whole run incomplete
        yield host_finding("PF208", Status.warn, record, "the open-file limit could not be read", "run `ulimit -n` on the host")
    elif limit == "unlimited" or int(limit) >= minimum:
        yield host_finding("PF208", Status.passed, record, f"open-file limit {limit} (at least {minimum})")
    else:
        yield host_finding("PF208", Status.warn, record,
                           f"open-file limit {limit}, under {minimum} (thresholds.nofile_min): DataLoader workers and "
                           f"NCCL's sockets can run out of descriptors (\"Too many open files\")",
                           "raise the soft limit where jobs start: `ulimit -n 1048576`, LimitNOFILE= for a service, "
                           "nofile in limits.conf, --ulimit nofile= for a container (`preflight explain PF208`)")


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


# Fewer free inodes than this cannot take a job's files: in the temporary folder torchrun's log folder and a file per rank
# in it, torch.compile's cache (a file per compiled kernel); in a checkpoint folder a sharded checkpoint's file per rank
# and more (PF209 here, PF905 in the storage stage).
MIN_FREE_INODES = 1024


@host_check("PF209")
def temp_folder(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """The temporary folder the job's processes get (TMPDIR, else /tmp) has room: torchrun makes its log folder there and
    torch.compile its cache (/tmp/torchinductor_USER, growing with every compile), and a full one fails them with ENOSPC ("No space
    left on device") as the job starts, on that host only. Facts probed before it was read say nothing."""
    resources = record.facts["resources"]
    if "tmp" not in resources:
        return
    tmp, minimum = resources["tmp"], view.config.thresholds.tmp_min_free_bytes
    if tmp is None:
        yield host_finding("PF209", Status.fail, record, "no temporary folder this user may write in ($TMPDIR, /tmp, /var/tmp, /usr/tmp)",
                           "create /tmp (mode 1777) or point TMPDIR at a folder the training user may write in")
        return
    path, free, total = tmp["path"], tmp["free_bytes"], tmp["total_bytes"]
    if total and free < minimum:
        yield host_finding("PF209", Status.fail, record,
                           f"{path}: {gib(free)} free of {gib(total)}, under {gib(minimum)} (thresholds.tmp_min_free_bytes)",
                           f"free space in {path} (old torchinductor_*, torchelastic_* and core files), or point TMPDIR "
                           f"where jobs start at a larger filesystem (`preflight explain PF209`)")
    elif tmp["total_inodes"] and tmp["free_inodes"] < MIN_FREE_INODES:
        yield host_finding("PF209", Status.fail, record, f"{path}: {tmp['free_inodes']} free inodes of {tmp['total_inodes']}",
                           f"remove small files from {path}, or point TMPDIR where jobs start at another filesystem")
    else:
        yield host_finding("PF209", Status.passed, record,
                           f"{path}: {gib(free)} free of {gib(total)}" if total else f"{path}: a filesystem with no size to judge")


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


@cross_check("PF206")
def cpu_quota(records: Sequence[HostRecord], view: ClusterView) -> Iterator[Finding]:
    """A host whose cgroup quota holds its processes to a fraction of a CPU per rank, or far below what the other hosts
    get, paces every step of the job: each rank feeds its GPU (or, on gloo, moves every byte) from its CPU. Read from
    the quota itself, before any launch: a launch would only wait on the host's slow start, and blame the network."""
    ranks = nproc_per_node(view.config, view.backend, records)
    fraction = view.config.thresholds.cpu_quota_min_fraction
    # What each host's processes may use: its CPUs, or fewer where a quota holds them back.
    usable = {r.host.name: min(known) for r in records
              if (known := [x for x in (r.facts["resources"].get("cpus"), r.facts["resources"].get("cpu_quota")) if x is not None])}
    typical = median(usable.values()) if usable else 0.0
    quotas = {r.host.name: q for r in records if (q := r.facts["resources"].get("cpu_quota")) is not None}
    for record in records:
        quota = quotas.get(record.host.name)
        if quota is None:
            continue
        why = []
        if quota < ranks:
            why.append(f"less than one CPU for each of its {ranks} rank(s)")
        if quota < fraction * typical:
            why.append(f"under {fraction:g} of the {typical:g} CPU(s) the median host's processes get")
        if why:
            yield host_finding("PF206", Status.fail, record, f"its cgroup's CPU quota allows {quota:.3g} CPU(s): " + " and ".join(why),
                               "raise the quota (cpu.max, cpu.cfs_quota_us; a container's --cpus, a pod's CPU limit) or leave "
                               "the host out (launch.exclude_failed=true)")
    if usable:
        yield Finding("PF206", Status.passed, CLUSTER, f"CPU quota: checked on {len(usable)} host(s), {len(quotas)} under a quota; "
                      f"the median host's processes get {typical:g} CPU(s)")
