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
    from collections.abc import Iterator
    from typing import Any

SCHEMA_VERSION = 4
LOOKUP_TIMEOUT_S = 5.0  # a resolver that has not answered by then is as good as broken for a rendezvous
SMI_TIMEOUT_S = 5.0
JOURNAL_TIMEOUT_S = 3.0  # journalctl over a large journal: the kernel log is a detail, not worth a stalled probe
KERNEL_LOG_LOOKBACK_S = 24 * 3600  # the checks' window (thresholds.xid_window_h) is at most this
KERNEL_LOG_TAIL_BYTES = 4 << 20  # of /var/log/kern.log: its last lines, never the whole file
KERNEL_LOG_MAX_EVENTS = 128  # distinct (kind, PCI address, code) kept; a storm of one Xid is one event with a count
KMSG_MAX_RECORDS = 200_000  # the ring buffer holds far fewer; a bound on the read loop all the same
IB_COUNTERS = ("link_downed", "symbol_error", "port_rcv_errors", "link_error_recovery", "port_xmit_discards",
               "local_link_integrity_errors", "excessive_buffer_overrun_errors")
# hw_counters/ (mlx5) of congestion and transport errors (the driver's own counters; none counts link downs).
IB_HW_COUNTERS = ("out_of_buffer", "out_of_sequence", "local_ack_timeout_err", "packet_seq_err",
                  "implied_nak_seq_err", "rnr_nak_retry_err", "req_cqe_error", "resp_cqe_error", "roce_adp_retrans",
                  "roce_adp_retrans_to", "roce_slow_restart", "np_cnp_sent", "rp_cnp_handled", "np_ecn_marked_roce_packets")
NVLINK_ERROR_COUNTERS = (("replay", 0), ("recovery", 1), ("crc_flit", 2), ("crc_data", 3))  # NVML_NVLINK_ERROR_DL_*
# `nvidia-smi nvlink -e`'s names for the same counters (its "CRC Errors" is the flit CRC, DL_CRC_FLIT).
SMI_NVLINK_ERRORS = {"Replay Errors": "replay", "Recovery Errors": "recovery", "CRC Errors": "crc_flit",
                     "CRC Data Errors": "crc_data"}
NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}  # NVML_GPU_FABRIC_STATE_*
FABRIC_HEALTH = {1: "Healthy", 2: "Unhealthy", 3: "Limited Capacity"}  # NVML_GPU_FABRIC_HEALTH_SUMMARY_*, as nvidia-smi says
# NVML's clocks event reason bits (nvmlClocksEventReason*) under the names nvidia-smi -q -x gives them.
CLOCK_EVENT_REASONS = ((0x1, "gpu_idle"), (0x2, "applications_clocks_setting"), (0x4, "sw_power_cap"), (0x8, "hw_slowdown"),
                       (0x10, "sync_boost"), (0x20, "sw_thermal_slowdown"), (0x40, "hw_thermal_slowdown"),
                       (0x80, "hw_power_brake_slowdown"), (0x100, "display_clock_setting"))
RECOVERY_ACTIONS = {0: "none", 1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p", 4: "drain_and_reset",  # NVML_GPU_RECOVERY_ACTION_*
                    5: "recover_imex_domain", 6: "bus_reset", 7: "system_reboot"}
