"""A sysfs tree (bus/pci/devices, devices/pci*, class/infiniband) built from a recorded `lspci -vvv` excerpt, so that the
probe's topology reader runs on a real host's PCI layout. Nothing is invented beyond what sysfs needs to say the same:
the parent of each function comes from the bridges' bus ranges, the NUMA node and ACS control from their lines, vendor
and class codes from the names lspci printed; each Mellanox function gets an RDMA device (mlx5_N, in bus order), as
the mlx5 driver gives it.
"""

from __future__ import annotations

import re
from pathlib import Path

from preflight import bundle

probe = bundle.load(bundle.FACTS)  # the facts probe as hosts get it, loaded as a module

_VENDORS = {"NVIDIA Corporation": 0x10DE, "Mellanox Technologies": 0x15B3, "Intel Corporation": 0x8086, "Broadcom": 0x1000}
_CLASSES = {"3D controller": 0x030200, "VGA compatible controller": 0x030000, "PCI bridge": 0x060400, "Bridge": 0x068000,
            "Ethernet controller": 0x020000, "Infiniband controller": 0x020700}


def _functions(text: str) -> list[dict[str, object]]:
    found: list[dict[str, object]] = []
    for line in text.splitlines():
        head = re.match(r"^([0-9a-f]{2}):([0-9a-f]{2}\.[0-7]) ([^:]+): (.*)$", line)
        if head:
            vendor = next((v for n, v in _VENDORS.items() if head.group(4).startswith(n)), 0)
            found.append({"bdf": f"0000:{head.group(1)}:{head.group(2)}", "bus": int(head.group(1), 16),
                          "class": _CLASSES.get(head.group(3), 0), "vendor": vendor, "numa": -1, "range": None, "acs": None})
            continue
        current = found[-1]
        if m := re.search(r"NUMA node: (\d+)", line):
            current["numa"] = int(m.group(1))
        elif m := re.search(r"Bus: primary=([0-9a-f]+), secondary=([0-9a-f]+), subordinate=([0-9a-f]+)", line):
            current["range"] = (int(m.group(2), 16), int(m.group(3), 16))
        elif "ACSCtl:" in line:
            current["acs"] = {w[:-1]: w[-1] == "+" for w in line.split()[1:]}
    return found


def _config(acs: dict[str, bool] | None) -> bytes:
    space = bytearray(4096)
    if acs is not None:
        space[0x100:0x104] = (probe.PCI_EXT_CAP_ACS | 1 << 16).to_bytes(4, "little")
        control = sum(1 << bit for bit, name in enumerate(probe.ACS_FLAGS) if acs.get(name))
        space[0x106:0x108] = control.to_bytes(2, "little")
    return bytes(space)


def sysfs_from_lspci(text: str, root: Path) -> Path:
    """Write the tree under root and return root (the probe's sys_root)."""
    functions = _functions(text)
    bridges = [f for f in functions if f["range"] is not None]

    def parent(function: dict[str, object]) -> dict[str, object] | None:
        bus = function["bus"]
        holders = [b for b in bridges if b is not function and b["range"][0] <= bus <= b["range"][1]]  # type: ignore[index, operator]
        return min(holders, key=lambda b: b["range"][1] - b["range"][0], default=None)  # type: ignore[index, operator]

    rdma = 0
    for function in functions:
        chain, up = [str(function["bdf"])], parent(function)
        top = function
        while up is not None:
            chain.insert(0, str(up["bdf"]))
            top, up = up, parent(up)
        folder = root / "devices" / f"pci0000:{top['bus']:02x}" / Path(*chain)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "vendor").write_text(f"0x{function['vendor']:04x}\n")
        (folder / "class").write_text(f"0x{function['class']:06x}\n")
        (folder / "numa_node").write_text(f"{function['numa']}\n")
        (folder / "config").write_bytes(_config(function["acs"]))  # type: ignore[arg-type]
        link = root / "bus" / "pci" / "devices" / str(function["bdf"])
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(folder)
        if function["vendor"] == 0x15B3:
            device = root / "class" / "infiniband" / f"mlx5_{rdma}"
            device.mkdir(parents=True)
            (device / "device").symlink_to(folder)
            rdma += 1
    return root
