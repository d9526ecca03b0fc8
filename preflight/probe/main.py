"""preflight's probe: print this host's facts as one JSON object (see facts.py and schemas/facts.schema.json).

preflight.bundle joins it, the probe's other modules and the shared helpers into the one file sent to each host and run
as ``python3 -`` (``python3 -m preflight.bundle facts | python3 -`` runs it by hand). It uses the standard library only
(and ``pynvml`` where the host has it), so a host needs nothing beyond its training environment. It reports and never
judges. It never imports torch, which takes seconds on a GPU host. What it cannot read becomes a fact (None, an empty
list, an error string) and it exits 0; only a bug in the probe itself ends it otherwise.
"""

from __future__ import annotations

import socket
import sys
import time

from preflight.hostlib.wire import write_output
from preflight.probe.constants import SCHEMA_VERSION
from preflight.probe.gpu import gpu_info
from preflight.probe.host import host_info, nccl_info, start_lookup, torch_info
from preflight.probe.machine import fabric_manager, kernel_log, topology
from preflight.probe.net import infiniband_ports, interfaces, resource_info

# typing costs milliseconds to import on a plain python, and annotations here are never evaluated.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


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
    return write_output(collect(), allow_nan=False)


if __name__ == "__main__":
    sys.exit(main())
