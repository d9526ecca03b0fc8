"""preflight's probe: print this host's facts as one JSON object (see facts.py and schemas/facts.schema.json).

It is sent to each host as text and run as ``python3 -``; ``python3 preflight/probe.py`` runs it too. It uses the
standard library only (and ``pynvml`` where the host has it), so a host needs nothing beyond its training environment.
It reports and never judges. It never imports torch, which takes seconds on a GPU host. What it cannot read becomes a
fact (None, an empty list, an error string) and it exits 0; only a bug in the probe itself ends it otherwise.
"""

from __future__ import annotations

import os
import sys

# Run as `python3 -`, the first import path is the folder the remote shell starts in; run as a file, it is preflight/.
# A json.py or a torch/ there is not the training environment's, so neither may shadow what the job will import.
if __name__ == "__main__" and sys.path and not sys.flags.isolated and not getattr(sys.flags, "safe_path", False):
    del sys.path[0]

import array
import ctypes
import fcntl
import glob
import importlib.util
import json
import re
import resource
import socket
import struct
import threading
import time

# typing costs milliseconds to import on a plain python, and annotations here are never evaluated.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SCHEMA_VERSION = 1
LOOKUP_TIMEOUT_S = 5.0  # a resolver that has not answered by then is as good as broken for a rendezvous
SMI_TIMEOUT_S = 5.0
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "GLOO_")
ENV_NAMES = ("CUDA_VISIBLE_DEVICES",)
COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
SIOCGIFCONF = 0x8912
SIOCGIFNETMASK = 0x891B
ARPHRD_LOOPBACK = 772
IFF_LOOPBACK = 0x8

SMI_GPU_FIELDS = (
    "index", "uuid", "pci.bus_id", "memory.total", "memory.used", "ecc.mode.current",
    "ecc.errors.uncorrected.volatile.total", "ecc.errors.uncorrected.aggregate.total",
    "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max",
    "persistence_mode", "compute_mode", "mig.mode.current", "driver_version",
    "name",  # last: the only free text, so a comma in it cannot shift the other columns
)
SMI_APP_FIELDS = ("gpu_uuid", "pid", "used_memory", "process_name")
SMI_REMAP_FIELDS = ("gpu_bus_id", "remapped_rows.pending", "remapped_rows.failure")


# ---------------------------------------------------------------------------------------------------------------------
# Pure conversions (tested on their own)


def nccl_version_string(code: int) -> str | None:
    """ncclGetVersion's code as text: 22809 -> "2.28.9"; codes before NCCL 2.9 are major*1000+minor*100+patch."""
    if code <= 0:
        return None
    if code < 10000:
        return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"
    return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"


def cuda_version_string(code: int) -> str | None:
    """A CUDA version code as text: 13000 -> "13.0", 12040 -> "12.4"."""
    if code <= 0:
        return None
    return f"{code // 1000}.{code % 1000 // 10}"


