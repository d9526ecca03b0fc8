"""Checks of the PCI topology (PF821-PF826): which NIC each GPU reaches and how, ACS on the bridges between them, the
IOMMU, the module GPUDirect RDMA needs, NUMA balancing, and the same layout on every host.

NCCL's troubleshooting guide: ACS redirects peer-to-peer traffic through the root complex (slow, or a hang that looks
like NCCL's fault), an IOMMU in translated mode breaks or slows GPUDirect RDMA (iommu=pt), and without nvidia_peermem
(or dmabuf) NCCL stages every InfiniBand transfer through host memory.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from preflight.checks.cross import same_everywhere
from preflight.checks.registry import ClusterView, cross_check, host_check, host_finding
from preflight.facts import HostFacts, PciDevice, Topology
from preflight.findings import Finding, Status
from preflight.records import HostRecord

# The ACS controls that send peer-to-peer requests and completions up to the root complex.
REDIRECTS = ("ReqRedir", "CmpltRedir")
# nvidia-smi topo -m's names, nearest first.
AFFINITY_ORDER = ("PIX", "PXB", "PHB", "NODE", "SYS")
UNKNOWN = "unknown"  # another root complex, and a NUMA node the host does not report


def _topology(facts: HostFacts) -> Topology | None:
    return facts.get("topology")


def affinity(gpu: PciDevice, nic: PciDevice) -> str:
    """How a GPU reaches a NIC, as nvidia-smi topo -m names it: PIX (one bridge), PXB (several bridges, no host
    bridge), PHB (through the host bridge), NODE (another host bridge, same NUMA node), SYS (across NUMA nodes)."""
    if gpu["root"] is not None and gpu["root"] == nic["root"]:
        shared = 0
        for a, b in zip(gpu["path"], nic["path"], strict=False):
            if a != b:
                break
            shared += 1
        if shared == 0:
            return "PHB"
        # Below one switch each hangs off its own downstream port: paths that part only at their last bridge.
        return "PIX" if len(gpu["path"]) - shared <= 1 and len(nic["path"]) - shared <= 1 else "PXB"
    if gpu["numa_node"] is None or nic["numa_node"] is None:
        return UNKNOWN  # numa_node -1 (common in VMs): another host bridge, on a socket the host does not say
    if gpu["numa_node"] == nic["numa_node"]:
        return "NODE"
    return "SYS"


def _rank(how: str) -> float:
    """Nearest first; an unknown NUMA node sorts between NODE and SYS (it may be either)."""
    return AFFINITY_ORDER.index("NODE") + 0.5 if how == UNKNOWN else AFFINITY_ORDER.index(how)


def gpu_nic_affinity(topology: Topology) -> list[tuple[str, str, str]]:
    """Each GPU's nearest NIC: (GPU PCI address, NIC name, affinity); empty without NICs."""
    gpus = [d for d in topology["devices"] if d["kind"] == "gpu"]
    nics = [d for d in topology["devices"] if d["kind"] == "nic"]
    if not nics:
        return []
    nearest = []
    for gpu in gpus:
        best = min(nics, key=lambda nic: _rank(affinity(gpu, nic)))
        nearest.append((gpu["pci"], best["name"] or best["pci"], affinity(gpu, best)))
    return nearest


def _has_rdma(facts: HostFacts) -> bool:
    return any(p["state"] == "ACTIVE" for p in facts["net"]["infiniband"])


