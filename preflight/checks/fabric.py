"""Checks of NVLink and the NVSwitch fabric (PF811-PF814): each GPU's registration with the fabric, Fabric Manager on
NVSwitch hosts, NVLink link state and error counters, and the same links on every host.

A stopped Fabric Manager leaves GPUs that look healthy to every other check while NCCL hangs at init: on a host with
NVSwitches the GPU's fabric state must be `completed` with status `success` before a job lands there.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from preflight.checks.cross import same_everywhere
from preflight.checks.registry import ClusterView, cross_check, host_check, host_finding
from preflight.facts import FabricInfo, HostFacts
from preflight.findings import Finding, Status
from preflight.records import HostRecord

_FM_REMEDY = ("`systemctl enable --now nvidia-fabricmanager` (its version must match the driver's); then check "
              "`nvidia-smi -q | grep -A4 Fabric`")


def _fabric(facts: HostFacts) -> FabricInfo | None:
    return facts.get("fabric")


@host_check("PF811", "PF812")
def fabric_registration(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """On an NVSwitch host, Fabric Manager runs and every GPU finished registering with the fabric."""
    fabric = _fabric(record.facts)
    if fabric is None:
        return
    switches = fabric["nvswitch_count"]
    manager = fabric["fabric_manager"]
    if switches:
        if manager["running"]:
            yield host_finding("PF812", Status.passed, record, f"nvidia-fabricmanager runs ({switches} NVSwitches)")
        else:
            how = "is installed but not running" if manager["installed"] else "is not installed"
            yield host_finding("PF812", Status.fail, record,
                               f"{switches} NVSwitches but nvidia-fabricmanager {how}: NCCL hangs at init", _FM_REMEDY)
    bad, good, warned = [], 0, False
    for gpu in fabric["gpus"]:
        state, status = gpu["state"], gpu["status"]
        if state is None or state == "not_supported":
            continue  # a GPU outside any NVSwitch fabric (PCIe, or NVLink bridges only)
        if state != "completed":
            bad.append(f"GPU {gpu['index']} fabric state {state}")
        elif (status or "").lower() != "success":
            bad.append(f"GPU {gpu['index']} fabric registration completed with {status}")
        elif (gpu["health_summary"] or "").lower() == "unhealthy":
            yield host_finding("PF811", Status.warn, record,
                               f"GPU {gpu['index']} fabric health Unhealthy (clique {gpu['clique_id']}, cluster {gpu['cluster_uuid']})",
                               "check `nvidia-smi -q` Fabric > Health (bandwidth, route recovery) and the NVLink switch trays")
            warned = True
        else:
            good += 1
    if bad:
        yield host_finding("PF811", Status.fail, record, "; ".join(bad[:8]) + ": NCCL's NVLink paths are not set up",
                           "start or restart nvidia-fabricmanager (or the IMEX/NVLink domain services on GB200) and wait for "
                           "state Completed/Success; drain the node if it does not get there")
    elif good and not warned:
        yield host_finding("PF811", Status.passed, record, f"{good} GPUs registered with the NVLink fabric (Completed, Success)")


@host_check("PF813")
def nvlink_links(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """Every NVLink of a GPU that has NVLink is up, and no link counts replay, recovery or CRC errors."""
    fabric = _fabric(record.facts)
    if fabric is None or not fabric["nvlinks"]:
        return
    by_gpu: dict[int, list[int]] = {}
    down: dict[int, list[int]] = {}
    errors = []
    for link in fabric["nvlinks"]:
        by_gpu.setdefault(link["gpu"], []).append(link["link"])
        if not link["active"]:
            down.setdefault(link["gpu"], []).append(link["link"])
        counted = {k: v for k, v in (link["errors"] or {}).items() if v}
        if counted:
            errors.append(f"GPU {link['gpu']} link {link['link']} " + " ".join(f"{k}={v}" for k, v in sorted(counted.items())))
    # A GPU listing links of which none is up has no NVLink in use (a PCIe card); one with some up has lost the rest.
    partial = {gpu: links for gpu, links in down.items() if len(links) < len(by_gpu[gpu])}
    if partial:
        yield host_finding("PF813", Status.fail, record,
                           "NVLink down: " + "; ".join(f"GPU {g} link{'s' if len(v) > 1 else ''} {','.join(map(str, v))}"
                                                       for g, v in sorted(partial.items())),
                           "drain the node; reset the GPUs (or reboot) and check `nvidia-smi nvlink -s`; reseat or RMA if a "
                           "link stays down")
    if errors:
        yield host_finding("PF813", Status.warn, record, "NVLink error counters: " + "; ".join(errors[:6]),
                           "watch `nvidia-smi nvlink -e`; a count that grows between checks is a failing link: drain and RMA")
    if not partial and not errors:
        active = sum(len(v) for v in by_gpu.values()) - sum(len(v) for v in down.values())
        yield host_finding("PF813", Status.passed, record, f"{active} NVLinks up on {len(by_gpu) - len(down)} GPUs, no errors counted")


@cross_check("PF814")
def same_nvlinks(records: Sequence[HostRecord], view: ClusterView) -> Iterator[Finding]:
    """Every host has the same number of active NVLinks and NVSwitches (the odd host out lost a link or a tray)."""
    layouts: dict[str, object] = {}
    for record in records:
        fabric = _fabric(record.facts)
        if fabric is None:
            continue
        active = sum(1 for link in fabric["nvlinks"] if link["active"])
        layouts[record.host.name] = f"{active} active NVLinks, {fabric['nvswitch_count']} NVSwitches"
    if len(layouts) > 1 and any(not v.startswith("0 active NVLinks, 0 ") for v in map(str, layouts.values())):
        yield from same_everywhere("PF814", "NVLink layout", layouts,
                                   "find the host's missing links (`nvidia-smi nvlink -s`, Xid 74 in the kernel log) or leave it out")