# nvidia-smi's XML cell for NVML's DisplayClockSetting reason says "clocks" (R460 and R580 captures alike).
_SMI_REASON_NAMES = {"display_clocks_setting": "display_clock_setting"}
SMI_RECOVERY_ACTIONS = {"gpu reset": "gpu_reset", "reset": "gpu_reset", "node reboot": "node_reboot", "reboot": "node_reboot",
                        "drain p2p": "drain_p2p", "drain and reset": "drain_and_reset", "system reboot": "system_reboot"}
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230  # nvml.h; older pynvml lack the name
NVML_CALL_ERRORS: list[str] = []  # this run's NVML calls that failed other than by NVML's answer (see ask)
NVML_CALL_ERRORS_MAX = 32
# The ACS control register's bits (PCIe base spec 7.7.8.3) under the names lspci -vvv prints for them.
ACS_FLAGS = ("SrcValid", "TransBlk", "ReqRedir", "CmpltRedir", "UpstreamFwd", "EgressCtrl", "DirectTrans")
PCI_EXT_CAP_ACS = 0x000D
FABRIC_MANAGER_UNITS = ("/lib/systemd/system/nvidia-fabricmanager.service", "/usr/lib/systemd/system/nvidia-fabricmanager.service",
                        "/etc/systemd/system/nvidia-fabricmanager.service")
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
            states = {_SMI_REASON_NAMES.get(name, name): (child.text or "").strip() for child in reasons
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


# ---------------------------------------------------------------------------------------------------------------------
# Pure readings of the kernel log, nvidia-smi's fabric and NVLink text, and PCI config space (tested on recordings)

# "Xid (PCI:0000:3b:00): 79, ..."; drivers before R450 printed "Xid (0000:3b:00): 13, ..." without "PCI:". A MIG
# instance's Xid names its GPU instance, and from R570 its compute instance, after the address (kernel_rc.c's
# "Xid (PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u): %d"): the event is the GPU's.
# Support bundles and some journals redact the address ("Xid (PCI:...): 145, ..."): the line still counts, its device
# unknown (xid_address gives "").
XID_LINE = re.compile(r"\b(S?Xid) \((?:PCI:)?([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?|[^()\s]*)"
                      r"(?: GPU-I:\d+(?: GPU-CI:\d+)?)?\): (\d+)(?:, ?(.*))?")
_XID_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}(?:\.[0-7])?$")
# An SXid event is a headline ("Fatal, Link 30 LTSSM Fault Up") followed by lines of the same code that carry no
# severity ("Severity 1 Engine instance ...", "Data {...}"); an NVLink5 Xid (144-150) names it ("... Nonfatal XC0 ...").
_XID_DETAIL = re.compile(r"^(?:Severity (\d)|Data \{)")
_XID_SEVERITY = re.compile(r"(?:^|[\s,])(Fatal|Non-?fatal)(?=[\s,]|$)", re.IGNORECASE)
# R570 and later print a GPU that fell off the bus over several lines with no Xid line: "NVRM: The NVIDIA GPU
# 0000:b3:00.0", "NVRM: (PCI ID: 10de:26b5) installed in this system has", "NVRM: fallen off the bus and is not
# responding to commands."; others print "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus." beside their Xid 79.
_FALLEN_GPU = re.compile(r"NVRM: (?:The NVIDIA GPU|GPU) (?:([0-9A-Fa-f]{4}):)?([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.[0-7]\b")
FALLEN_OFF_XID = 79  # NVIDIA's catalogue: "GPU has fallen off the bus"
# A GPU that never initialized prints no Xid before R580's FSP checks: osinit.c's NV_DEV_PRINTF "RmInitAdapter failed!
# (0x%x:0x%x:%d)" (515 to 595), after "NVRM: GPU %04x:%02x:%02x.%x: ". It is read as the catalogue's Xid 143,
# GPU_INIT_ERROR ("GPU initialization failure"), which the driver itself prints for some of these failures.
INIT_FAILED_LINE = re.compile(r"NVRM: GPU (?:([0-9A-Fa-f]{4}):)?([0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})\.[0-7]: RmInitAdapter failed! "
                          r"\((0x[0-9A-Fa-f]+:0x[0-9A-Fa-f]+:\d+)\)")
INIT_FAILED_XID = 143
_KMSG = re.compile(r"^\d+,\d+,(\d+),[^;]*;")
_UNIX_PREFIX = re.compile(r"^(\d{9,11}\.\d+) ")
_ISO_TIME = re.compile(r"(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)(?:[.,](\d+))?(Z|[+-]\d\d:?\d\d)?")
_CTIME_BRACKET = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]")
_SYSLOG_TIME = re.compile(r"^(\w{3}) +(\d+) (\d\d:\d\d:\d\d) ")
_MONOTONIC_BRACKET = re.compile(r"^\[ *(\d+\.\d+)\]")


