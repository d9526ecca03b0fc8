"""The GPUs: through NVML where pynvml is installed, else nvidia-smi."""

from __future__ import annotations

import ctypes
import os
import time

from preflight.probe.constants import (
    CLOCK_EVENT_REASONS,
    COMPUTE_MODES,
    FABRIC_HEALTH,
    FABRIC_STATES,
    NVLINK_ERROR_COUNTERS,
    NVLINK_MAX_LINKS,
    NVML_CALL_ERRORS,
    NVML_CALL_ERRORS_MAX,
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
    RECOVERY_ACTIONS,
    SMI_APP_FIELDS,
    SMI_GPU_FIELDS,
    SMI_REMAP_FIELDS,
    SMI_TIMEOUT_S,
)
from preflight.probe.host import library_version, which
from preflight.probe.parse import cuda_version_string, parse_smi_csv, parse_smi_xml, smi_devices
from preflight.probe.readings import fabric_uuid, nvlink_all_inactive, parse_nvlink_errors, parse_nvlink_status, parse_smi_fabric

# typing costs milliseconds to import on a plain python, and annotations here are never evaluated.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def _text(value: object) -> str:
    """A pynvml string, which older bindings return as bytes."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _int(value: object) -> int | None:
    """An integer pynvml value, or None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def ask(nvml: Any, call: str, *args: object, older: str | None = None) -> object:
    """nvml.<call>(*args), or None when NVML cannot tell: the call is looked up inside the guard, so a call this
    host's pynvml lacks makes only this fact unknown. A failure that is not NVML's own answer (arguments this pynvml
    does not take, a call it lacks, a function this driver's library does not export) goes into NVML_CALL_ERRORS, so a
    wrong call cannot pass for a feature the GPU does not have. older: the call's name before NVML renamed it, asked
    instead where this pynvml or driver has only that one."""
    try:
        return getattr(nvml, call)(*args)
    except Exception as e:  # any NVMLError (NotSupported, NoPermission, GpuIsLost) or a call an older pynvml lacks
        not_found = getattr(nvml, "NVMLError_FunctionNotFound", ())
        if older is not None and isinstance(e, (AttributeError, not_found)):
            return ask(nvml, older, *args)
        if not isinstance(e, nvml.NVMLError) or isinstance(e, not_found):
            note = f"{call}: {type(e).__name__}: {e}"[:200]
            if note not in NVML_CALL_ERRORS and len(NVML_CALL_ERRORS) < NVML_CALL_ERRORS_MAX:
                NVML_CALL_ERRORS.append(note)
        return None


def nvml_processes(nvml: Any, handle: object) -> list[dict[str, Any]] | None:
    """The compute processes on one GPU, or None when NVML cannot list them."""
    running = ask(nvml, "nvmlDeviceGetComputeRunningProcesses", handle)
    if not isinstance(running, list):
        return None
    processes = []
    for process in running:
        name = ask(nvml, "nvmlSystemGetProcessName", process.pid)
        processes.append({
            "pid": int(process.pid),
            "name": _text(name) if name is not None else None,
            "used_memory_bytes": _int(process.usedGpuMemory),  # None where the driver cannot account it
        })
    return processes