def parse_os_release(text: str) -> dict[str, str]:
    """KEY=VALUE pairs of an os-release file, quotes removed."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if not sep or key.startswith("#"):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        fields[key] = value
    return fields


_TORCH_VERSION = re.compile(r"""^__version__\s*(?::[^=\n]*)?=\s*['"]([^'"\n]+)['"]""", re.MULTILINE)
_TORCH_CUDA = re.compile(r"""^cuda\s*(?::[^=\n]*)?=\s*(?:['"]([^'"\n]*)['"]|None\b)""", re.MULTILINE)


def parse_torch_version_py(text: str) -> tuple[str | None, str | None]:
    """(__version__, cuda) from the text of torch/version.py; cuda is None for a CPU build."""
    version = _TORCH_VERSION.search(text)
    cuda = _TORCH_CUDA.search(text)
    return (version.group(1) if version else None, (cuda.group(1) or None) if cuda else None)


def parse_nccl_conf(text: str) -> dict[str, str]:
    """KEY=VALUE pairs of an nccl.conf, read as NCCL reads them."""
    pairs = {}
    for line in text.splitlines():
        # NCCL skips '#' lines and lines without '=', and keeps both sides verbatim: a key with a stray
        # space is not the variable it looks like, so it is reported as it is.
        if line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        pairs[key] = value
    return pairs


def sysfs_state(text: str | None) -> str:
    """The name in an InfiniBand state file: "4: ACTIVE" -> "ACTIVE", "5: LinkUp" -> "LinkUp"."""
    if not text:
        return "unknown"
    return text.partition(":")[2].strip() or text.strip()


def smi_value(text: str) -> str | None:
    """One nvidia-smi CSV cell, None where it says it cannot tell ("[N/A]", "[Not Supported]", "[GPU is lost]")."""
    text = text.strip()
    if not text or text in ("N/A", "Not Supported") or (text.startswith("[") and text.endswith("]")):
        return None
    return text


def parse_smi_csv(text: str, fields: tuple[str, ...]) -> list[dict[str, str | None]]:
    """Rows of ``nvidia-smi --query-*=FIELDS --format=csv,noheader,nounits`` as dicts; the last field takes any commas."""
    rows = []
    for line in text.splitlines():
        cells = line.split(",", len(fields) - 1)
        if len(cells) != len(fields):
            continue  # a warning line, not a row
        rows.append({field: smi_value(cells[i]) for i, field in enumerate(fields)})
    return rows


def smi_int(text: str | None) -> int | None:
    """An integer cell, or None."""
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def smi_mib(text: str | None) -> int | None:
    """A MiB cell (nounits) in bytes, or None."""
    mib = smi_int(text)
    return None if mib is None else mib * 1024 * 1024


def smi_bool(text: str | None) -> bool | None:
    """Enabled/Disabled, Yes/No or a count as a bool, or None."""
    if text is None:
        return None
    word = text.strip().lower()
    if word in ("enabled", "yes", "true", "on"):
        return True
    if word in ("disabled", "no", "false", "off"):
        return False
    number = smi_int(word)
    return None if number is None else number != 0


def smi_devices(
    gpus: list[dict[str, str | None]],
    apps: list[dict[str, str | None]] | None,
    remaps: list[dict[str, str | None]] | None,
) -> list[dict[str, Any]]:
    """GpuDevice dicts from parsed nvidia-smi rows; apps or remaps is None when that query failed."""
    remap_by_bus = {(r["gpu_bus_id"] or "").lower(): r for r in remaps or []}
    devices = []
    for row in gpus:
        index = smi_int(row["index"])
        if index is None:
            continue
        uuid = row["uuid"] or ""
        bus_id = row["pci.bus_id"]
        remap = remap_by_bus.get((bus_id or "").lower()) if remaps is not None else None
        processes = None
        if apps is not None:
            processes = [
                {"pid": pid, "name": app["process_name"], "used_memory_bytes": smi_mib(app["used_memory"])}
                for app in apps
                if app["gpu_uuid"] == uuid and (pid := smi_int(app["pid"])) is not None
            ]
        mode = (row["compute_mode"] or "").lower()
        devices.append({
            "index": index,
            "name": row["name"] or "",
            "uuid": uuid,
            "pci_bus_id": bus_id,
            "memory_total_bytes": smi_mib(row["memory.total"]),
            "memory_used_bytes": smi_mib(row["memory.used"]),
            "ecc_enabled": smi_bool(row["ecc.mode.current"]),
            "ecc_uncorrected_volatile": smi_int(row["ecc.errors.uncorrected.volatile.total"]),
            "ecc_uncorrected_aggregate": smi_int(row["ecc.errors.uncorrected.aggregate.total"]),
            "remapped_rows_pending": smi_bool(remap["remapped_rows.pending"]) if remap else None,
            "remapped_rows_failed": smi_bool(remap["remapped_rows.failure"]) if remap else None,
            "pcie_gen_current": smi_int(row["pcie.link.gen.current"]),
            "pcie_gen_max": smi_int(row["pcie.link.gen.max"]),
            "pcie_width_current": smi_int(row["pcie.link.width.current"]),
            "pcie_width_max": smi_int(row["pcie.link.width.max"]),
            "persistence_mode": smi_bool(row["persistence_mode"]),
            "compute_mode": mode if mode in COMPUTE_MODES.values() else None,
            "mig_enabled": smi_bool(row["mig.mode.current"]),
            "processes": processes,
        })
    return devices


# ---------------------------------------------------------------------------------------------------------------------
# Small readers


def read_text(path: str) -> str | None:
    """The stripped text of a small file, or None when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:  # also EINVAL, which sysfs gives for a value the device does not have (a down link's speed)
        return None