def kernel_line_time(line: str, boot_unix_s: float | None, now_unix_s: float) -> float | None:
    """When a kernel log line was written (unix seconds), from whichever stamp it carries: /dev/kmsg's microseconds
    since boot, journalctl's short-unix, ISO 8601 (dmesg --time-format iso, rsyslog), dmesg -T, classic syslog (no
    year: the latest date not in the future), or dmesg's [seconds since boot]. None when it carries none."""
    match = _KMSG.match(line)
    if match:
        return boot_unix_s + int(match.group(1)) / 1e6 if boot_unix_s is not None else None
    match = _UNIX_PREFIX.match(line)
    if match:
        return float(match.group(1))
    match = _ISO_TIME.search(line[:64])
    if match:
        import datetime  # only here: most lines never need it

        day, clock, fraction, zone = match.groups()
        zone = zone or ""
        if zone == "Z":
            zone = "+00:00"
        elif zone and ":" not in zone:
            zone = zone[:3] + ":" + zone[3:]
        try:
            moment = datetime.datetime.fromisoformat(f"{day}T{clock}{zone}")
        except ValueError:
            return None
        seconds = moment.timestamp() if moment.tzinfo else time.mktime(moment.timetuple())
        return seconds + (float("0." + fraction) if fraction else 0.0)
    match = _CTIME_BRACKET.match(line)
    if match:
        try:
            return time.mktime(time.strptime(match.group(1), "%a %b %d %H:%M:%S %Y"))
        except ValueError:
            return None
    match = _SYSLOG_TIME.match(line)
    if match:
        year = time.localtime(now_unix_s).tm_year
        for candidate in (year, year - 1):
            try:
                text = f"{candidate} {match.group(1)} {match.group(2)} {match.group(3)}"
                stamp = time.mktime(time.strptime(text, "%Y %b %d %H:%M:%S"))
            except ValueError:
                return None
            if stamp <= now_unix_s + 60:
                return stamp
        return None
    match = _MONOTONIC_BRACKET.match(line)
    if match and boot_unix_s is not None:
        return boot_unix_s + float(match.group(1))
    return None


def xid_address(match: re.Match[str]) -> str:
    """The device address of an XID_LINE match in lower case, or "" where the line's is redacted or unknown."""
    text = match.group(2).lower()
    return text if _XID_ADDRESS.match(text) else ""


def xid_events(lines: list[str], boot_unix_s: float | None, now_unix_s: float,
               since_unix_s: float | None = None) -> tuple[list[dict[str, Any]], bool]:
    """The Xid and SXid lines among lines, one event per (kind, PCI address, code) with its count, first and last
    time, last headline message and whether a line of it said Fatal (True), only Non-fatal (False) or neither (None);
    a GPU fallen off the bus with no Xid line is its Xid 79. Lines stamped before since_unix_s are left out. Also
    whether events were dropped for the bound KERNEL_LOG_MAX_EVENTS."""
    events: dict[tuple[str, str, int], dict[str, Any]] = {}
    dropped = False
    fallen: dict[str, tuple[float | None, str]] = {}
    pending: str | None = None  # the GPU of a "The NVIDIA GPU ..." line whose "fallen off the bus" line may follow
    waited = 0  # lines since it: the message is three lines, so a GPU named earlier is no longer the one meant
    for line in lines:
        waited += 1
        if "Xid" not in line and "NVRM" in line and ("fallen off" in line or "The NVIDIA GPU" in line or pending):
            gpu = _FALLEN_GPU.search(line)
            if gpu is not None:
                pending, waited = f"{(gpu.group(1) or '0000').lower()}:{gpu.group(2).lower()}:{gpu.group(3).lower()}", 0
            if pending and waited <= 2 and "fallen off the bus" in line:
                stamp = kernel_line_time(line, boot_unix_s, now_unix_s)
                if since_unix_s is None or stamp is None or stamp >= since_unix_s:
                    fallen.setdefault(pending, (stamp, "GPU has fallen off the bus (no Xid line)"))
                pending = None
            continue
        init = INIT_FAILED_LINE.search(line) if "RmInitAdapter failed" in line else None
        if init is not None:
            kind, pci, code = "Xid", f"{(init.group(1) or '0000').lower()}:{init.group(2).lower()}", INIT_FAILED_XID
            text = f"RmInitAdapter failed! ({init.group(3)}): the GPU did not initialize (no Xid line)"
        else:
            if "Xid" not in line:
                continue
            pending = None
            match = XID_LINE.search(line)
            if match is None:
                continue
            kind, pci, code, text = match.group(1), xid_address(match), int(match.group(3)), (match.group(4) or "").strip()
        stamp = kernel_line_time(line, boot_unix_s, now_unix_s)
        if since_unix_s is not None and stamp is not None and stamp < since_unix_s:
            continue
        key = (kind, pci, code)
        event = events.get(key)
        if event is None:
            if len(events) >= KERNEL_LOG_MAX_EVENTS:
                dropped = True
                continue
            event = events[key] = {"kind": kind, "pci": pci, "code": code, "count": 0, "first_unix_s": stamp,
                                   "last_unix_s": stamp, "message": "", "fatal": None}
        if stamp is not None:
            event["first_unix_s"] = stamp if event["first_unix_s"] is None else min(event["first_unix_s"], stamp)
            event["last_unix_s"] = stamp if event["last_unix_s"] is None else max(event["last_unix_s"], stamp)
        detail = _XID_DETAIL.match(text)
        if detail:  # a detail line of a headline (which may come after it): never counted
            event["message"] = event["message"] or text[:240]
            # The NVSwitch driver prints its error's severity here (error_nvswitch.c's "Severity %d", the enum
            # NVSWITCH_ERROR_SEVERITY_NONFATAL = 0, _FATAL = 1): a log that kept only this line still says it.
            if kind == "SXid" and detail.group(1) in ("0", "1") and not event["fatal"]:
                event["fatal"] = detail.group(1) == "1"
            continue
        event["count"] += 1
        severity = _XID_SEVERITY.search(text)
        fatal = None if severity is None else severity.group(1).lower() == "fatal"
        if fatal is not None and not event["fatal"]:
            event["fatal"] = fatal
        if not (event["fatal"] and fatal is False):  # a fatal line's words stay once one was seen
            event["message"] = text[:240]
    for event in events.values():
        event["count"] = max(event["count"], 1)  # an event seen only by its detail lines
    for pci, (stamp, text) in fallen.items():
        if not any(k[0] == "Xid" and k[2] == FALLEN_OFF_XID and k[1] == pci for k in events):
            events[("Xid", pci, FALLEN_OFF_XID)] = {"kind": "Xid", "pci": pci, "code": FALLEN_OFF_XID, "count": 1,
                                                     "first_unix_s": stamp, "last_unix_s": stamp, "message": text,
                                                     "fatal": None}
    return list(events.values()), dropped