def nvml_device(nvml: Any, index: int) -> dict[str, Any]:
    """One GpuDevice through NVML; raises NVMLError when the GPU cannot even be named."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    name, uuid = _text(nvml.nvmlDeviceGetName(handle)), _text(nvml.nvmlDeviceGetUUID(handle))
    pci: Any = ask(nvml, "nvmlDeviceGetPciInfo", handle)
    memory: Any = ask(nvml, "nvmlDeviceGetMemoryInfo", handle)
    ecc = ask(nvml, "nvmlDeviceGetEccMode", handle)  # [current, pending]
    remapped = ask(nvml, "nvmlDeviceGetRemappedRows", handle)  # (correctable, uncorrectable, pending, failure)
    mig = ask(nvml, "nvmlDeviceGetMigMode", handle)  # [current, pending]
    persistence = _int(ask(nvml, "nvmlDeviceGetPersistenceMode", handle))
    compute = _int(ask(nvml, "nvmlDeviceGetComputeMode", handle))
    uncorrected = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    return {
        "index": index,
        "name": name,
        "uuid": uuid,
        "pci_bus_id": _text(pci.busId) if pci is not None else None,
        "memory_total_bytes": _int(memory.total) if memory is not None else None,
        "memory_used_bytes": _int(memory.used) if memory is not None else None,
        "ecc_enabled": ecc[0] == nvml.NVML_FEATURE_ENABLED if isinstance(ecc, (list, tuple)) else None,
        "ecc_uncorrected_volatile": _int(ask(nvml, "nvmlDeviceGetTotalEccErrors", handle, uncorrected, nvml.NVML_VOLATILE_ECC)),
        "ecc_uncorrected_aggregate": _int(ask(nvml, "nvmlDeviceGetTotalEccErrors", handle, uncorrected, nvml.NVML_AGGREGATE_ECC)),
        "remapped_rows_pending": bool(remapped[2]) if isinstance(remapped, (list, tuple)) else None,
        "remapped_rows_failed": bool(remapped[3]) if isinstance(remapped, (list, tuple)) else None,
        "pcie_gen_current": _int(ask(nvml, "nvmlDeviceGetCurrPcieLinkGeneration", handle)),
        "pcie_gen_max": _int(ask(nvml, "nvmlDeviceGetMaxPcieLinkGeneration", handle)),
        "pcie_width_current": _int(ask(nvml, "nvmlDeviceGetCurrPcieLinkWidth", handle)),
        "pcie_width_max": _int(ask(nvml, "nvmlDeviceGetMaxPcieLinkWidth", handle)),
        "persistence_mode": None if persistence is None else persistence == nvml.NVML_FEATURE_ENABLED,
        "compute_mode": COMPUTE_MODES.get(compute) if compute is not None else None,
        "mig_enabled": mig[0] == nvml.NVML_DEVICE_MIG_ENABLE if isinstance(mig, (list, tuple)) else None,
        "processes": nvml_processes(nvml, handle),
        "mig_pending_enabled": mig[1] == nvml.NVML_DEVICE_MIG_ENABLE if isinstance(mig, (list, tuple)) else None,
        "ecc_pending_enabled": ecc[1] == nvml.NVML_FEATURE_ENABLED if isinstance(ecc, (list, tuple)) else None,
        **nvml_device_health(nvml, handle),
    }


def clock_event_names(mask: int | None) -> list[str] | None:
    """The names of the clocks event reasons set in NVML's bit mask."""
    return None if mask is None else [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]


