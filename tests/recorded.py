"""Facts from the real H100 recording (tests/data/h100-single-node), in the probe's format.

The recording was made by a plain pynvml + torch script before the probe existed; this maps its
fields one to one onto HostFacts. Nothing is invented: a field the recording lacks is None or
empty (for instance eth0's IPv4 address, which it did not record). Variants change only the
fields under test.
"""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"
H100 = DATA / "h100-single-node"

_RECORDED_AT = datetime(2026, 11, 22, 10, 18, 56, tzinfo=timezone.utc).timestamp()
_COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}


def _int_or_none(text: str) -> int | None:
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value < 0 else value


def _nccl_version(code: int) -> str:
    return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"


def _os_name() -> str:
    for line in (H100 / "os-release.txt").read_text().splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip('"')
    raise ValueError("no PRETTY_NAME in the recording")


def _smi_versions(bus_id: str) -> dict[str, str | None]:
    """VBIOS, InfoROM image and recovery action of one GPU in nvidia-smi-q.xml (facts.json did not record them)."""
    gpu = next(g for g in ElementTree.parse(H100 / "nvidia-smi-q.xml").getroot().iter("gpu") if g.get("id") == bus_id)
    action = gpu.findtext("gpu_recovery_action")
    return {"vbios_version": gpu.findtext("vbios_version"), "inforom_image_version": gpu.findtext("inforom_version/img_version"),
            "recovery_action": action.lower() if action else None}


def h100_facts() -> dict[str, Any]:
    """The H100 host's facts, as the probe would have printed them."""
    raw = json.loads((H100 / "facts.json").read_text())
    torch_nccl_lib = raw["libnccl_candidates"][0]
    system_lib = "/usr/lib/x86_64-linux-gnu/libnccl.so.2"
    site = torch_nccl_lib.split("/torch/")[0]
    gpus = []
    for g in raw["gpus"]:
        _corr, _unc, pending, failed = g["remapped_rows"]
        gpus.append({
            "index": g["index"], "name": g["name"], "uuid": g["uuid"], "pci_bus_id": g["pci_bus_id"],
            "memory_total_bytes": g["memory_total"], "memory_used_bytes": g["memory_used"],
            "ecc_enabled": g["ecc_mode"][0] == 1,
            "ecc_uncorrected_volatile": g["ecc_uncorrected_volatile"],
            "ecc_uncorrected_aggregate": g["ecc_uncorrected_aggregate"],
            "remapped_rows_pending": bool(pending), "remapped_rows_failed": bool(failed),
            "pcie_gen_current": g["pcie_gen_cur"], "pcie_gen_max": g["pcie_gen_max"],
            "pcie_width_current": g["pcie_width_cur"], "pcie_width_max": g["pcie_width_max"],
            "persistence_mode": g["persistence_mode"] == 1,
            "compute_mode": _COMPUTE_MODES[g["compute_mode"]],
            "mig_enabled": g["mig_mode"][0] == 1,
            "processes": [],  # the recording counted 0 compute processes
            # Facts schema 3's fields: pynvml's answers where facts.json has them, else nvidia-smi-q.xml of the sitting.
            "mig_pending_enabled": g["mig_mode"][1] == 1, "ecc_pending_enabled": g["ecc_mode"][1] == 1,
            "temperature_c": g["temperature_c"], "clock_event_reasons": [] if g["clocks_throttle_reasons"] == 0 else None,
            "pcie_gen_gpu_max": g["pcie_gen_gpu_max"], **_smi_versions(g["pci_bus_id"]),
            "retired_pages_pending": None,  # NotSupported in facts.json, N/A in the XML: H100 remaps rows instead
        })
    cuda = raw["cuda_driver_version"]
    interfaces = [
        {
            "name": name, "operstate": nic["operstate"], "mtu": int(nic["mtu"]),
            "speed_mbps": _int_or_none(nic["speed"]), "mac": nic["address"],
            # The recording has no addresses; loopback's is the same on every Linux host.
            "ipv4": ["127.0.0.1/8"] if name == "lo" else [],
            "loopback": nic["type"] == "772",
        }
        for name, nic in sorted(raw["net"].items())
    ]
    return {
        # nvidia-smi.txt was printed at the same sitting: Sun Nov 22 10:18:56 2026 (UTC).
        "probe": {"schema": 3, "started_unix_s": _RECORDED_AT, "elapsed_s": raw["nvml_total_s"]},
        "host": {
            "hostname": raw["hostname"], "fqdn": raw["fqdn"], "resolves_to": [raw["hostname_resolves_to"]],
            "resolve_error": None, "kernel": raw["kernel"], "os": _os_name(), "python": raw["python"],
            "python_executable": site.split("/lib/python")[0] + "/bin/python3",
        },
        "torch": {
            "installed": True, "version": raw["torch_version"], "cuda": raw["torch_cuda_version"],
            "location": site + "/torch", "nccl_version": raw["torch_nccl_version"], "nccl_library": torch_nccl_lib,
        },
        "nccl": {
            "system_version": _nccl_version(raw["libnccl_versions"][system_lib]), "system_library": system_lib,
            "env": {k: v for k, v in raw["env_nccl"].items() if k.startswith("NCCL_")},
            "conf_files": {}, "net_plugins": [],
        },
        "gpu": {
            "source": "nvml", "error": None, "driver_version": raw["driver_version"],
            "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}", "devices": gpus, "nvml_call_errors": [],
        },
        "resources": {"dev_shm_bytes": raw["dev_shm_bytes"], "memlock": raw["ulimit_memlock"]},
        "net": {"interfaces": interfaces, "infiniband": raw["infiniband"]},
        # Facts schema 2's sections, as far as the recording has them: no kernel log was recorded; nvidia-smi-q.xml's
        # <fabric> block is N/A throughout and NVLink is "Not Supported" (README); topo.txt gives the GPU's NUMA node.
        "kernel_log": {"source": None, "error": "not in the recording", "lookback_s": 0.0, "events": [], "truncated": False},
        "fabric": {
            "nvswitch_count": 0, "fabric_manager": {"installed": False, "running": None},
            "gpus": [{"index": g["index"], "pci": g["pci_bus_id"], "state": None, "status": None, "clique_id": None,
                      "cluster_uuid": None, "health_summary": None} for g in raw["gpus"]],
            "nvlinks": [],
        },
        "topology": {
            "devices": [{"pci": g["pci_bus_id"][-12:].lower(), "kind": "gpu", "name": None, "numa_node": 0, "root": None, "path": [],
                         "pcie_link": None}
                        for g in raw["gpus"]],
            "bridges": [], "iommu": {"groups": None, "cmdline": None, "gpu_domain": None},
            "numa_balancing": None, "peermem_loaded": None, "nvidia_open_module": None,
        },
    }


def variant(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """A copy of the H100 facts with one change applied."""
    facts = copy.deepcopy(h100_facts())
    change(facts)
    return facts