def fabric_uuid(data: bytes | None) -> str | None:
    """NVML's 16-byte cluster UUID as text, or None when absent."""
    if data is None or len(data) < 16:
        return None
    text = data[:16].hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:32]}"


def parse_smi_fabric(text: str) -> list[dict[str, Any]]:
    """The Fabric blocks of ``nvidia-smi -q`` text, in GPU order: state, status, clique id, cluster UUID, health
    summary, each None where nvidia-smi says N/A; pci is the block's GPU bus id when the text has the GPU headers."""
    blocks: list[dict[str, Any]] = []
    pci: str | None = None
    indent: int | None = None
    block: dict[str, Any] | None = None
    names = {"State": "state", "Status": "status", "CliqueId": "clique_id", "ClusterUUID": "cluster_uuid", "Summary": "health_summary"}
    for raw in text.splitlines():
        stripped = raw.strip()
        if raw.startswith("GPU ") and re.match(r"GPU [0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d", raw):
            pci, block = raw.split()[1].lower(), None
            continue
        depth = len(raw) - len(raw.lstrip())
        if stripped == "Fabric":
            indent = depth
            block = {"pci": pci, "state": None, "status": None, "clique_id": None, "cluster_uuid": None, "health_summary": None}
            blocks.append(block)
            continue
        if block is None or not stripped:
            continue
        if indent is not None and depth <= indent:
            block = None
            continue
        key, sep, value = stripped.partition(":")
        field = names.get(key.strip())
        if sep and field:
            block[field] = smi_value(value)
    for block in blocks:
        if block["state"] is not None:
            block["state"] = block["state"].lower().replace(" ", "_")
        block["clique_id"] = smi_int(block["clique_id"])
    return blocks


def smi_gpu_lines(text: str) -> Iterator[tuple[int, str]]:
    """nvidia-smi's per-GPU text (``nvlink -s``, ``nvlink -e``): (GPU index, stripped line) for each line under a
    "GPU N: name (UUID: ...)" header, and (N, "") for the header itself."""
    gpu: int | None = None
    for raw in text.splitlines():
        line = raw.strip()
        head = re.match(r"GPU (\d+):", line)
        if head:
            gpu = int(head.group(1))
            yield gpu, ""
        elif gpu is not None:
            yield gpu, line


def parse_nvlink_status(text: str) -> dict[int, list[dict[str, Any]]]:
    """``nvidia-smi nvlink -s`` text: per GPU index, each link's number, whether it is active and its GB/s."""
    links: dict[int, list[dict[str, Any]]] = {}
    for gpu, line in smi_gpu_lines(text):
        mine = links.setdefault(gpu, [])
        link = re.match(r"Link (\d+): (.*)", line)
        if link:
            speed = re.match(r"([\d.]+) GB/s", link.group(2))
            mine.append({"link": int(link.group(1)), "active": speed is not None,
                         "speed_gbps": float(speed.group(1)) if speed else None})
    return links


def nvlink_all_inactive(text: str) -> list[int]:
    """The GPUs for which ``nvidia-smi nvlink -s`` prints "Unable to retrieve NVLink information as all links are
    inActive" instead of Link lines: NVLink hardware whose every link is down."""
    return [gpu for gpu, line in smi_gpu_lines(text) if "all links are inactive" in line.lower()]


