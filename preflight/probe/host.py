"""The host's name and OS, torch and NCCL as the job will load them."""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import socket
import sys
import threading
import time

from preflight.hostlib.files import read_text
from preflight.probe.constants import ENV_NAMES, ENV_PREFIXES, LOOKUP_TIMEOUT_S
from preflight.probe.parse import nccl_version_string, parse_nccl_conf, parse_os_release, parse_torch_version_py

# typing costs milliseconds to import on a plain python, and annotations here are never evaluated.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

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


def library_version(path: str, symbol: str) -> int | None:
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
    code = library_version(path, "ncclGetVersion")
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
    folders = linker_folders() + ([os.path.dirname(torch["nccl_library"])] if torch["nccl_library"] else [])
    return {"system_version": system_version, "system_library": system_library, "env": env, "conf_files": conf_files,
            "net_plugins": net_plugins(dedupe(folders))}


def net_plugins(folders: list[str]) -> list[str]:
    """The NCCL network plugins (libnccl-net*.so*) in folders, which NCCL dlopens by that name at init."""
    found = []
    for folder in folders:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        found += [os.path.join(folder, n) for n in names if n.startswith("libnccl-net") and ".so" in n]
    return found
