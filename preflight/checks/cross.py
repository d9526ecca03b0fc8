"""Cross-host checks: every reached host's facts compared; the odd host out, where most hosts agree, is failed itself."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence

from preflight.checks.registry import ClusterView, cross_check
from preflight.checks.versions import COMPONENTS, GPU_COMPONENTS, LABELS
from preflight.facts import HostFacts
from preflight.findings import CLUSTER, Finding, Status
from preflight.records import HostRecord, find_interface
from preflight.spec import Backend

# Variables whose differences between hosts change how NCCL/torch behave.
_TUNING_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "GLOO_")


def _odd_ones_out(values: Mapping[str, object]) -> tuple[object, list[str]] | None:
    """When hosts disagree: the most common value (the first seen of those tied) and the hosts that differ from it."""
    counts = Counter(repr(v) for v in values.values())
    if len(counts) <= 1:
        return None
    majority_repr = counts.most_common(1)[0][0]
    majority = next(v for v in values.values() if repr(v) == majority_repr)
    return majority, sorted(name for name, v in values.items() if repr(v) != majority_repr)


def same_everywhere(code: str, what: str, values: Mapping[str, object], remedy: str) -> Iterator[Finding]:
    """Pass on the cluster when every host has the same value. When more than half the hosts share one, each host that
    differs fails on its own (the others agree, so it is the fault, and emit-launch can leave it out); with no such
    majority (two hosts, an even split) nothing says which side is wrong, and one failure on the cluster names them."""
    odd = _odd_ones_out(values)
    if odd is None:
        yield Finding(code, Status.passed, CLUSTER, f"{what}: {next(iter(values.values()))} on all {len(values)} hosts")
        return
    common, hosts = odd
    agree = len(values) - len(hosts)
    if agree * 2 > len(values):
        others = f"the other {agree}" if len(hosts) == 1 else f"{agree} of the {len(values)} hosts"
        for host in hosts:
            yield Finding(code, Status.fail, host, f"{what} differs: {host} has {values[host]}; {others} have {common}", remedy)
        return
    detail = ", ".join(f"{h} has {values[h]}" for h in hosts[:8]) + (f" (+{len(hosts) - 8} more)" if len(hosts) > 8 else "")
    yield Finding(code, Status.fail, CLUSTER, f"{what} differs: {detail}; the other {agree} have {common}", remedy)


@cross_check("PF501")
def same_versions(records: Sequence[HostRecord], view: ClusterView) -> Iterator[Finding]:
    """Driver, CUDA, torch, torch's CUDA and the NCCL torch loads are the same on every host."""
    for component, read in COMPONENTS.items():
        if component in GPU_COMPONENTS and view.backend != Backend.nccl:
            continue
        values = {r.host.name: read(r.facts) for r in records}
        yield from same_everywhere("PF501", LABELS[component], values,
                                    "install the same version on every host: ranks built differently can hang or corrupt collectives")


@cross_check("PF502")
def same_gpu_count(records: Sequence[HostRecord], view: ClusterView) -> Iterator[Finding]:
    """Every host has the same number of GPUs (torchrun's --nproc-per-node is one number)."""
    if view.backend == Backend.nccl:
        counts = {r.host.name: len(r.facts["gpu"]["devices"]) for r in records}
        yield from same_everywhere("PF502", "GPU count", counts,
                                    "find the missing GPUs (`nvidia-smi -L`, Xid 79 in dmesg) or leave the host out")


@cross_check("PF503")
def same_mtu(records: Sequence[HostRecord], view: ClusterView) -> Iterator[Finding]:
    """The socket interface's MTU is the same on every host."""
    mtus: dict[str, object] = {}
    for record in records:
        name = view.configured_interface(record)
        iface = find_interface(record.facts, name) if name else None
        if iface is not None:
            mtus[record.host.name] = iface["mtu"]
    if len(mtus) > 1:
        yield from same_everywhere("PF503", "socket interface MTU", mtus,
                                    "set one MTU on every host and switch port; mismatched MTUs drop large frames")


def _own_interfaces(facts: HostFacts) -> list[tuple[str, str, tuple[str, ...]]]:
    """The interfaces that tell one machine from another: each with an address and a MAC of its own (name, MAC, IPv4).
    Loopback, and an interface without an address or with an all-zero MAC, are alike on every machine."""
    return [(i["name"], i["mac"], tuple(sorted(i["ipv4"]))) for i in facts["net"]["interfaces"]
            if not i["loopback"] and i["ipv4"] and i["mac"] and i["mac"].strip("0:")]