def parse_nvlink_errors(text: str) -> dict[int, dict[int, dict[str, int]]]:
    """``nvidia-smi nvlink -e`` text: per GPU index and link, the error counters it prints (SMI_NVLINK_ERRORS)."""
    found: dict[int, dict[int, dict[str, int]]] = {}
    for gpu, line in smi_gpu_lines(text):
        mine = found.setdefault(gpu, {})
        counter = re.match(r"Link (\d+): ([A-Za-z ]+): (\d+)$", line)
        if counter and counter.group(2) in SMI_NVLINK_ERRORS:
            mine.setdefault(int(counter.group(1)), {})[SMI_NVLINK_ERRORS[counter.group(2)]] = int(counter.group(3))
    return found


def parse_fabric_manager_version(text: str) -> str | None:
    """Fabric Manager's own version from ``nv-fabricmanager --version`` ("Fabric Manager version is : 550.90.07") or
    from the line it logs when it refuses a driver ("fabric manager NVIDIA GPU driver interface version 530.30.02
    don't match with driver version 530.41.03")."""
    match = re.search(r"(?:version is\s*:|driver interface version)\s*(\d+\.\d+(?:\.\d+)?)", text, re.IGNORECASE)
    return match.group(1) if match else None


def pci_acs_control(config: bytes) -> list[str] | None:
    """The flags set in the ACS control register of a PCI config space (the sysfs ``config`` file, 4096 bytes when
    readable in full), None when it has no ACS capability or only its first 256 bytes could be read."""
    offset, seen = 0x100, 0
    while 0x100 <= offset <= len(config) - 8 and seen < 256:  # a malformed list must not loop forever
        header = int.from_bytes(config[offset:offset + 4], "little")
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == PCI_EXT_CAP_ACS:
            control = int.from_bytes(config[offset + 6:offset + 8], "little")
            return [name for bit, name in enumerate(ACS_FLAGS) if control & (1 << bit)]
        offset, seen = (header >> 20) & 0xFFC, seen + 1
    return None


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


# ---------------------------------------------------------------------------------------------------------------------
# gpu


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
        return None, "nvidia-smi: " + (_first_line(gpu_out, gpu_err) or f"exit status {gpu_status}")
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


# ---------------------------------------------------------------------------------------------------------------------
# resources and network


def cgroup_folders(mount: str, path: str) -> list[str]:
    """A cgroup's folder under the hierarchy mounted at mount, then the folder of every group above it up to the mount."""
    parts = [part for part in path.split("/") if part]
    return [os.path.join(mount, *parts[:n]) for n in range(len(parts), -1, -1)]


