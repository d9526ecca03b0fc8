"""Per-host checks of the kernel log (PF801-PF803): Xid lines of the GPUs and SXid lines of the NVSwitches within
thresholds.xid_window_h, one finding per GPU and code, each code with its meaning and what to do.

The meanings and actions follow NVIDIA's Xid catalogue (https://docs.nvidia.com/deploy/xid-errors/), reduced to what
decides a job's fate: `fail` where the catalogue's action is a GPU reset, a reboot, a drain or an RMA (the node will
lose the next job too), `warn` where the Xid is usually the application's own fault or the GPU recovered by itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal, NamedTuple, get_args

from preflight.checks.registry import ClusterView, host_check, host_finding
from preflight.facts import HostFacts, XidEvent
from preflight.findings import Finding, Status
from preflight.records import HostRecord

# Where a kernel-log event's fault starts, root cause first: an NVSwitch (SXid) takes down the NVLinks of the GPUs
# behind it, so the GPUs' NVLink Xids (74, 137, 144-150) follow from it; a GPU's own hardware (firmware, the bus, its
# memory) fails on its own; an application-level Xid (13, 31, 43: a fault, a page fault, a reset channel) is what the
# job sees of any of these, or its own bug, so it comes last. `diagnose` orders a kernel log's findings by it.
Origin = Literal["fabric", "nvlink", "gpu", "memory", "application"]
ORIGINS: tuple[Origin, ...] = get_args(Origin)


class XidMeaning(NamedTuple):
    """One Xid code of NVIDIA's catalogue: whether it condemns the node, what it means, what to do, where the fault
    starts (ORIGINS), and the finding whose explanation fits it best (an ECC Xid is PF401's uncorrected ECC error)."""

    fatal: bool
    meaning: str
    action: str
    origin: Origin = "gpu"
    finding: str = "PF801"


_APP = "usually the application's fault; if it recurs across jobs, run `dcgmi diag -r 2` on the GPU"
_RESET = "drain the node, reset the GPU (`nvidia-smi -r -i N`) or reboot, then run `dcgmi diag -r 3`"
_NVLINK5 = ("a Fatal one: drain the node and reset the GPU (or reboot the tray), check `nvidia-smi nvlink -e`; RMA if it "
            "recurs. A Nonfatal one: watch the link, drain if the count grows")
_NVLINK_WATCH = ("check the NVSwitches' SXids and `nvidia-smi nvlink -e` on the GPU; drain the node and reset the GPU "
                 "if the count grows or a fatal Xid follows")
_SXID_FATAL = "drain the node and reset the NVSwitch fabric (reboot, which restarts Fabric Manager)"
_SXID_WATCH = "watch the NVSwitch; drain if non-fatal SXids keep coming"
XID_CATALOGUE: dict[int, XidMeaning] = {
    8: XidMeaning(False, "GPU stopped processing (a kernel ran too long or hung)", _APP, "application"),
    13: XidMeaning(False, "graphics engine exception (an out-of-range access or an illegal instruction)", _APP, "application"),
    31: XidMeaning(False, "GPU memory page fault (an illegal address)", _APP, "application"),
    32: XidMeaning(False, "invalid or corrupted push buffer stream", _APP, "application"),
    38: XidMeaning(True, "driver firmware error", _RESET),
    43: XidMeaning(False, "GPU stopped processing: the application was reset after a fault", _APP, "application"),
    45: XidMeaning(False, "preemptive cleanup after an earlier error (a follower, not a cause)", "read the Xid before it",
                   "application"),
    46: XidMeaning(True, "GPU stopped processing (a channel timed out and could not be recovered)", _RESET),
    48: XidMeaning(True, "double-bit ECC error (uncorrectable GPU memory error)",
                   "drain the node and reset the GPU; RMA if it recurs after the reset", "memory", "PF401"),
    61: XidMeaning(True, "internal micro-controller breakpoint or warning", _RESET),
    62: XidMeaning(True, "internal micro-controller halt", _RESET),
    63: XidMeaning(False, "ECC page retirement or row remapping recorded", "reset the GPU at the next drain to apply the remap",
                   "memory", "PF402"),
    64: XidMeaning(True, "ECC page retirement or row remapping failed to record",
                   "drain the node; the GPU has run out of spare rows or cannot remap: RMA", "memory", "PF401"),
    69: XidMeaning(False, "graphics engine class error", _APP, "application"),
    74: XidMeaning(True, "NVLink error (a link went down or saw fatal errors)",
                   "drain the node, reset the GPUs on the link (or reboot), check `nvidia-smi nvlink -e`; RMA the GPU or "
                   "baseboard if it recurs", "nvlink"),
    79: XidMeaning(True, "GPU has fallen off the bus (no longer answers on PCIe)",
                   "drain the node and reboot; check power, cooling and the PCIe slot or riser; RMA if it recurs"),
    92: XidMeaning(False, "high single-bit ECC error rate", "watch the GPU; run `dcgmi diag -r 3` at the next drain", "memory"),
    94: XidMeaning(False, "contained ECC error: only the application that touched the memory was stopped",
                   "restart the job; reset the GPU at the next drain to remap the row", "memory", "PF401"),
    95: XidMeaning(True, "uncontained ECC error: every application on the GPU is affected", _RESET, "memory", "PF401"),
    109: XidMeaning(False, "context switch timeout", _APP, "application"),
    119: XidMeaning(True, "GSP RPC timeout: the GPU's system processor stopped answering the driver", _RESET),
    120: XidMeaning(True, "GSP error", _RESET),
    121: XidMeaning(False, "corrected C2C link error", "watch the link; drain if the count grows"),
    # An NVLink error seen by the GPU's link layer ("TLC RX interrupt hit on link N on GPU0: PRIV Error"): often the far
    # end's fault, an NVSwitch or a peer GPU (the H200 cascade on NVIDIA's developer forum, topic 369786).
    137: XidMeaning(False, "NVLink error at the GPU's link (TLC / FLA privilege error)", _NVLINK_WATCH, "nvlink"),
    140: XidMeaning(True, "unrecovered ECC error", _RESET, "memory", "PF401"),
    143: XidMeaning(True, "GPU initialization failure", "drain the node and reboot; RMA if it recurs"),
    # NVLink5 (Blackwell) errors: each line names its unit and says Fatal or Nonfatal, which decides (nvlink5_fatal).
    144: XidMeaning(False, "NVLink5 SAW error", _NVLINK5, "nvlink"),
    145: XidMeaning(False, "NVLink5 RLW error", _NVLINK5, "nvlink"),
    146: XidMeaning(False, "NVLink5 TLW error", _NVLINK5, "nvlink"),
    147: XidMeaning(False, "NVLink5 TREX error", _NVLINK5, "nvlink"),
    148: XidMeaning(False, "NVLink5 NVLPW control error", _NVLINK5, "nvlink"),
    149: XidMeaning(False, "NVLink5 NETIR (link) error", _NVLINK5, "nvlink"),
    150: XidMeaning(False, "NVLink5 MSE error", _NVLINK5, "nvlink"),
    154: XidMeaning(True, "GPU recovery action changed: the driver asks for a reset, reboot or drain",
                    "read the action in the Xid line (`nvidia-smi -q -d RECOVERY`) and do it"),
}
_UNKNOWN = XidMeaning(False, "not in preflight's catalogue", "look the code up in NVIDIA's Xid catalogue")


def origin_of(event: XidEvent) -> Origin:
    """Where the event's fault starts (ORIGINS): an NVSwitch for an SXid, else the catalogue's (a GPU's own, unknown)."""
    return "fabric" if event["kind"] == "SXid" else XID_CATALOGUE.get(event["code"], _UNKNOWN).origin


def finding_of(event: XidEvent) -> str:
    """The finding code that explains the event best: PF802 for an SXid, PF401/PF402 for ECC Xids, else PF801."""
    return "PF802" if event["kind"] == "SXid" else XID_CATALOGUE.get(event["code"], _UNKNOWN).finding


def judge_event(event: XidEvent) -> tuple[bool, str, str]:
    """Whether an Xid or SXid event condemns the node, what it means and what to do: the line's own Fatal/Non-fatal
    word where it has one (SXids, NVLink5 Xids), else NVIDIA's catalogue."""
    said = event.get("fatal")
    if event["kind"] == "SXid":
        words = event["message"].lower()
        fatal = bool(said) if said is not None else "fatal" in words.split(",")[0] and "non-fatal" not in words
        # Only the event's detail lines ("Data {...}") in the excerpt: its severity is not known, not non-fatal.
        unsaid = said is None and "fatal" not in words
        described = "NVSwitch error, its Fatal/Non-fatal headline not in the log" if unsaid else \
            "fatal NVSwitch error" if fatal else "non-fatal NVSwitch error"
        return fatal, described, _SXID_FATAL if fatal else _SXID_WATCH + ("; read its headline in the full kernel log" if unsaid else "")
    meaning = XID_CATALOGUE.get(event["code"], _UNKNOWN)
    fatal = meaning.fatal if said is None else said or meaning.fatal
    return fatal, meaning.meaning + (" (the line says Fatal)" if said and not meaning.fatal else ""), meaning.action


def pci_key(address: str | None) -> str:
    """A PCI address reduced to domain:bus:device in lower case, as Xid lines print it: "00000000:3B:00.0" ->
    "0000:3b:00"."""
    if not address:
        return ""
    parts = address.lower().split(":")
    if len(parts) < 3:
        return address.lower()
    return f"{parts[-3][-4:].rjust(4, '0')}:{parts[-2]}:{parts[-1].split('.')[0]}"


def gpu_name(facts: HostFacts, address: str) -> str:
    """"GPU 3 (0000:3b:00)" for the GPU at address, or the bare address when no GPU of the facts has it."""
    key = pci_key(address)
    for gpu in facts["gpu"]["devices"]:
        if pci_key(gpu["pci_bus_id"]) == key:
            return f"GPU {gpu['index']} ({key})"
    return key


def recent(facts: HostFacts, window_h: float) -> list[XidEvent]:
    """The events seen within window_h of the probe's start; an event without a time stamp counts (it cannot be
    placed outside the window)."""
    log = facts.get("kernel_log")
    if log is None:
        return []
    since = facts["probe"]["started_unix_s"] - window_h * 3600
    return [e for e in log["events"] if e["last_unix_s"] is None or e["last_unix_s"] >= since]


def _times(event: XidEvent) -> str:
    return f"{event['count']} time{'s' if event['count'] != 1 else ''}"


@host_check("PF801", "PF802", "PF803")
def kernel_log_xids(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """No GPU Xid and no NVSwitch SXid that condemns the node within the window; an unreadable kernel log is said,
    not failed."""
    facts = record.facts
    log = facts.get("kernel_log")
    has_gpus = bool(facts["gpu"]["devices"]) or view.uses_gpus
    if log is None or not has_gpus:
        return
    window = view.config.thresholds.xid_window_h
    if log["source"] is None:
        yield host_finding("PF803", Status.warn, record, f"could not read the kernel log for Xid lines: {log['error']}",
                           "let the user preflight runs as read it: `sysctl kernel.dmesg_restrict=0`, or the adm / "
                           "systemd-journal group for journalctl -k")
        return
    events = recent(facts, window)
    xids = [e for e in events if e["kind"] == "Xid"]
    sxids = [e for e in events if e["kind"] == "SXid"]
    for event in sorted(xids, key=lambda e: (e["pci"], e["code"])):
        fatal, meaning, action = judge_event(event)
        yield host_finding("PF801", Status.fail if fatal else Status.warn, record,
                           f"{gpu_name(facts, event['pci'])}: Xid {event['code']} ({meaning}), {_times(event)} in the "
                           f"last {window:g} h: {event['message'][:120]}", action)
    if not xids:
        yield host_finding("PF801", Status.passed, record, f"no Xid in the last {window:g} h (read from {log['source']})")
    for event in sorted(sxids, key=lambda e: (e["pci"], e["code"])):
        fatal, _, action = judge_event(event)
        yield host_finding("PF802", Status.fail if fatal else Status.warn, record,
                           f"NVSwitch {event['pci']}: SXid {event['code']}, {_times(event)} in the last {window:g} h: "
                           f"{event['message'][:120]}", action)
    fabric = facts.get("fabric")
    if fabric is not None and fabric["nvswitch_count"] and not sxids:
        yield host_finding("PF802", Status.passed, record, f"no NVSwitch SXid in the last {window:g} h")
