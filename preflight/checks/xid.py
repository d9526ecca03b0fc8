"""Per-host checks of the kernel log (PF801-PF803): Xid lines of the GPUs and SXid lines of the NVSwitches within
thresholds.xid_window_h, one finding per GPU and code, each code with its meaning and what to do.

Each code's severity and action are NVIDIA's Xid catalogue's (checks/xid_catalogue.py, every code with its source):
`fail` where the catalogue calls it fatal (its action is a reset, a reboot, a drain or a report: the node would lose
the next job too), `warn` where it does not (restart the application, or nothing). A line that says its own severity
(an SXid's headline or its "Severity N" detail line, an NVLink5 Xid, Xid 154's new recovery action) decides for itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal, NamedTuple, get_args

from preflight.checks.registry import ClusterView, host_check, host_finding
from preflight.checks.xid_catalogue import SOURCE, Entry, catalogue
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
    """One Xid code of NVIDIA's catalogue: whether it condemns the node (the catalogue's severity), what it means, what
    to do (its bucket's action), where the fault starts (ORIGINS), the finding whose explanation fits it best (an ECC
    Xid is PF401's uncorrected ECC error), and where its meaning and action were read."""

    fatal: bool
    meaning: str
    action: str
    origin: Origin = "gpu"
    finding: str = "PF801"
    source: str = ""


# What the catalogue's mnemonics mean in words, where the catalogue's description says more than the mnemonic, with
# where each fault starts and the finding that explains it; a code not here is named by its mnemonic. Severity and
# action are never set here: they are the catalogue's (xid_catalogue.py).
_DESCRIBED: dict[int, tuple[str, Origin, str]] = {
    8: ("GPU stopped processing (a kernel ran too long or hung)", "application", "PF801"),
    13: ("graphics engine exception (an out-of-range access or an illegal instruction)", "application", "PF801"),
    31: ("GPU memory page fault (an illegal address)", "application", "PF801"),
    # The catalogue: the DMA controller that carries the driver's command stream to the GPU over PCIe; "these failures
    # primarily involve quality issues on PCI, and are generally not caused by user application actions".
    32: ("invalid or corrupted push buffer stream: the PCIe DMA path from the driver to the GPU, mostly a PCIe quality "
         "problem, seldom the application's", "gpu", "PF801"),
    38: ("driver firmware error", "gpu", "PF801"),
    43: ("GPU stopped processing: the application was reset after a fault", "application", "PF801"),
    45: ("preemptive cleanup after an earlier error (a follower, not a cause)", "application", "PF801"),
    46: ("GPU stopped processing (a channel timed out and could not be recovered)", "gpu", "PF801"),
    48: ("double-bit ECC error (uncorrectable GPU memory error)", "memory", "PF401"),
    61: ("internal micro-controller breakpoint or warning", "gpu", "PF801"),
    62: ("internal micro-controller halt", "gpu", "PF801"),
    63: ("ECC page retirement or row remapping recorded", "memory", "PF402"),
    64: ("ECC page retirement or row remapping failed to record", "memory", "PF401"),
    69: ("graphics engine class error", "application", "PF801"),
    74: ("NVLink error (a link went down or saw fatal errors)", "nvlink", "PF801"),
    79: ("GPU has fallen off the bus (no longer answers on PCIe)", "gpu", "PF801"),
    92: ("high single-bit ECC error rate", "memory", "PF801"),
    94: ("contained ECC error: only the application that touched the memory was stopped", "memory", "PF401"),
    95: ("uncontained ECC error: every application on the GPU is affected", "memory", "PF401"),
    109: ("context switch timeout", "gpu", "PF801"),
    119: ("GSP RPC timeout: the GPU's system processor stopped answering the driver", "gpu", "PF801"),
    120: ("GSP error", "gpu", "PF801"),
    121: ("corrected C2C link error", "gpu", "PF801"),
    # An NVLink error seen by the GPU's link layer ("TLC RX interrupt hit on link N on GPU0: PRIV Error"): often the far
    # end's fault, an NVSwitch or a peer GPU (the H200 cascade on NVIDIA's developer forum, topic 369786).
    137: ("NVLink error at the GPU's link (TLC / FLA privilege error)", "nvlink", "PF801"),
    140: ("unrecovered ECC error", "memory", "PF401"),
    143: ("GPU initialization failure", "gpu", "PF801"),
    # NVLink5 (Blackwell) errors: each line names its unit and says Fatal or Nonfatal, which decides (judge_event).
    144: ("NVLink5 SAW error", "nvlink", "PF801"),
    145: ("NVLink5 RLW error", "nvlink", "PF801"),
    146: ("NVLink5 TLW error", "nvlink", "PF801"),
    147: ("NVLink5 TREX error", "nvlink", "PF801"),
    148: ("NVLink5 NVLPW control error", "nvlink", "PF801"),
    149: ("NVLink5 NETIR (link) error", "nvlink", "PF801"),
    150: ("NVLink5 MSE error", "nvlink", "PF801"),
    154: ("GPU recovery action changed: the driver asks for a reset, reboot or drain", "gpu", "PF801"),
}
# Where the catalogue's description adds to its bucket's action.
_FURTHER = {32: "; if it recurs, check the GPU's PCIe link: replays in `nvidia-smi -q -d PCIE`, AER errors in `dmesg`, "
                "then reseat the GPU or move it to another slot"}
_SXID_FATAL = "drain the node and reset the NVSwitch fabric (reboot, which restarts Fabric Manager)"
_SXID_WATCH = "watch the NVSwitch; drain if non-fatal SXids keep coming"
_NVLINK5 = "WORKFLOW_NVLINK5_ERR"  # the bucket whose lines say their own severity
_RECOVERY_ACTION_CHANGED = 154


def _meaning(code: int, entry: Entry) -> XidMeaning:
    meaning, origin, finding = _DESCRIBED.get(code, (entry.mnemonic or f"Xid {code}", "gpu", "PF801"))
    return XidMeaning(entry.fatal, meaning, entry.action + _FURTHER.get(code, ""), origin, finding,
                      f"{SOURCE}: {entry.mnemonic or 'no mnemonic'}, {entry.bucket}, {'FATAL' if entry.fatal else 'NONFATAL'}")


XID_CATALOGUE: dict[int, XidMeaning] = {code: _meaning(code, entry) for code, entry in catalogue("Xid").items()}
_UNKNOWN = XidMeaning(False, "not in NVIDIA's Xid catalogue", "look the code up in NVIDIA's Xid catalogue and the "
                      "driver's release notes")


def origin_of(event: XidEvent) -> Origin:
    """Where the event's fault starts (ORIGINS): an NVSwitch for an SXid, else the catalogue's (a GPU's own, unknown)."""
    return "fabric" if event["kind"] == "SXid" else XID_CATALOGUE.get(event["code"], _UNKNOWN).origin


def finding_of(event: XidEvent) -> str:
    """The finding code that explains the event best: PF802 for an SXid, PF401/PF402 for ECC Xids, else PF801."""
    return "PF802" if event["kind"] == "SXid" else XID_CATALOGUE.get(event["code"], _UNKNOWN).finding


def judge_event(event: XidEvent) -> tuple[bool, str, str]:
    """Whether an Xid or SXid event condemns the node, what it means and what to do: the line's own severity where it
    says one (SXids, NVLink5 Xids, Xid 154's recovery action), else NVIDIA's catalogue."""
    said = event.get("fatal")
    if event["kind"] == "SXid":
        return _judge_sxid(event, said)
    meaning = XID_CATALOGUE.get(event["code"], _UNKNOWN)
    if event["code"] == _RECOVERY_ACTION_CHANGED:  # "... changed from 0x0 (None) to 0x2 (Node Reboot Required)"
        return not event["message"].rstrip().endswith("(None)"), meaning.meaning, meaning.action
    nvlink5 = catalogue("Xid").get(event["code"], Entry("", "", False, "")).bucket == _NVLINK5
    fatal = said if said is not None and nvlink5 else meaning.fatal or bool(said)
    return fatal, meaning.meaning + (" (the line says Fatal)" if said and not meaning.fatal else ""), meaning.action


def _judge_sxid(event: XidEvent, said: bool | None) -> tuple[bool, str, str]:
    """An SXid: its headline's Fatal/Non-fatal or its detail line's severity, else the catalogue's for its code."""
    entry = catalogue("SXid").get(event["code"])
    words = event["message"].lower()
    worded = "fatal" in words.split(",")[0]
    if said is not None or worded:
        fatal = bool(said) if said is not None else "non-fatal" not in words
        described = "fatal NVSwitch error" if fatal else "non-fatal NVSwitch error"
    else:  # only its "Data {...}" lines in the excerpt
        fatal = entry.fatal if entry is not None else False
        described = "NVSwitch error, its severity not in the log: " + (
            f"NVIDIA's catalogue calls it {'fatal' if fatal else 'non-fatal'}" if entry is not None else "unknown")
    if entry is not None and entry.mnemonic:
        described += f" ({entry.mnemonic})"
    action = (entry.action if entry is not None and entry.fatal else _SXID_FATAL) if fatal else _SXID_WATCH
    return fatal, described, action


def device_of(event: XidEvent) -> str:
    """The event's device address, or what is known of it where the line's address is redacted or unknown."""
    return event["pci"] or ("an NVSwitch" if event["kind"] == "SXid" else "a GPU") + " whose address the log hides"


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
    """"GPU 3 (0000:3b:00)" for the GPU at address, the bare address when no GPU of the facts has it, or "a GPU whose
    address the log hides" where the line's is redacted."""
    if not address:
        return "a GPU whose address the log hides"
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
                           f"NVSwitch {device_of(event)}: SXid {event['code']}, {_times(event)} in the last {window:g} h: "
                           f"{event['message'][:120]}", action)
    fabric = facts.get("fabric")
    if fabric is not None and fabric["nvswitch_count"] and not sxids:
        yield host_finding("PF802", Status.passed, record, f"no NVSwitch SXid in the last {window:g} h")