def read_int(path: str) -> int | None:
    """An integer file (decimal, or hex with 0x), or None."""
    text = read_text(path)
    try:
        return int(text, 16 if text.startswith("0x") else 10) if text else None
    except ValueError:
        return None


def which(name: str) -> str | None:
    """The executable's path on PATH, found without importing shutil."""
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(folder or ".", name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def dedupe(items: list[str]) -> list[str]:
    """Items without repeats, first occurrence kept."""
    return list(dict.fromkeys(items))


# ---------------------------------------------------------------------------------------------------------------------
# host


def _lookup(hostname: str, out: dict[str, Any]) -> None:
    """Resolve hostname as torchrun does: out["addresses"] (or out["error"]), then out["fqdn"]."""
    try:
        infos = socket.getaddrinfo(hostname, None, 0, socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        out["error"] = str(e) or type(e).__name__
    else:
        out["addresses"] = dedupe([str(info[4][0]) for info in infos])
    # socket.getfqdn exactly, because torchrun's agent gives workers this name as MASTER_ADDR.
    out["fqdn"] = socket.getfqdn(hostname)


def start_lookup(hostname: str) -> tuple[threading.Thread, dict[str, Any], float]:
    """Start resolving hostname on a thread, so a slow resolver overlaps the rest and can be cut off at the deadline."""
    out: dict[str, Any] = {}
    thread = threading.Thread(target=_lookup, args=(hostname, out), name="lookup", daemon=True)
    thread.start()
    return thread, out, time.monotonic() + LOOKUP_TIMEOUT_S


def host_info(hostname: str, lookup: tuple[threading.Thread, dict[str, Any], float]) -> dict[str, Any]:
    """HostInfo: names, resolution, kernel, OS and this python."""
    thread, out, deadline = lookup
    thread.join(max(0.0, deadline - time.monotonic()))
    if "addresses" in out:
        addresses, error = out["addresses"], None
    else:
        addresses, error = [], out.get("error", f"getaddrinfo({hostname!r}) gave no answer within {LOOKUP_TIMEOUT_S:g} s")
    return {
        "hostname": hostname,
        "fqdn": out.get("fqdn") or hostname,  # getfqdn's own answer when it cannot tell
        "resolves_to": addresses,
        "resolve_error": error,
        "kernel": os.uname().release,
        "os": os_name(),
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
    }


def os_name() -> str:
    """PRETTY_NAME of os-release, or the kernel's name when there is none."""
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        text = read_text(path)
        if text is not None:
            fields = parse_os_release(text)
            return fields.get("PRETTY_NAME") or fields.get("NAME") or os.uname().sysname
    return os.uname().sysname


# ---------------------------------------------------------------------------------------------------------------------
# torch and NCCL


def find_libnccl(folder: str) -> str | None:
    """The libnccl in folder the dynamic linker would take: its soname first, then a versioned file, then the bare name."""
    try:
        names = sorted(n for n in os.listdir(folder) if n == "libnccl.so" or n.startswith("libnccl.so."))
    except OSError:
        return None
    versioned = [n for n in names if n != "libnccl.so"]
    if "libnccl.so.2" in versioned:
        return os.path.join(folder, "libnccl.so.2")
    if versioned or names:
        return os.path.join(folder, (versioned or names)[0])
    return None


def _library_version(path: str, symbol: str) -> int | None:
    """The integer a library's `int symbol(int *version)` reports, or None when it cannot be loaded or asked."""
    try:
        # RTLD_LOCAL: its symbols stay private, so torch's and the system's libnccl can both be asked in one process.
        library = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
        get_version = getattr(library, symbol)
    except (OSError, AttributeError):
        return None
    get_version.argtypes = [ctypes.POINTER(ctypes.c_int)]
    get_version.restype = ctypes.c_int
    code = ctypes.c_int(0)
    if get_version(ctypes.byref(code)) != 0:
        return None
    return code.value


def libnccl_version(path: str) -> str | None:
    """The version a libnccl reports through ncclGetVersion, or None when it cannot be loaded or asked."""
    code = _library_version(path, "ncclGetVersion")
    return None if code is None else nccl_version_string(code)


def torch_nccl_folders(torch_dir: str, cuda: str | None) -> list[str]:
    """Where the libnccl torch loads lives, in torch's order: pip's nvidia wheels beside torch, then torch/lib."""
    site = os.path.dirname(torch_dir)
    folders = [os.path.join(site, "nvidia", "nccl", "lib")]
    if cuda:
        folders.append(os.path.join(site, "nvidia", "cu" + cuda.split(".")[0], "lib"))  # CUDA 13 wheels' layout
    folders.append(os.path.join(torch_dir, "lib"))
    return folders


def nccl_wheel_version(site: str) -> str | None:
    """The version of the nvidia-nccl-cu* wheel installed beside torch, or None."""
    import importlib.metadata  # only here: it costs more to import than the whole common path

    for info in sorted(glob.glob(os.path.join(site, "nvidia_nccl_cu*.dist-info"))):
        try:
            version = importlib.metadata.Distribution.at(info).version
        except Exception:  # a dist-info without readable METADATA says nothing
            version = None
        if version:
            return str(version)
    return None


def torch_info() -> dict[str, Any]:
    """TorchInfo, read from torch's files without importing it."""
    info: dict[str, Any] = {
        "installed": False, "version": None, "cuda": None, "location": None, "nccl_version": None, "nccl_library": None,
    }
    try:
        spec = importlib.util.find_spec("torch")  # a top-level spec is found without running torch/__init__.py
    except (ImportError, ValueError):
        spec = None
    # A folder named torch without __init__.py (left behind by an uninstall) is a namespace package, not torch.
    if spec is None or spec.origin is None or not spec.submodule_search_locations:
        return info
    torch_dir = os.path.dirname(spec.origin)
    version_text = read_text(os.path.join(torch_dir, "version.py"))
    version, cuda = parse_torch_version_py(version_text) if version_text is not None else (None, None)
    if version is None:
        version = torch_dist_version()
    info.update(installed=True, version=version, cuda=cuda, location=torch_dir)
    site = os.path.dirname(torch_dir)
    for folder in torch_nccl_folders(torch_dir, cuda):
        library = find_libnccl(folder)
        if library is None:
            continue
        nccl = libnccl_version(library)
        if nccl is None and folder.startswith(os.path.join(site, "nvidia") + os.sep):
            nccl = nccl_wheel_version(site)  # the wheel's version is the library's, if the library will not load here
        info.update(nccl_version=nccl, nccl_library=library)
        break
    return info


def torch_dist_version() -> str | None:
    """torch's version from its installed metadata, for a torch whose version.py cannot be read."""
    import importlib.metadata  # only here: see nccl_wheel_version

    try:
        return str(importlib.metadata.version("torch"))
    except Exception:  # PackageNotFoundError, or metadata too broken to read: either way the host cannot tell
        return None


def ld_so_conf_folders(path: str, depth: int = 0) -> list[str]:
    """The folders an ld.so.conf lists, following its include lines."""
    text = read_text(path)
    if text is None or depth > 8:
        return []
    folders: list[str] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("hwcap "):
            continue
        if line.startswith("include "):
            for pattern in line.split()[1:]:
                pattern = pattern if os.path.isabs(pattern) else os.path.join(os.path.dirname(path), pattern)
                for included in sorted(glob.glob(pattern)):
                    folders += ld_so_conf_folders(included, depth + 1)
        else:
            folders.append(line.split()[0])
    return folders


def linker_folders() -> list[str]:
    """The folders the dynamic linker searches, in its order: LD_LIBRARY_PATH, ld.so.conf, the defaults."""
    machine = os.uname().machine
    folders = [f for f in os.environ.get("LD_LIBRARY_PATH", "").split(":") if f]
    folders += ld_so_conf_folders("/etc/ld.so.conf")
    folders += [
        f"/lib/{machine}-linux-gnu", f"/usr/lib/{machine}-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib",
        "/usr/local/lib", "/usr/local/cuda/lib64",
    ]
    return dedupe(folders)


def nccl_conf_paths() -> list[str]:
    """The files NCCL reads settings from: /etc/nccl.conf, and NCCL_CONF_FILE or else ~/.nccl.conf."""
    user = os.environ.get("NCCL_CONF_FILE") or os.path.join(os.path.expanduser("~"), ".nccl.conf")
    return dedupe(["/etc/nccl.conf", user])


def nccl_info(torch: dict[str, Any]) -> dict[str, Any]:
    """NcclInfo: the system's libnccl, the NCCL-related environment and nccl.conf files."""
    system_library = None
    for folder in linker_folders():
        system_library = find_libnccl(folder)
        if system_library is not None:
            break
    system_version = None
    if system_library is not None:
        same = torch["nccl_library"] and os.path.realpath(torch["nccl_library"]) == os.path.realpath(system_library)
        system_version = torch["nccl_version"] if same else libnccl_version(system_library)
    conf_files = {}
    for path in nccl_conf_paths():
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                conf_files[path] = parse_nccl_conf(f.read())
        except OSError:
            continue
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}
    return {"system_version": system_version, "system_library": system_library, "env": env, "conf_files": conf_files}


# ---------------------------------------------------------------------------------------------------------------------
# gpu


def _text(value: object) -> str:
    """A pynvml string, which older bindings return as bytes."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _int(value: object) -> int | None:
    """An integer pynvml value, or None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def ask(nvml: Any, call: str, *args: object) -> object:
    """nvml.<call>(*args), or None when NVML cannot tell: the call is looked up inside the guard, so a call this
    host's pynvml lacks makes only this fact unknown."""
    try:
        return getattr(nvml, call)(*args)
    except Exception:  # any NVMLError (NotSupported, NoPermission, GpuIsLost) or a call an older pynvml lacks
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
    }


