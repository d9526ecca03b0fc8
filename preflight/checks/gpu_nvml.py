"""Checks of what operators read first on a GPU node (PF860-PF870): clocks held down and temperature, ECC mode, the
PCIe link of GPUs and RDMA NICs, VBIOS and InfoROM across hosts, retired pages waiting for a reboot, MIG mode against
the config, and the driver's own recovery action.

They read the GPU facts added by facts schema 3 (NVML, or nvidia-smi -q -x where NVML cannot be used); a fact the host
could not tell (None), or that an older probe did not collect, is skipped rather than judged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

from preflight.checks.cross import same_everywhere
from preflight.checks.registry import ClusterView, cross_check, host_check, host_finding
from preflight.facts import GpuDevice
from preflight.findings import Finding, Status
from preflight.records import HostRecord

# Reasons that hold the clocks down whatever the job does: the board's slowdown signal, its thermal limit, and the
# power brake (an external signal, e.g. from a failing power supply).
_HARDWARE_REASONS = {"hw_slowdown": "HW slowdown", "hw_thermal_slowdown": "HW thermal slowdown",
                     "hw_power_brake_slowdown": "HW power brake"}
_RECOVERY_REMEDIES = {
    "gpu_reset": "drain the node and reset the GPU (`nvidia-smi -r -i N`), then check again",
    "node_reboot": "drain the node and reboot it",
    "system_reboot": "drain the node and reboot it",
    "drain_p2p": "drain the node: peer-to-peer traffic must stop before the GPU recovers; reset the GPU once it is idle",
    "drain_and_reset": "drain the node, then reset the GPU (`nvidia-smi -r -i N`) once no process uses it",
    "bus_reset": "drain the node and reset the GPU's PCIe bus (a reboot does it)",
    "recover_imex_domain": "drain the node and restart the IMEX domain (nvidia-imex) of its NVLink domain",
}


def _devices(record: HostRecord) -> list[GpuDevice]:
    return record.facts["gpu"]["devices"]


def _verdict(code: str, record: HostRecord, status: Status, problem: str | None, remedy: str,
             passed: str | None) -> Iterator[Finding]:
    """The finding of a check with one kind of problem: the problem where there is one, else the pass where the check
    could read anything, else none."""
    if problem:
        yield host_finding(code, status, record, problem, remedy)
    elif passed:
        yield host_finding(code, Status.passed, record, passed)


@host_check("PF860", "PF861")
def clocks_and_temperature(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """No GPU's clocks are held down by the hardware or a software thermal limit, and none is hotter than
    thresholds.gpu_temperature_max_c before the job."""
    held, soft, clocks_read = [], [], 0
    limit = view.config.thresholds.gpu_temperature_max_c
    hot, temperatures = [], []
    for gpu in _devices(record):
        reasons = gpu.get("clock_event_reasons")
        if reasons is not None:
            clocks_read += 1
            hardware = [label for reason, label in _HARDWARE_REASONS.items() if reason in reasons]
            if hardware:
                held.append(f"GPU {gpu['index']} {', '.join(hardware)}")
            elif "sw_thermal_slowdown" in reasons:
                soft.append(f"GPU {gpu['index']}")
        temperature = gpu.get("temperature_c")
        if temperature is not None:
            temperatures.append(temperature)
            if temperature > limit:
                hot.append(f"GPU {gpu['index']} at {temperature} C")
    if held:
        yield host_finding("PF860", Status.fail, record, "clocks held down: " + "; ".join(held[:8]),
                           "drain the node: check cooling, power supplies and `nvidia-smi -q -d PERFORMANCE`; a GPU held "
                           "down runs the whole job at its pace")
    elif soft:
        yield host_finding("PF860", Status.warn, record, f"{', '.join(soft[:8])}: clocks lowered by the driver's thermal limit",
                           "check the airflow and fans of the node; `nvidia-smi -q -d TEMPERATURE,PERFORMANCE`")
    elif clocks_read:
        yield host_finding("PF860", Status.passed, record, f"no clocks held down on {clocks_read} GPUs")
    yield from _verdict("PF861", record, Status.warn, f"{'; '.join(hot[:8])} before the job (above {limit} C)" if hot else None,
                        "check the node's cooling; a GPU this hot idle throttles under load",
                        f"GPUs at most {max(temperatures)} C (limit {limit} C)" if temperatures else None)


@host_check("PF862")
def ecc_mode(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """ECC is on for every GPU that has it, and no change of mode waits for a reboot."""
    off, changing, on = [], [], 0
    for gpu in _devices(record):
        current, pending = gpu["ecc_enabled"], gpu.get("ecc_pending_enabled")
        if current is None:
            continue
        if not current:
            off.append(f"GPU {gpu['index']}")
        else:
            on += 1
        if pending is not None and pending != current:
            changing.append(f"GPU {gpu['index']} {'on' if pending else 'off'}")
    if off:
        yield host_finding("PF862", Status.warn, record, f"ECC is off on {', '.join(off[:8])}: a memory error corrupts the "
                           "job's data silently", "`nvidia-smi -e 1` and reboot (or reset the GPUs)")
    if changing:
        yield host_finding("PF862", Status.warn, record, "ECC mode changes at the next reboot: " + ", ".join(changing[:8]),
                           "reboot the node before the job, so that it runs in the mode the other hosts have")
    if on and not off and not changing:
        yield host_finding("PF862", Status.passed, record, f"ECC on for {on} GPUs")


def _as_warning(findings: Iterator[Finding]) -> Iterator[Finding]:
    """same_everywhere's findings, a difference a warning: it costs nothing at once but explains odd hosts later."""
    for finding in findings:
        yield dataclasses.replace(finding, status=Status.warn) if finding.status == Status.fail else finding