def nvml_recovery_action(nvml: Any, handle: object) -> str | None:
    """NVML's GPU recovery action (a field value of newer drivers: the recorded 580 has it), or None where the driver has none."""
    values: Any = ask(nvml, "nvmlDeviceGetFieldValues", handle, [NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
    if not values or values[0].nvmlReturn != 0:
        return None
    action = int(values[0].value.uiVal)
    return RECOVERY_ACTIONS.get(action, f"action {action}")


def nvml_device_health(nvml: Any, handle: object) -> dict[str, Any]:
    """The facts of facts schema 3 an operator reads first: temperature, why the clocks are held down, the GPU's own
    PCIe maximum, firmware versions, retired pages waiting for a reboot, and the driver's recovery action."""
    pending = _int(ask(nvml, "nvmlDeviceGetRetiredPagesPendingStatus", handle))
    vbios, inforom = ask(nvml, "nvmlDeviceGetVbiosVersion", handle), ask(nvml, "nvmlDeviceGetInforomImageVersion", handle)
    return {
        "temperature_c": _int(ask(nvml, "nvmlDeviceGetTemperature", handle, nvml.NVML_TEMPERATURE_GPU)),
        # NVML 12.2 (R535) renamed the call; NVML 11.4 (R470) has only nvmlDeviceGetCurrentClocksThrottleReasons.
        "clock_event_reasons": clock_event_names(_int(ask(nvml, "nvmlDeviceGetCurrentClocksEventReasons", handle,
                                                          older="nvmlDeviceGetCurrentClocksThrottleReasons"))),
        "pcie_gen_gpu_max": _int(ask(nvml, "nvmlDeviceGetGpuMaxPcieLinkGeneration", handle)),
        "vbios_version": _text(vbios) if vbios is not None else None,
        "inforom_image_version": _text(inforom) if inforom is not None else None,
        "retired_pages_pending": None if pending is None else pending == nvml.NVML_FEATURE_ENABLED,
        "recovery_action": nvml_recovery_action(nvml, handle),
    }


def nvml_info(nvml: Any, fabric: dict[str, Any] | None = None) -> dict[str, Any]:
    """GpuInfo through pynvml, and each GPU's fabric and NVLink links into fabric when given; raises NVMLError when
    NVML cannot start."""
    NVML_CALL_ERRORS.clear()
    nvml.nvmlInit()
    try:
        devices, lost = [], []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                devices.append(nvml_device(nvml, index))
            except nvml.NVMLError as e:
                lost.append(f"GPU {index}: {e}")  # a GPU that cannot even be named is left out, and said here
                continue
            if fabric is not None:
                gpu_fabric, links = nvml_fabric(nvml, nvml.nvmlDeviceGetHandleByIndex(index), index)
                gpu_fabric["pci"] = devices[-1]["pci_bus_id"]
                fabric["gpus"].append(gpu_fabric)
                fabric["nvlinks"].extend(links)
                if links and not any(link["active"] for link in links):
                    fabric.setdefault("nvlink_all_down", []).append(index)
        cuda = _int(ask(nvml, "nvmlSystemGetCudaDriverVersion"))
        driver = ask(nvml, "nvmlSystemGetDriverVersion")
        return {
            "source": "nvml",
            "error": "; ".join(lost) or None,
            "driver_version": _text(driver) if driver is not None else None,
            "cuda_driver_version": cuda_version_string(cuda) if cuda is not None else None,
            "devices": devices,
            "nvml_call_errors": list(NVML_CALL_ERRORS),
        }
    finally:
        ask(nvml, "nvmlShutdown")


def run_commands(commands: list[list[str]], timeout_s: float) -> list[tuple[int | None, str, str]]:
    """Run commands side by side under one deadline: (exit status or None, stdout, stderr) each."""
    import subprocess  # only here: nvidia-smi is the only command the probe runs

    started: list[subprocess.Popen[str] | OSError] = []
    for argv in commands:
        try:
            started.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        except OSError as e:
            started.append(e)
    deadline = time.monotonic() + timeout_s
    results: list[tuple[int | None, str, str]] = []
    for process in started:
        if isinstance(process, OSError):
            results.append((None, "", str(process)))
            continue
        try:
            stdout, stderr = process.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            # Not waited for again: a wedged GPU can hold nvidia-smi in uninterruptible sleep past any kill.
            process.kill()
            results.append((None, "", f"no answer within {timeout_s:g} s"))
            continue
        results.append((process.returncode, stdout, stderr))
    return results


def first_line(*texts: str) -> str:
    """The first non-empty line of the texts."""
    for text in texts:
        for line in text.splitlines():
            if line.strip():
                return line.strip()
    return ""


def cuda_driver_version() -> str | None:
    """The CUDA version the driver supports, from libcuda's cuDriverGetVersion (nvidia-smi has no query field for it)."""
    code = library_version("libcuda.so.1", "cuDriverGetVersion")
    return None if code is None else cuda_version_string(code)


def smi_info(fabric: dict[str, Any] | None = None) -> tuple[dict[str, Any] | None, str]:
    """GpuInfo through nvidia-smi (and the fabric and NVLink links into fabric when given), or None and the reason
    it could not be read."""
    smi = which("nvidia-smi")
    if smi is None:
        return None, "nvidia-smi: not found on PATH"
    queries = [("--query-gpu=", SMI_GPU_FIELDS), ("--query-compute-apps=", SMI_APP_FIELDS), ("--query-remapped-rows=", SMI_REMAP_FIELDS)]
    commands = [[smi, flag + ",".join(fields), "--format=csv,noheader,nounits"] for flag, fields in queries]
    commands.append([smi, "-q", "-x"])
    if fabric is not None:
        commands += [[smi, "-q"], [smi, "nvlink", "-s"], [smi, "nvlink", "-e"]]
    results = run_commands(commands, SMI_TIMEOUT_S)
    (gpu_status, gpu_out, gpu_err), (apps_status, apps_out, _), (remap_status, remap_out, _) = results[:3]
    if gpu_status != 0:
        return None, "nvidia-smi: " + (first_line(gpu_out, gpu_err) or f"exit status {gpu_status}")
    gpus = parse_smi_csv(gpu_out, SMI_GPU_FIELDS)
    # The other two queries only add detail: where one fails, its fields are None rather than the whole GPU unknown.
    apps = parse_smi_csv(apps_out, SMI_APP_FIELDS) if apps_status == 0 else None
    remaps = parse_smi_csv(remap_out, SMI_REMAP_FIELDS) if remap_status == 0 else None
    devices = smi_devices(gpus, apps, remaps)
    xml_status, xml_out, _ = results[3]
    details = parse_smi_xml(xml_out) if xml_status == 0 else {}
    for device in devices:
        device.update(details.get((device["pci_bus_id"] or "").lower(), {}))
    if fabric is not None:
        (query_status, query_out, _), (links_status, links_out, _), (errors_status, errors_out, _) = results[4:]
        by_pci = {(d["pci_bus_id"] or "").lower(): d["index"] for d in devices}
        for position, block in enumerate(parse_smi_fabric(query_out) if query_status == 0 else []):
            index = by_pci.get(block["pci"] or "", position)
            fabric["gpus"].append({**block, "index": index})
        counted = parse_nvlink_errors(errors_out) if errors_status == 0 else {}
        for index, links in (parse_nvlink_status(links_out) if links_status == 0 else {}).items():
            fabric["nvlinks"].extend({**link, "gpu": index, "errors": counted.get(index, {}).get(link["link"])}
                                     for link in links)
        fabric["nvlink_all_down"] = nvlink_all_inactive(links_out) if links_status == 0 else []
    return {
        "source": "nvidia-smi",
        "error": None,
        "driver_version": gpus[0]["driver_version"] if gpus else None,
        "cuda_driver_version": cuda_driver_version(),
        "devices": devices,
        "nvml_call_errors": [],
    }, ""


# One of these exists wherever an NVIDIA driver is loaded: the kernel module's /proc entry, its
# control device (also inside containers given GPUs), or WSL2's GPU paravirtualisation device.
NVIDIA_DRIVER_MARKERS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/dxg")


def gpu_info(fabric: dict[str, Any] | None = None) -> dict[str, Any]:
    """GpuInfo: NVML through pynvml where it works, else nvidia-smi, else why neither could be read; each GPU's
    fabric and NVLink links go into fabric when given."""
    if not any(os.path.exists(marker) for marker in NVIDIA_DRIVER_MARKERS):
        # No driver to ask: skip pynvml's import and the nvidia-smi search (a CPU host's whole GPU cost).
        return {
            "source": "none", "error": "none of " + ", ".join(NVIDIA_DRIVER_MARKERS) + " exists (no kernel driver loaded)",
            "driver_version": None, "cuda_driver_version": None, "devices": [], "nvml_call_errors": [],
        }
    try:
        import pynvml
    except Exception as e:  # ImportError, or a pynvml too old or broken to import
        nvml_reason = "pynvml is not installed" if isinstance(e, ImportError) else f"pynvml cannot be imported: {e}"
    else:
        try:
            return nvml_info(pynvml, fabric)
        except pynvml.NVMLError as e:
            nvml_reason = f"NVML: {e}"
    if fabric is not None:
        fabric["gpus"].clear()
        fabric["nvlinks"].clear()  # what NVML managed before it failed
        fabric["nvlink_all_down"] = []
    info, smi_reason = smi_info(fabric)
    if info is not None:
        return info
    return {
        "source": "none", "error": f"{nvml_reason}; {smi_reason}", "driver_version": None, "cuda_driver_version": None,
        "devices": [], "nvml_call_errors": list(NVML_CALL_ERRORS),
    }



def struct_bytes(value: object, field: str, size: int) -> bytes | None:
    """The raw bytes of a ctypes structure's array field: reading it as an attribute would stop a char array at its
    first zero byte, and a UUID has many."""
    try:
        offset = getattr(type(value), field).offset
        return ctypes.string_at(ctypes.addressof(value) + offset, size)  # type: ignore[arg-type]
    except (AttributeError, TypeError):
        return None


def nvml_fabric_info(nvml: Any, handle: object) -> Any:
    """One GPU's NVML fabric structure, filled in by the call as nvidia-ml-py declares it (device, structure): the
    versioned call with its v3 structure (which adds the health summary) where this pynvml and driver have it, else
    the first call (drivers before the versioned one); None where NVML cannot tell."""
    versioned = getattr(nvml, "c_nvmlGpuFabricInfo_v3_t", None)
    if versioned is not None:
        info = versioned()  # its constructor sets the version field the library checks
        if ask(nvml, "nvmlDeviceGetGpuFabricInfoV", handle, ctypes.byref(info)) is not None:
            return info
    plain = getattr(nvml, "c_nvmlGpuFabricInfo_t", None)
    if plain is not None:
        info = plain()
        if ask(nvml, "nvmlDeviceGetGpuFabricInfo", handle, ctypes.byref(info)) is not None:
            return info
    return None


def nvml_fabric(nvml: Any, handle: object, index: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One GPU's fabric registration and NVLink links through NVML (each None where NVML cannot tell)."""
    info = nvml_fabric_info(nvml, handle)
    state = FABRIC_STATES.get(_int(getattr(info, "state", None)) or 0) if info is not None else None
    status = _int(getattr(info, "status", None)) if info is not None else None
    fabric = {
        "index": index, "pci": None, "state": state,
        "status": None if status is None else "success" if status == 0 else f"error {status}",
        "clique_id": _int(getattr(info, "cliqueId", None)) if info is not None else None,
        "cluster_uuid": fabric_uuid(struct_bytes(info, "clusterUuid", 16)) if info is not None else None,
        "health_summary": FABRIC_HEALTH.get(_int(getattr(info, "healthSummary", None)) or 0),
    }
    links = []
    for link in range(NVLINK_MAX_LINKS):
        active = ask(nvml, "nvmlDeviceGetNvLinkState", handle, link)
        if active is None:
            break  # links are numbered from 0: the first one NVML cannot answer for ends the list
        errors = {name: _int(ask(nvml, "nvmlDeviceGetNvLinkErrorCounter", handle, link, counter))
                  for name, counter in NVLINK_ERROR_COUNTERS}
        links.append({"gpu": index, "link": link, "active": bool(active), "speed_gbps": None, "errors": errors})
    return fabric, links