@cross_check("PF506")
def each_machine_once(records: Sequence[HostRecord], view: ClusterView) -> Iterator[Finding]:
    """No machine is two hosts of the config: two hosts that answer with one interface (its MAC and its addresses) are
    one machine reached under two names or addresses (a name and its IP, an alias). torchrun would start two nodes of
    the launch on its one set of GPUs, and each check of the machine would count twice."""
    first: dict[tuple[str, tuple[str, ...]], tuple[str, str]] = {}  # (MAC, addresses) -> (host, interface)
    compared, repeated = 0, False
    for record in records:
        interfaces = _own_interfaces(record.facts)
        compared += bool(interfaces)
        same = next(((first[(mac, ipv4)], mac, ipv4) for _, mac, ipv4 in interfaces if (mac, ipv4) in first), None)
        if same is None:
            for ifname, mac, ipv4 in interfaces:
                first.setdefault((mac, ipv4), (record.host.name, ifname))
            continue
        (host, ifname), mac, ipv4 = same
        repeated = True
        yield Finding("PF506", Status.fail, record.host.name,
                      f"{record.host.name} ({record.host.address}) is the machine {host} is: both answer with {ifname} {mac} "
                      f"({', '.join(ipv4)})",
                      f"list each machine once: remove {record.host.name}, or give it the address of the machine it stands for")
    if compared > 1 and not repeated:
        yield Finding("PF506", Status.passed, CLUSTER, f"{compared} hosts, each its own machine (no interface of one is another's)")


def _tuning(facts: HostFacts) -> dict[str, str]:
    merged: dict[str, str] = {}
    for path in sorted(facts["nccl"]["conf_files"]):
        merged.update({f"{k} ({path})": v for k, v in facts["nccl"]["conf_files"][path].items()})
    merged.update({k: v for k, v in facts["nccl"]["env"].items() if k.startswith(_TUNING_PREFIXES)})
    return merged


@cross_check("PF504")
def same_nccl_tuning(records: Sequence[HostRecord], view: ClusterView) -> Iterator[Finding]:
    """NCCL/torch variables and nccl.conf settings agree between hosts."""
    settings = {r.host.name: _tuning(r.facts) for r in records}
    keys = sorted({k for s in settings.values() for k in s})
    drifted = []
    for key in keys:
        values = {name: s.get(key, "(unset)") for name, s in settings.items()}
        odd = _odd_ones_out(values)
        if odd is not None:
            majority, hosts = odd
            drifted.append(f"{key}: " + ", ".join(f"{h}={values[h]}" for h in hosts[:4]) + f" (others {majority})")
    if drifted:
        yield Finding("PF504", Status.warn, CLUSTER, "NCCL settings differ between hosts: " + "; ".join(drifted[:6]),
                      "set NCCL_*/TORCH_NCCL_* the same on every host and remove stray nccl.conf files")
    else:
        yield Finding("PF504", Status.passed, CLUSTER, f"NCCL settings agree ({len(keys)} set)")


@cross_check("PF505")
def clock_skew(records: Sequence[HostRecord], view: ClusterView) -> Iterator[Finding]:
    """Host clocks agree within the threshold, after allowing for each SSH round trip."""
    bounded = [r for r in records if r.clock_offset_s is not None]
    if len(bounded) < 2:
        return
    limit = view.config.thresholds.clock_skew_max_s
    midpoints = sorted((sum(r.clock_offset_s) / 2, r.host.name) for r in bounded if r.clock_offset_s)
    median = midpoints[len(midpoints) // 2][0]
    skewed = []
    for record in bounded:
        low, high = record.clock_offset_s or (0.0, 0.0)
        # The smallest skew consistent with the round trip: 0 when the interval holds the median.
        least = max(low - median, median - high, 0.0)
        if least > limit:
            skewed.append(f"{record.host.name} {(low + high) / 2 - median:+.1f}s")
    if skewed:
        yield Finding("PF505", Status.warn, CLUSTER, f"clock skew over {limit}s against the others: {', '.join(skewed)}",
                      "run chrony/NTP on every host: skewed clocks scramble logs and time-based timeouts")
    else:
        spread = midpoints[-1][0] - midpoints[0][0]
        yield Finding("PF505", Status.passed, CLUSTER, f"clocks agree within {spread:.2f}s (limit {limit}s)")