def nvml_info(nvml: Any) -> dict[str, Any]:
    """GpuInfo through pynvml; raises NVMLError when NVML cannot start."""
    nvml.nvmlInit()
    try:
        devices, lost = [], []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                devices.append(nvml_device(nvml, index))
            except nvml.NVMLError as e:
                lost.append(f"GPU {index}: {e}")  # a GPU that cannot even be named is left out, and said here
        cuda = _int(ask(nvml, "nvmlSystemGetCudaDriverVersion"))
        driver = ask(nvml, "nvmlSystemGetDriverVersion")
        return {
            "source": "nvml",
            "error": "; ".join(lost) or None,
            "driver_version": _text(driver) if driver is not None else None,
            "cuda_driver_version": cuda_version_string(cuda) if cuda is not None else None,
            "devices": devices,
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


def _first_line(*texts: str) -> str:
    """The first non-empty line of the texts."""
    for text in texts:
        for line in text.splitlines():
            if line.strip():
                return line.strip()
    return ""


def cuda_driver_version() -> str | None:
    """The CUDA version the driver supports, from libcuda's cuDriverGetVersion (nvidia-smi has no query field for it)."""
    code = _library_version("libcuda.so.1", "cuDriverGetVersion")
    return None if code is None else cuda_version_string(code)


def smi_info() -> tuple[dict[str, Any] | None, str]:
    """GpuInfo through nvidia-smi, or None and the reason it could not be read."""
    smi = which("nvidia-smi")
    if smi is None:
        return None, "nvidia-smi: not found on PATH"
    queries = [("--query-gpu=", SMI_GPU_FIELDS), ("--query-compute-apps=", SMI_APP_FIELDS), ("--query-remapped-rows=", SMI_REMAP_FIELDS)]
    commands = [[smi, flag + ",".join(fields), "--format=csv,noheader,nounits"] for flag, fields in queries]
    (gpu_status, gpu_out, gpu_err), (apps_status, apps_out, _), (remap_status, remap_out, _) = run_commands(commands, SMI_TIMEOUT_S)
    if gpu_status != 0:
        return None, "nvidia-smi: " + (_first_line(gpu_out, gpu_err) or f"exit status {gpu_status}")
    gpus = parse_smi_csv(gpu_out, SMI_GPU_FIELDS)
    # The other two queries only add detail: where one fails, its fields are None rather than the whole GPU unknown.
    apps = parse_smi_csv(apps_out, SMI_APP_FIELDS) if apps_status == 0 else None
    remaps = parse_smi_csv(remap_out, SMI_REMAP_FIELDS) if remap_status == 0 else None
    return {
        "source": "nvidia-smi",
        "error": None,
        "driver_version": gpus[0]["driver_version"] if gpus else None,
        "cuda_driver_version": cuda_driver_version(),
        "devices": smi_devices(gpus, apps, remaps),
    }, ""


# One of these exists wherever an NVIDIA driver is loaded: the kernel module's /proc entry, its
# control device (also inside containers given GPUs), or WSL2's GPU paravirtualisation device.
NVIDIA_DRIVER_MARKERS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/dxg")


def gpu_info() -> dict[str, Any]:
    """GpuInfo: NVML through pynvml where it works, else nvidia-smi, else why neither could be read."""
    if not any(os.path.exists(marker) for marker in NVIDIA_DRIVER_MARKERS):
        # No driver to ask: skip pynvml's import and the nvidia-smi search (a CPU host's whole GPU cost).
        return {
            "source": "none", "error": "none of " + ", ".join(NVIDIA_DRIVER_MARKERS) + " exists (no kernel driver loaded)",
            "driver_version": None, "cuda_driver_version": None, "devices": [],
        }
    try:
        import pynvml
    except Exception as e:  # ImportError, or a pynvml too old or broken to import
        nvml_reason = "pynvml is not installed" if isinstance(e, ImportError) else f"pynvml cannot be imported: {e}"
    else:
        try:
            return nvml_info(pynvml)
        except pynvml.NVMLError as e:
            nvml_reason = f"NVML: {e}"
    info, smi_reason = smi_info()
    if info is not None:
        return info
    return {
        "source": "none", "error": f"{nvml_reason}; {smi_reason}", "driver_version": None, "cuda_driver_version": None,
        "devices": [],
    }


# ---------------------------------------------------------------------------------------------------------------------
# resources and network


def resource_info() -> dict[str, Any]:
    """ResourceInfo: the size of /dev/shm and the locked-memory limit RDMA needs."""
    try:
        shm = os.statvfs("/dev/shm")
        dev_shm: int | None = shm.f_blocks * shm.f_frsize
    except OSError:
        dev_shm = None
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        memlock: int | str | None = "unlimited" if soft == resource.RLIM_INFINITY else soft
    except (OSError, ValueError):
        memlock = None
    return {"dev_shm_bytes": dev_shm, "memlock": memlock}


def ipv4_addresses() -> dict[str, list[str]]:
    """Every interface's IPv4 addresses as "address/prefix", read with ioctls because hosts may lack the ip command."""
    ifreq_size = 40 if struct.calcsize("P") == 8 else 32  # struct ifreq: 16-byte name, then a 24- or 16-byte union
    addresses: dict[str, list[str]] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        size = 32 * ifreq_size
        while True:
            buffer = array.array("B", bytes(size))
            request = struct.pack("iP", size, buffer.buffer_info()[0])  # struct ifconf: length, pointer to the buffer
            used = struct.unpack("iP", fcntl.ioctl(sock.fileno(), SIOCGIFCONF, request))[0]
            if used < size:  # a full buffer may have been cut short
                break
            size *= 2
        data = buffer.tobytes()
        for offset in range(0, used - ifreq_size + 1, ifreq_size):
            ifreq = data[offset:offset + ifreq_size]
            label = ifreq[:16].split(b"\0", 1)[0].decode("utf-8", "replace")
            try:
                # The ifreq as returned carries label and address, so the kernel answers for this very address,
                # not the label's first one.
                mask = fcntl.ioctl(sock.fileno(), SIOCGIFNETMASK, ifreq)
            except OSError:
                continue
            prefix = bin(struct.unpack("!I", mask[20:24])[0]).count("1")
            # An alias label such as eth0:1 is an address of eth0.
            addresses.setdefault(label.split(":", 1)[0], []).append(f"{socket.inet_ntoa(ifreq[20:24])}/{prefix}")
    return addresses


def interfaces() -> list[dict[str, Any]]:
    """Every network interface in /sys/class/net with its state, MTU, speed, MAC and IPv4 addresses."""
    root = "/sys/class/net"
    try:
        names = sorted(n for n in os.listdir(root) if os.path.isdir(os.path.join(root, n)))  # not bonding_masters
    except OSError:
        return []
    try:
        ipv4 = ipv4_addresses()
    except OSError:
        ipv4 = {}
    found = []
    for name in names:
        folder = os.path.join(root, name)
        speed = read_int(os.path.join(folder, "speed"))
        flags = read_int(os.path.join(folder, "flags"))
        found.append({
            "name": name,
            "operstate": read_text(os.path.join(folder, "operstate")) or "unknown",
            "mtu": read_int(os.path.join(folder, "mtu")),
            "speed_mbps": speed if speed is not None and speed >= 0 else None,  # virtual NICs say -1
            "mac": read_text(os.path.join(folder, "address")) or None,
            "ipv4": ipv4.get(name, []),
            "loopback": read_int(os.path.join(folder, "type")) == ARPHRD_LOOPBACK or bool((flags or 0) & IFF_LOOPBACK),
        })
    return found


def infiniband_ports() -> list[dict[str, Any]]:
    """Every port of every RDMA device in /sys/class/infiniband."""
    root = "/sys/class/infiniband"
    try:
        devices = sorted(os.listdir(root))
    except OSError:
        return []
    ports = []
    for device in devices:
        folder = os.path.join(root, device, "ports")
        try:
            numbers = sorted(int(p) for p in os.listdir(folder) if p.isdigit())
        except OSError:
            continue
        for number in numbers:
            port = os.path.join(folder, str(number))
            ports.append({
                "device": device,
                "port": number,
                "state": sysfs_state(read_text(os.path.join(port, "state"))),
                "phys_state": sysfs_state(read_text(os.path.join(port, "phys_state"))),
                "rate": read_text(os.path.join(port, "rate")) or None,
                "link_layer": read_text(os.path.join(port, "link_layer")) or None,
            })
    return ports


# ---------------------------------------------------------------------------------------------------------------------


def collect() -> dict[str, Any]:
    """This host's facts (HostFacts)."""
    started, clock = time.time(), time.perf_counter()
    hostname = socket.gethostname()
    lookup = start_lookup(hostname)
    torch = torch_info()
    facts: dict[str, Any] = {
        "probe": {"schema": SCHEMA_VERSION, "started_unix_s": started, "elapsed_s": 0.0},
        "host": {},
        "torch": torch,
        "nccl": nccl_info(torch),
        "gpu": gpu_info(),
        "resources": resource_info(),
        "net": {"interfaces": interfaces(), "infiniband": infiniband_ports()},
    }
    facts["host"] = host_info(hostname, lookup)  # last: the lookup ran while everything else was read
    facts["probe"]["elapsed_s"] = round(time.perf_counter() - clock, 6)
    return facts


def main() -> int:
    """Print the facts as one JSON object."""
    print(json.dumps(collect(), allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
