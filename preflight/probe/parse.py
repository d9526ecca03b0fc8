"""Pure conversions of version codes, os-release, torch's version.py and nvidia-smi's output."""

from __future__ import annotations

import re

from preflight.probe.constants import CLOCK_EVENT_REASONS, COMPUTE_MODES, SMI_REASON_NAMES, SMI_RECOVERY_ACTIONS

# typing costs milliseconds to import on a plain python, and annotations here are never evaluated.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


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
            **dict.fromkeys(SMI_XML_FIELDS),  # from nvidia-smi -q -x (parse_smi_xml), where it could be read
        })
    return devices


SMI_XML_FIELDS = ("mig_pending_enabled", "ecc_pending_enabled", "temperature_c", "clock_event_reasons", "pcie_gen_gpu_max",
                  "vbios_version", "inforom_image_version", "retired_pages_pending", "recovery_action")


def smi_recovery_action(text: str | None) -> str | None:
    """nvidia-smi's GPU Recovery Action under NVML's name for it ("None" -> none, "Drain and Reset" -> drain_and_reset;
    the short forms "Reset" and "Reboot" seen in the field too); other text lower case, spaces as underscores."""
    if text is None:
        return None
    word = text.strip().lower()
    return SMI_RECOVERY_ACTIONS.get(word, word.replace(" ", "_"))


def parse_smi_xml(text: str) -> dict[str, dict[str, Any]]:
    """The schema-3 GPU facts ``nvidia-smi -q -x`` gives, per GPU bus id (lower case): each None where it says N/A."""
    import xml.etree.ElementTree as ElementTree  # only here: the nvidia-smi path is the fallback

    try:
        # The local driver's own output; ElementTree fetches no external entity (its DOCTYPE names a DTD file).
        root = ElementTree.fromstring(text)  # noqa: S314
    except ElementTree.ParseError:
        return {}
    found = {}
    for gpu in root.iter("gpu"):
        def cell(path: str, element: Any = gpu) -> str | None:
            node = element.find(path)
            return smi_value(node.text or "") if node is not None else None

        # Drivers before R535 name the block and its cells clocks_throttle_reasons / clocks_throttle_reason_*.
        reasons = gpu.find("clocks_event_reasons")
        reasons = reasons if reasons is not None else gpu.find("clocks_throttle_reasons")
        active = None
        if reasons is not None:
            states = {SMI_REASON_NAMES.get(name, name): (child.text or "").strip() for child in reasons
                      for name in [re.sub(r"^clocks_(?:event|throttle)_reason_", "", child.tag)]}
            active = [name for _, name in CLOCK_EVENT_REASONS if states.get(name) == "Active"]
        temperature = cell("temperature/gpu_temp")
        action = cell("gpu_recovery_action")
        found[(gpu.get("id") or "").lower()] = {
            "mig_pending_enabled": smi_bool(cell("mig_mode/pending_mig")),
            "ecc_pending_enabled": smi_bool(cell("ecc_mode/pending_ecc")),
            "temperature_c": smi_int(temperature.split()[0]) if temperature else None,
            "clock_event_reasons": active,
            "pcie_gen_gpu_max": smi_int(cell("pci/pci_gpu_link_info/pcie_gen/max_device_link_gen")),
            "vbios_version": cell("vbios_version"),
            "inforom_image_version": cell("inforom_version/img_version"),
            "retired_pages_pending": smi_bool(cell("retired_pages/pending_retirement")),
            "recovery_action": smi_recovery_action(action),
        }
    return found
