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


def _by_design(facts: HostFacts, gpu: int) -> bool:
    """A PCIe-form GPU (H100 NVL, H100/A100 PCIe) wires only some of its NVLinks to bridges, by design."""
    names = {d["index"]: d["name"] for d in facts["gpu"]["devices"]}
    name = names.get(gpu, "")
    return "PCIe" in name or " NVL" in name


@host_check("PF813")
def nvlink_links(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """Every NVLink of a GPU that has NVLink is up (on PCIe-form cards, as many as on the host's best card of the
    model), no GPU has lost every link where others use NVLink, and no link counts replay, recovery or CRC errors."""
    facts = record.facts
    fabric = _fabric(facts)
    if fabric is None or not (fabric["nvlinks"] or fabric.get("nvlink_all_down")):
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
    dead = sorted(set(fabric.get("nvlink_all_down", [])) | {g for g, links in down.items() if len(links) == len(by_gpu[g])})
    up = {g: len(links) - len(down.get(g, [])) for g, links in by_gpu.items() if g not in dead}
    # A PCIe-form card is judged against the host's best card: the links it lacks by design are down on every one.
    best = max((n for g, n in up.items() if _by_design(facts, g)), default=0)
    partial = {g: links for g, links in down.items() if g not in dead and not (_by_design(facts, g) and up[g] >= best)}
    if dead and (up or fabric["nvswitch_count"]):
        yield host_finding("PF813", Status.fail, record,
                           "NVLink down on every link of GPU " + ", ".join(map(str, dead)) + " while "
                           + (f"{len(up)} other GPUs use NVLink" if up else f"{fabric['nvswitch_count']} NVSwitches are there")
                           + ": NCCL falls back to PCIe or hangs",
                           "drain the node; reset the GPU (or reboot) and read the kernel log for Xid 74/145/149; RMA if the "
                           "links stay down")
    elif dead and len(facts["gpu"]["devices"]) <= 1:
        # A lone GPU (a GH200 superchip, one card) has NVLink hardware and nothing to link to: no link up is normal.
        yield host_finding("PF813", Status.passed, record, "one GPU and no NVSwitch: no NVLink to bring up")
        return
    elif dead:
        yield host_finding("PF813", Status.warn, record,
                           f"GPUs {', '.join(map(str, dead))} have NVLink but no link is up (no bridge fitted, or all links lost)",
                           "fit the NVLink bridges, or check `nvidia-smi nvlink -s` and the kernel log for Xid 74")
    if partial:
        yield host_finding("PF813", Status.fail, record,
                           "NVLink down: " + "; ".join(f"GPU {g} link{'s' if len(v) > 1 else ''} {','.join(map(str, v))}"
                                                       for g, v in sorted(partial.items())),
                           "drain the node; reset the GPUs (or reboot) and check `nvidia-smi nvlink -s`; reseat or RMA if a "
                           "link stays down")
    if errors:
        yield host_finding("PF813", Status.warn, record, "NVLink error counters: " + "; ".join(errors[:6]),
                           "watch `nvidia-smi nvlink -e`; a count that grows between checks is a failing link: drain and RMA")
    if not partial and not errors and not dead:
        wired = sum(up.values())
        spare = sum(len(v) for v in down.values())
        note = f" ({spare} unwired by design on PCIe-form cards)" if spare else ""
        yield host_finding("PF813", Status.passed, record, f"{wired} NVLinks up on {len(up)} GPUs{note}, no errors counted")


@host_check("PF815")
def fabric_manager_version(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """Fabric Manager's version is the driver's: it refuses to start otherwise, and the GPUs never join the fabric."""
    fabric = _fabric(record.facts)
    if fabric is None or not fabric["nvswitch_count"]:
        return
    manager, driver = fabric["fabric_manager"].get("version"), record.facts["gpu"]["driver_version"]
    if manager is None or driver is None:
        if fabric["fabric_manager"]["installed"]:
            yield host_finding("PF815", Status.unknown, record,
                               f"Fabric Manager {manager or 'version unknown'}, driver {driver or 'version unknown'}: cannot compare")
        return
    if manager == driver:
        yield host_finding("PF815", Status.passed, record, f"Fabric Manager {manager} matches the driver")
    else:
        yield host_finding("PF815", Status.fail, record,
                           f"Fabric Manager {manager} but driver {driver}: Fabric Manager refuses a driver of another version "
                           "and the GPUs never join the NVLink fabric", "install nvidia-fabricmanager of exactly the driver's "
                           "version (and hold both packages), then restart it")


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