@cross_check("PF863")
def same_ecc_mode(records: Sequence[HostRecord], view: ClusterView) -> Iterator[Finding]:
    """Every host's GPUs run with the same ECC mode."""
    modes = {}
    for record in records:
        known = {gpu["ecc_enabled"] for gpu in _devices(record) if gpu["ecc_enabled"] is not None}
        if known:
            modes[record.host.name] = " and ".join("on" if mode else "off" for mode in sorted(known, reverse=True))
    if len(modes) > 1:
        yield from same_everywhere("PF863", "ECC mode", modes,
                                   "set one ECC mode on every host (`nvidia-smi -e 1`, then reboot): a host without ECC "
                                   "hides memory errors the others would report")


@host_check("PF864")
def gpu_pcie_generation(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """Every GPU's link runs at the PCIe generation its slot allows, and the slot allows the GPU's own."""
    slow, checked = [], 0
    for gpu in _devices(record):
        current, link_max, own_max = gpu["pcie_gen_current"], gpu["pcie_gen_max"], gpu.get("pcie_gen_gpu_max")
        if link_max is None:
            continue
        if own_max is not None and link_max < own_max:
            slow.append(f"GPU {gpu['index']} in a Gen{link_max} slot, capable of Gen{own_max}")
            continue
        reasons = gpu.get("clock_event_reasons")
        # An idle GPU lowers its link's generation to save power; only a GPU at work must run at the maximum.
        if current is not None and current < link_max and reasons is not None and "gpu_idle" not in reasons:
            slow.append(f"GPU {gpu['index']} at PCIe Gen{current} while not idle, capable of Gen{link_max}")
            continue
        checked += 1
    yield from _verdict("PF864", record, Status.warn, "; ".join(slow[:8]),
                        "check the BIOS's PCIe speed setting, the riser and the slot; reseat the GPU. "
                        "`nvidia-smi -q -d PERFORMANCE` and `lspci -vv` (LnkSta against LnkCap)",
                        f"{checked} GPUs' PCIe generation as their links allow" if checked else None)


@host_check("PF865")
def nic_pcie_link(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """Every RDMA NIC's PCIe link runs at its maximum speed and width."""
    topology = record.facts.get("topology")
    if topology is None:
        return
    narrow, full = [], 0
    for device in topology["devices"]:
        link = device.get("pcie_link")
        if device["kind"] != "nic" or link is None:
            continue
        speed, width, max_speed, max_width = link["speed_gts"], link["width"], link["max_speed_gts"], link["max_width"]
        if speed is None or width is None or max_speed is None or max_width is None:
            continue
        if speed < max_speed or width < max_width:
            narrow.append(f"{device['name'] or '?'} ({device['pci']}) {speed:g} GT/s x{width}, capable of "
                          f"{max_speed:g} GT/s x{max_width}")
        else:
            full += 1
    yield from _verdict("PF865", record, Status.warn, "RDMA NIC PCIe link below its maximum: " + "; ".join(narrow[:8]) if narrow else None,
                        "reseat the NIC or its riser, check the slot and the BIOS's PCIe settings: a narrowed link caps "
                        "the NIC below its network rate",
                        f"{full} RDMA NIC functions at full PCIe speed and width" if full else None)


def _firmware_by_sku(records: Sequence[HostRecord], field: str) -> dict[str, dict[str, str]]:
    """Per GPU model, each host's versions of one firmware field (several joined, where a host mixes them)."""
    by_sku: dict[str, dict[str, set[str]]] = {}
    for record in records:
        for gpu in _devices(record):
            version = gpu.get(field)
            if isinstance(version, str):
                by_sku.setdefault(gpu["name"], {}).setdefault(record.host.name, set()).add(version)
    return {sku: {host: ", ".join(sorted(versions)) for host, versions in hosts.items()} for sku, hosts in by_sku.items()}


@cross_check("PF866", "PF867")
def same_gpu_firmware(records: Sequence[HostRecord], view: ClusterView) -> Iterator[Finding]:
    """The GPUs of one model carry the same VBIOS and InfoROM image on every host."""
    for code, field, label in (("PF866", "vbios_version", "VBIOS"), ("PF867", "inforom_image_version", "InfoROM image")):
        for sku, versions in sorted(_firmware_by_sku(records, field).items()):
            if len(versions) > 1:
                yield from _as_warning(same_everywhere(
                    code, f"{label} of {sku}", versions,
                    "update the odd hosts' GPU firmware to the fleet's (the vendor's firmware bundle or "
                    "`nvidia-smi -q | grep -A2 -E 'VBIOS|Inforom'`); mixed firmware explains faults seen on some hosts only"))


@host_check("PF868")
def retired_pages(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """No GPU has pages waiting to be retired (pre-Ampere GPUs retire pages at the next reboot; later ones remap rows)."""
    pending = [f"GPU {gpu['index']}" for gpu in _devices(record) if gpu.get("retired_pages_pending")]
    known = [gpu for gpu in _devices(record) if gpu.get("retired_pages_pending") is not None]
    yield from _verdict("PF868", record, Status.fail, f"retired pages pending on {', '.join(pending[:8])}" if pending else None,
                        "drain the node and reboot it so the pages are retired; RMA a GPU that keeps retiring pages",
                        f"no retired pages pending on {len(known)} GPUs" if known else None)


@host_check("PF869")
def mig_as_expected(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """MIG mode is what training.gpu_mig says and stays so after the next GPU reset (MIG where it is not expected is
    PF407's)."""
    expected = view.config.training.gpu_mig
    missing, changing, as_expected = [], [], 0
    for gpu in _devices(record):
        current, pending = gpu["mig_enabled"], gpu.get("mig_pending_enabled")
        if current is None:
            continue
        if pending is not None and pending != current:
            changing.append(f"GPU {gpu['index']} {'on' if pending else 'off'}")
        if expected and not current:
            missing.append(f"GPU {gpu['index']}")
        elif current == expected:
            as_expected += 1
    if missing:
        yield host_finding("PF869", Status.fail, record, f"MIG is off on {', '.join(missing[:8])}; the cluster runs MIG "
                           "(training.gpu_mig)", "`nvidia-smi -i N -mig 1`, reset the GPU and create the instances")
    if changing:
        yield host_finding("PF869", Status.warn, record, "MIG mode changes at the next GPU reset: " + ", ".join(changing[:8]),
                           "reset the GPUs now (or undo the change: `nvidia-smi -i N -mig 0|1`) so the mode does not "
                           "change under a job")
    if as_expected and not missing and not changing:
        yield host_finding("PF869", Status.passed, record, f"MIG {'on' if expected else 'off'} on {as_expected} GPUs, as expected")


@host_check("PF870")
def recovery_action(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """The driver asks for no recovery action on any GPU (NVML's GPU recovery action, where the driver has it)."""
    told = [gpu for gpu in _devices(record) if gpu.get("recovery_action") is not None]
    asked = [gpu for gpu in told if gpu.get("recovery_action") != "none"]
    for gpu in asked:
        action = str(gpu.get("recovery_action"))
        yield host_finding("PF870", Status.fail, record, f"GPU {gpu['index']}: the driver asks for recovery: {action}",
                           _RECOVERY_REMEDIES.get(action, "drain the node and do what `nvidia-smi -q` shows under "
                                                          "GPU Recovery Action"))
    if told and not asked:
        yield host_finding("PF870", Status.passed, record, f"no recovery action asked for on {len(told)} GPUs")