def cgroup_cpu_quota(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> float | None:
    """The CPUs this process's cgroup quota lets it use: the smallest quota / period from its own group up to the
    hierarchy's root, as a parent's quota throttles every group under it (cgroup v1's cpu.cfs_quota_us over
    cpu.cfs_period_us, v2's cpu.max). None where no group on the way sets one. A container's CPU limit is such a quota;
    inside a container whose /proc/self/cgroup names a path its /sys does not have, the walk up reaches its own root."""
    text = read_text(proc_cgroup)
    if text is None:
        return None
    limits: list[float] = []
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if "cpu" in controllers.split(","):
            mount = next((m for m in (f"{root}/cpu", f"{root}/cpu,cpuacct") if os.path.isdir(m)), None)
            for folder in cgroup_folders(mount, path) if mount else []:
                quota, period = read_int(f"{folder}/cpu.cfs_quota_us"), read_int(f"{folder}/cpu.cfs_period_us")
                if quota is not None and quota > 0 and period:
                    limits.append(quota / period)
        elif controllers == "":
            for folder in cgroup_folders(root, path):
                quota_text, _, period_text = (read_text(f"{folder}/cpu.max") or "").partition(" ")
                if quota_text.isdigit() and period_text.isdigit() and int(period_text):
                    limits.append(int(quota_text) / int(period_text))
    return min(limits) if limits else None


def resource_info() -> dict[str, Any]:
    """ResourceInfo: the size of /dev/shm, the locked-memory limit RDMA needs, and the CPUs this host's processes get."""
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
    try:
        cpus: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count()
    return {"dev_shm_bytes": dev_shm, "memlock": memlock, "cpus": cpus, "cpu_quota": cgroup_cpu_quota()}


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


def infiniband_ports(sys_root: str = "/sys") -> list[dict[str, Any]]:
    """Every port of every RDMA device in /sys/class/infiniband, with its error counters and PCI address."""
    root = os.path.join(sys_root, "class", "infiniband")
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
        pci = os.path.basename(os.path.realpath(os.path.join(root, device, "device")))
        firmware = read_text(os.path.join(root, device, "fw_ver")) or None
        board = read_text(os.path.join(root, device, "board_id")) or None
        for number in numbers:
            port = os.path.join(folder, str(number))
            counters = {name: read_int(os.path.join(port, "counters", name)) for name in IB_COUNTERS}
            extended = {name: read_int(os.path.join(port, "hw_counters", name)) for name in IB_HW_COUNTERS}
            ports.append({
                "device": device,
                "port": number,
                "state": sysfs_state(read_text(os.path.join(port, "state"))),
                "phys_state": sysfs_state(read_text(os.path.join(port, "phys_state"))),
                "rate": read_text(os.path.join(port, "rate")) or None,
                "link_layer": read_text(os.path.join(port, "link_layer")) or None,
                "pci": pci if re.match(r"^[0-9a-f]{4}:", pci) else None,
                "counters": {k: v for k, v in counters.items() if v is not None},
                "hw_counters": {k: v for k, v in extended.items() if v is not None},
                "fw_ver": firmware,
                "board_id": board,
                "carrier_down_count": port_carrier_downs(os.path.join(root, device, "device", "net"), number),
                "netdev": port_netdev(os.path.join(root, device), number),
            })
    return ports


def port_device_name(net: str, port: int) -> str | None:
    """The network device of an HCA's port among device/net/*: the only one, or the one whose dev_port is port - 1
    (a two-port HCA); None without one."""
    try:
        names = sorted(os.listdir(net))
    except OSError:
        return None
    for name in names:
        if len(names) == 1 or read_int(os.path.join(net, name, "dev_port")) == port - 1:
            return name
    return None


def port_carrier_downs(net: str, port: int) -> int | None:
    """How often the port's network device lost its carrier (/sys/class/net/IF/carrier_down_count, Linux 4.16+): the
    count that does not stop where the 8-bit counters/link_downed does, at 255. None without a device."""
    name = port_device_name(net, port)
    return read_int(os.path.join(net, name, "carrier_down_count")) if name is not None else None


def port_netdev(hca: str, port: int) -> str | None:
    """The interface a port carries (which rail it is): RoCE's gid_attrs/ndevs/0 where the kernel has it (a RoCE bond's
    port names the bond, not a slave), else the HCA's own network device (IPoIB, or a RoCE NIC on an older kernel)."""
    name = read_text(os.path.join(hca, "ports", str(port), "gid_attrs", "ndevs", "0"))
    return name or port_device_name(os.path.join(hca, "device", "net"), port)


# ---------------------------------------------------------------------------------------------------------------------
# kernel log, fabric, topology


def boot_time(proc: str = "/proc") -> float | None:
    """The boot time in unix seconds (/proc/stat btime), which /dev/kmsg's stamps count from."""
    text = read_text(os.path.join(proc, "stat")) or ""
    for line in text.splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return None


def read_kmsg(path: str = "/dev/kmsg") -> list[str]:
    """Every record of the kernel's ring buffer, read without blocking (what dmesg reads); raises OSError when the
    host refuses (dmesg_restrict=1 without CAP_SYSLOG)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    records = []
    try:
        for _ in range(KMSG_MAX_RECORDS):
            try:
                chunk = os.read(fd, 8192)  # one record per read
            except BlockingIOError:
                break  # the end of the buffer
            except BrokenPipeError:
                continue  # a record was overwritten while reading: the next read resumes at the oldest one left
            if not chunk:
                break
            records.append(chunk.decode("utf-8", "replace").split("\n", 1)[0])
    finally:
        os.close(fd)
    return records


def read_tail(path: str, size: int) -> list[str]:
    """The last size bytes of a text file as lines (the first, likely cut, left out); raises OSError."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        length = f.tell()
        f.seek(max(0, length - size))
        lines = f.read().decode("utf-8", "replace").splitlines()
    return lines[1:] if length > size else lines


def kernel_log(now_unix_s: float) -> dict[str, Any]:
    """KernelLog: the Xid/SXid events of the last KERNEL_LOG_LOOKBACK_S, from the first source this host lets us
    read: the ring buffer (/dev/kmsg), the journal (journalctl -k), /var/log/kern.log. Reading none is a fact."""
    since = now_unix_s - KERNEL_LOG_LOOKBACK_S
    boot = boot_time()
    problems = []
    try:
        lines, source = read_kmsg(), "kmsg"
    except OSError as e:
        problems.append(f"/dev/kmsg: {e.strerror or e}")
        lines, source = None, None
    if lines is None and which("journalctl"):
        ((status, out, err),) = run_commands([["journalctl", "-k", "-o", "short-unix", "--no-pager", "-q", "-n", "100000",
                                               "--since", f"-{KERNEL_LOG_LOOKBACK_S}s"]], JOURNAL_TIMEOUT_S)
        if status == 0 and out.strip():
            lines, source = out.splitlines(), "journal"
        else:
            problems.append("journalctl -k: " + (_first_line(err, out) or f"exit status {status}, no lines"))
    if lines is None:
        for path in ("/var/log/kern.log", "/var/log/messages"):
            try:
                lines, source = read_tail(path, KERNEL_LOG_TAIL_BYTES), path
                break
            except OSError as e:
                problems.append(f"{path}: {e.strerror or e}")
    if lines is None:
        return {"source": None, "error": "; ".join(problems), "lookback_s": KERNEL_LOG_LOOKBACK_S, "events": [], "truncated": False}
    events, truncated = xid_events(lines, boot, now_unix_s, since)
    return {"source": source, "error": None, "lookback_s": KERNEL_LOG_LOOKBACK_S, "events": events, "truncated": truncated}


def fabric_manager(proc: str = "/proc") -> dict[str, Any]:
    """FabricManager: whether nvidia-fabricmanager is installed (its unit or binary) and whether nv-fabricmanager
    runs, read from /proc rather than systemctl (a process start on every host for one word)."""
    installed = any(os.path.exists(unit) for unit in FABRIC_MANAGER_UNITS) or which("nv-fabricmanager") is not None
    running = None
    if installed:
        running = False
        try:
            pids = [p for p in os.listdir(proc) if p.isdigit()]
        except OSError:
            pids = []
        for pid in pids[:100_000]:
            if (read_text(os.path.join(proc, pid, "comm")) or "").startswith("nv-fabricmanage"):  # comm is cut at 15
                running = True
                break
    version = None
    binary = which("nv-fabricmanager") if installed else None
    if binary is not None:  # only NVSwitch hosts have it: one short command there, none elsewhere
        ((status, out, err),) = run_commands([[binary, "--version"]], SMI_TIMEOUT_S)
        version = parse_fabric_manager_version(out + err) if status == 0 else None
    return {"installed": installed, "running": running, "version": version}


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


def pci_place(sys_root: str, bdf: str) -> dict[str, Any]:
    """Where a PCI function sits: its NUMA node, its root complex and the chain of bridges down to it (itself last)."""
    path = os.path.join(sys_root, "bus", "pci", "devices", bdf)
    real = os.path.realpath(path)
    numa = read_int(os.path.join(path, "numa_node"))
    return {"numa_node": numa if numa is not None and numa >= 0 else None,
            "root": next((part for part in real.split(os.sep) if part.startswith("pci")), None),
            "chain": [part for part in real.split(os.sep) if re.match(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", part)]}


def link_speed_gts(text: str | None) -> float | None:
    """A sysfs link speed ("32.0 GT/s PCIe", "8 GT/s") in GT/s, or None ("Unknown", unreadable)."""
    match = re.match(r"([\d.]+) GT/s", text or "")
    return float(match.group(1)) if match else None


def pcie_link(sys_root: str, bdf: str) -> dict[str, Any]:
    """A PCI function's PCIe link as sysfs gives it: current and maximum speed and width."""
    folder = os.path.join(sys_root, "bus", "pci", "devices", bdf)
    return {"speed_gts": link_speed_gts(read_text(os.path.join(folder, "current_link_speed"))),
            "width": read_int(os.path.join(folder, "current_link_width")),
            "max_speed_gts": link_speed_gts(read_text(os.path.join(folder, "max_link_speed"))),
            "max_width": read_int(os.path.join(folder, "max_link_width"))}


def pci_kind(sys_root: str, bdf: str, nics: dict[str, str]) -> str | None:
    """gpu, nvswitch or nic (an RDMA device's function) for the functions the topology is about; None for the rest."""
    if bdf in nics:
        return "nic"
    folder = os.path.join(sys_root, "bus", "pci", "devices", bdf)
    if read_text(os.path.join(folder, "vendor")) != "0x10de":
        return None  # one read for most of a server's hundreds of functions
    klass = read_int(os.path.join(folder, "class")) or 0
    return "gpu" if klass >> 16 == 0x03 else "nvswitch" if klass >> 8 == 0x0680 else None


def read_bytes(path: str, size: int) -> bytes | None:
    """At most size bytes of a file, or None."""
    try:
        with open(path, "rb") as f:
            return f.read(size)
    except OSError:
        return None


def topology(sys_root: str = "/sys", proc: str = "/proc") -> dict[str, Any]:
    """Topology: the GPUs, RDMA NICs and NVSwitches on the PCI tree with their NUMA nodes and bridges, ACS on those
    bridges, the IOMMU, NUMA balancing and the modules GPUDirect RDMA needs."""
    try:
        functions = sorted(os.listdir(os.path.join(sys_root, "bus", "pci", "devices")))
    except OSError:
        functions = []
    nics: dict[str, str] = {}
    ib_root = os.path.join(sys_root, "class", "infiniband")
    try:
        for name in sorted(os.listdir(ib_root)):
            nics.setdefault(os.path.basename(os.path.realpath(os.path.join(ib_root, name, "device"))), name)
    except OSError:
        pass
    devices, bridges = [], set()
    for bdf in functions:
        kind = pci_kind(sys_root, bdf, nics)
        if kind is None:
            continue
        place = pci_place(sys_root, bdf)
        devices.append({"pci": bdf, "kind": kind, "name": nics.get(bdf), "numa_node": place["numa_node"],
                        "root": place["root"], "path": place["chain"][:-1],
                        "pcie_link": pcie_link(sys_root, bdf) if kind == "nic" else None})
        if kind != "nvswitch":
            bridges.update(place["chain"][:-1])
    acs = []
    for bdf in sorted(bridges):
        config = read_bytes(os.path.join(sys_root, "bus", "pci", "devices", bdf, "config"), 4096)
        acs.append({"pci": bdf, "config_bytes": len(config) if config is not None else 0,
                    "acs_ctl": pci_acs_control(config) if config else None})
    cmdline = (read_text(os.path.join(proc, "cmdline")) or "").split()
    gpu_group = next((d["pci"] for d in devices if d["kind"] == "gpu"), None)
    groups_dir = os.path.join(sys_root, "kernel", "iommu_groups")
    try:
        groups = len(os.listdir(groups_dir))
    except OSError:
        groups = 0
    version = read_text(os.path.join(proc, "driver", "nvidia", "version"))
    return {
        "devices": devices,
        "bridges": acs,
        "iommu": {
            "groups": groups,
            "cmdline": [t for t in cmdline if t.split("=")[0] in ("iommu", "intel_iommu", "amd_iommu", "iommu.passthrough")],
            "gpu_domain": read_text(os.path.join(sys_root, "bus", "pci", "devices", gpu_group, "iommu_group", "type"))
            if gpu_group else None,
        },
        "numa_balancing": read_int(os.path.join(proc, "sys", "kernel", "numa_balancing")),
        "peermem_loaded": any(os.path.isdir(os.path.join(sys_root, "module", m)) for m in ("nvidia_peermem", "nv_peer_mem")),
        "nvidia_open_module": None if version is None else "Open Kernel Module" in version,
    }


# ---------------------------------------------------------------------------------------------------------------------


def collect() -> dict[str, Any]:
    """This host's facts (HostFacts)."""
    started, clock = time.time(), time.perf_counter()
    hostname = socket.gethostname()
    lookup = start_lookup(hostname)
    torch = torch_info()
    fabric: dict[str, Any] = {"gpus": [], "nvlinks": [], "nvlink_all_down": []}
    gpu = gpu_info(fabric)
    facts: dict[str, Any] = {
        "probe": {"schema": SCHEMA_VERSION, "started_unix_s": started, "elapsed_s": 0.0},
        "host": {},
        "torch": torch,
        "nccl": nccl_info(torch),
        "gpu": gpu,
        "resources": resource_info(),
        "net": {"interfaces": interfaces(), "infiniband": infiniband_ports()},
        "kernel_log": kernel_log(started),
        "fabric": {"nvswitch_count": 0, "fabric_manager": fabric_manager(), **fabric},
        "topology": topology(),
    }
    facts["fabric"]["nvswitch_count"] = sum(1 for d in facts["topology"]["devices"] if d["kind"] == "nvswitch")
    facts["host"] = host_info(hostname, lookup)  # last: the lookup ran while everything else was read
    facts["probe"]["elapsed_s"] = round(time.perf_counter() - clock, 6)
    return facts


def main() -> int:
    """Print the facts as one JSON object."""
    print(json.dumps(collect(), allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
