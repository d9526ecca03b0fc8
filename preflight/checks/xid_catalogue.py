"""NVIDIA's Xid and SXid catalogue as data: every code NVIDIA lists, with its mnemonic, its immediate action
("Resolution Bucket") and its severity, read from xid-catalogue.csv (NVIDIA's own transcription, whose header names
where it comes from), and the action each bucket asks for in words an operator can follow.

Nothing here is preflight's opinion of a code: a code's severity is the catalogue's, and its advice is its bucket's.
checks/xid.py adds what the catalogue does not say (where the fault starts, the finding that explains it best).
"""

from __future__ import annotations

import csv
from functools import cache
from pathlib import Path
from typing import Literal, NamedTuple

SOURCE = ("NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), as NVIDIA transcribes "
          "it in NVIDIA/NVSentinel@6f8b0fc")
_FILE = Path(__file__).with_name("xid-catalogue.csv")

# Each bucket's action. "(NVIDIA: NAME)" names the bucket the catalogue gives, so an operator can look it up.
BUCKET_ACTIONS: dict[str, str] = {
    "IGNORE": "nothing to do for this code alone (NVIDIA: IGNORE): informational, or recovered by itself",
    "RESTART_APP": "restart the application (NVIDIA: RESTART_APP)",
    "RESTART_VM": "restart the VM (NVIDIA: RESTART_VM)",
    "RESET_GPU": "drain the node and reset the GPU (`nvidia-smi -r -i N`) or reboot (NVIDIA: RESET_GPU)",
    "RESTART_BM": "drain the node and reboot it (NVIDIA: RESTART_BM)",
    "RESET_FABRIC": "drain the node and reset the NVSwitch fabric: reboot, which restarts Fabric Manager (NVIDIA: RESET_FABRIC)",
    "UNEXPECTED_ERR_REPORT_ISSUE": "drain the node and report it to NVIDIA with `nvidia-bug-report.sh`: the driver does "
                                   "not expect this code on this GPU (NVIDIA: UNEXPECTED_ERR_REPORT_ISSUE)",
    "REPORT_ISSUE": "drain the node and report it to NVIDIA with `nvidia-bug-report.sh` (NVIDIA: REPORT_ISSUE)",
    "CONTACT_SUPPORT": "drain the node and contact NVIDIA support (NVIDIA: CONTACT_SUPPORT)",
    "CHECK_MECHANICALS": "drain the node and check its power supply and cooling (NVIDIA: CHECK_MECHANICALS)",
    "CHECK_THERMALS": "drain the node and check its cooling (NVIDIA: CHECK_THERMALS)",
    "CHECK_FM_CONFIG": "drain the node and check Fabric Manager's configuration (NVIDIA: CHECK_FM_CONFIG)",
    "CHECK_UVM": "read the nvidia-uvm messages around it (NVIDIA: CHECK_UVM)",
    "UPDATE_SWFW": "update the driver and the GPU firmware (NVIDIA: UPDATE_SWFW)",
    "RUN_FIELDDIAG": "drain the node and run NVIDIA's field diagnostic on it (NVIDIA: RUN_FIELDDIAG)",
    "INVESTIGATE_LINK_SI": "drain the node and have the NVLink's signal integrity investigated: reseat, then run the "
                           "field diagnostic (NVIDIA: INVESTIGATE_LINK_SI)",
    "CHECK_LINK_MECHANICAL_CONNECTIONS": "drain the node and check the NVLink's mechanical connections: reseat the cable "
                                         "or tray (NVIDIA: CHECK_LINK_MECHANICAL_CONNECTIONS)",
    "WORKFLOW_XID_45": "act on the Xid before it: this one cleans up after it (NVIDIA: WORKFLOW_XID_45)",
    "WORKFLOW_XID_48": "drain the node and reset the GPU; RMA if it recurs after the reset (NVIDIA: WORKFLOW_XID_48)",
    "WORKFLOW_NVLINK_ERR": "drain the node, reset the GPUs on the link (or reboot), check `nvidia-smi nvlink -e`; RMA the "
                           "GPU or baseboard if it recurs (NVIDIA: WORKFLOW_NVLINK_ERR)",
    "WORKFLOW_NVLINK5_ERR": "a Fatal one: drain the node and reset the GPU (or reboot the tray), check `nvidia-smi nvlink "
                            "-e`; RMA if it recurs. A Nonfatal one: watch the link, drain if the count grows (NVIDIA: "
                            "WORKFLOW_NVLINK5_ERR)",
    "WORKFLOW_NVLINK_POTENTIALY_FATAL_ERR": "drain the node and reset the NVSwitch fabric (reboot); RMA the tray if it "
                                            "recurs (NVIDIA: WORKFLOW_NVLINK_POTENTIALY_FATAL_ERR)",
    "Follow guidance as it aapplies to another Xid": "do the recovery action the line names (`nvidia-smi -q -d "
                                                     "RECOVERY`), as the Xid that caused it asks (NVIDIA: follow the "
                                                     "guidance of the Xid it applies to)",
}


class Entry(NamedTuple):
    """One code of the catalogue: its mnemonic (empty where NVIDIA gives none), its bucket, whether NVIDIA calls it
    fatal, and the bucket's action."""

    mnemonic: str
    bucket: str
    fatal: bool
    action: str


@cache
def catalogue(kind: Literal["Xid", "SXid"]) -> dict[int, Entry]:
    """Every code of one kind in NVIDIA's catalogue."""
    found = {}
    with open(_FILE, encoding="utf-8") as f:
        for row in csv.DictReader(line for line in f if not line.startswith("#")):
            if row["kind"] == kind:
                bucket = row["action"]
                found[int(row["code"])] = Entry(row["mnemonic"].strip(), bucket, row["severity"] == "FATAL",
                                                BUCKET_ACTIONS[bucket])
    return found
