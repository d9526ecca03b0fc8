"""Pure readings of the kernel log, nvidia-smi's fabric and NVLink text, and PCI config space."""

from __future__ import annotations

import re
import time

from preflight.probe.constants import ACS_FLAGS, KERNEL_LOG_MAX_EVENTS, PCI_EXT_CAP_ACS, SMI_NVLINK_ERRORS
from preflight.probe.parse import smi_int, smi_value

# typing costs milliseconds to import on a plain python, and annotations here are never evaluated.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any


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