@host_check("PF821")
def gpu_nic_locality(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """Every GPU has an RDMA NIC on its own NUMA node (GPUDirect RDMA across the CPU interconnect is slow)."""
    topology = _topology(record.facts)
    if topology is None:
        return
    nearest = gpu_nic_affinity(topology)
    if not nearest:
        return
    far = [f"GPU {pci} -> {nic} {how}" for pci, nic, how in nearest if how == "SYS"]
    unplaced = [pci for pci, _, how in nearest if how == UNKNOWN]
    summary = ", ".join(f"{pci}->{nic} {how}" for pci, nic, how in nearest[:8])
    if unplaced and not far:
        yield host_finding("PF821", Status.unknown, record,
                           f"the host reports no NUMA node for {len(unplaced)} GPUs or their nearest NICs (numa_node -1, "
                           f"common in VMs): {summary}", "read `nvidia-smi topo -m` on the host; a VM may hide its sockets")
    elif far:
        yield host_finding("PF821", Status.warn, record, "GPUs with no NIC on their NUMA node: " + "; ".join(far[:8]),
                           "put a NIC on each CPU socket's PCIe tree (or pin NCCL_IB_HCA per rank); traffic crosses the CPU "
                           "interconnect otherwise")
    else:
        yield host_finding("PF821", Status.passed, record, f"every GPU has a NIC on its NUMA node: {summary}")


@host_check("PF822")
def acs_redirect(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """No bridge above a GPU or NIC redirects peer-to-peer traffic to the root complex (ACS ReqRedir/CmpltRedir)."""
    topology = _topology(record.facts)
    if topology is None or not topology["bridges"]:
        return
    redirecting = [b["pci"] for b in topology["bridges"] if any(flag in (b["acs_ctl"] or []) for flag in REDIRECTS)]
    unreadable = sum(1 for b in topology["bridges"] if b["config_bytes"] <= 256)
    if not redirecting and unreadable == len(topology["bridges"]):
        yield host_finding("PF822", Status.unknown, record,
                           f"ACS unknown: none of the {unreadable} bridges above the GPUs/NICs had its extended config space "
                           "readable (the probe ran without root)", "run the check as root, or `sudo lspci -vvv | grep ACSCtl`")
        return
    if redirecting:
        yield host_finding("PF822", Status.warn, record,
                           f"ACS redirects peer-to-peer traffic on {len(redirecting)} bridges above the GPUs/NICs: "
                           + ", ".join(redirecting[:8]),
                           "disable ACS on bare metal (BIOS, or `setpci -s BDF ECAP_ACS+0x6.w=0000` at boot); leave it on "
                           "only in VMs that pass GPUs through")
    else:
        note = f" ({unreadable} not readable without root)" if unreadable else ""
        yield host_finding("PF822", Status.passed, record,
                           f"no ACS redirect on the {len(topology['bridges']) - unreadable} readable bridges above the GPUs/NICs{note}")


@host_check("PF823", "PF824", "PF825")
def gpudirect_settings(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """GPUDirect RDMA can work (IOMMU in passthrough or off, nvidia_peermem or dmabuf) where GPUs meet InfiniBand, and
    NUMA balancing does not move a GPU job's pages."""
    facts = record.facts
    topology = _topology(facts)
    if topology is None or not (view.uses_gpus and facts["gpu"]["devices"]):
        return
    rdma = _has_rdma(facts)
    iommu = topology["iommu"]
    if rdma and iommu["groups"] and (iommu["gpu_domain"] or "").startswith("DMA"):
        yield host_finding("PF823", Status.warn, record,
                           f"the IOMMU translates the GPUs' DMA ({iommu['gpu_domain']}, kernel: "
                           f"{' '.join(iommu['cmdline'] or []) or 'default'}): "
                           "GPUDirect RDMA is slow or fails", "boot with iommu=pt (or intel_iommu=off / amd_iommu=off on bare metal)")
    elif rdma and iommu["groups"] is not None:
        yield host_finding("PF823", Status.passed, record,
                           f"IOMMU {'in ' + iommu['gpu_domain'] + ' mode' if iommu['gpu_domain'] else 'not translating'}")
    if rdma:
        kernel = tuple(int(p) for p in [*facts["host"]["kernel"].split("-")[0].split("."), "0", "0"][:2] if p.isdigit())
        dmabuf = bool(topology["nvidia_open_module"]) and kernel >= (5, 12)
        if topology["peermem_loaded"] or dmabuf:
            how = "nvidia_peermem loaded" if topology["peermem_loaded"] else "dmabuf (open kernel module, kernel 5.12+)"
            yield host_finding("PF824", Status.passed, record, f"GPUDirect RDMA possible: {how}")
        elif topology["peermem_loaded"] is False:
            yield host_finding("PF824", Status.warn, record,
                               "InfiniBand without nvidia_peermem or dmabuf: NCCL stages every transfer through host memory",
                               "`modprobe nvidia_peermem` (and add it to /etc/modules-load.d), or use the open kernel module on "
                               "kernel 5.12+ for dmabuf")
    if topology["numa_balancing"]:
        yield host_finding("PF825", Status.warn, record, "automatic NUMA balancing is on: it migrates pinned-looking pages under a job",
                           "`sysctl kernel.numa_balancing=0` (persist it in /etc/sysctl.d)")
    elif topology["numa_balancing"] == 0:
        yield host_finding("PF825", Status.passed, record, "automatic NUMA balancing is off")


def layout(facts: HostFacts) -> str | None:
    """A host's topology in one line, for comparing hosts: device counts and each GPU's nearest NIC affinity."""
    topology = _topology(facts)
    if topology is None:
        return None
    counts = {kind: sum(1 for d in topology["devices"] if d["kind"] == kind) for kind in ("gpu", "nic", "nvswitch")}
    nearest = sorted(how for _, _, how in gpu_nic_affinity(topology))
    numa = sorted({d["numa_node"] for d in topology["devices"] if d["numa_node"] is not None})
    text = f"{counts['gpu']} GPUs, {counts['nic']} RDMA NICs, {counts['nvswitch']} NVSwitches on NUMA nodes {numa or '-'}"
    return text + (f", GPU to NIC {'/'.join(nearest)}" if nearest else "")


@host_check("PF827")
def golden_topology(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """The host's layout is the golden one configured for its GPU model (network.golden_topology)."""
    golden = view.config.network.golden_topology
    devices = record.facts["gpu"]["devices"]
    text = layout(record.facts)
    if not golden or not devices or text is None:
        return
    model = devices[0]["name"]
    wanted = next((line for name, line in golden.items() if name in model), None)
    if wanted is None:
        return
    if text == wanted:
        yield host_finding("PF827", Status.passed, record, f"topology is the golden one for {model}: {text}")
    else:
        yield host_finding("PF827", Status.fail, record, f"topology {text!r} is not the golden one for {model}: {wanted!r}",
                           "compare `nvidia-smi topo -m` with a good host of this hardware: a missing GPU or NIC, or a card "
                           "in another slot; fix network.golden_topology if the hardware changed on purpose")


@cross_check("PF826")
def same_topology(records: Sequence[HostRecord], view: ClusterView) -> Iterator[Finding]:
    """Every host has the same PCI layout of GPUs, NICs and NVSwitches (the odd host out lost a device or was cabled
    differently)."""
    layouts = {r.host.name: text for r in records if (text := layout(r.facts)) is not None}
    if len(layouts) > 1 and any((topology := _topology(r.facts)) is not None and topology["devices"] for r in records):
        yield from same_everywhere("PF826", "GPU/NIC topology", layouts,
                                   "compare `nvidia-smi topo -m` on the odd host with the others: a missing GPU or NIC, or a card "
                                   "in another slot")
