"""The fake libnvidia-ml.so.1 (tests/fake_nvml/fake_nvml.c), compiled against NVML's own header, and the facts file it
answers from, written from the real H100 recording (tests/data/h100-single-node) with only the fields under test changed.

The real nvidia-ml-py loads it like the driver's library, so the probe runs through the same ctypes calls as on a GPU
host; the probe runs as on a host (`python3 -` with the script on stdin) in a mount namespace where the driver's
/proc/driver/nvidia exists, so it takes the NVML path.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

from conftest import skip_or_fail
from recorded import H100

from preflight import bundle

SOURCE = Path(__file__).parent / "fake_nvml" / "fake_nvml.c"
NO_MOUNT = 97  # the exit status of the namespace's shell when it may not mount (a container without CAP_SYS_ADMIN)
PROBE_SOURCE = bundle.text(bundle.FACTS)  # the facts probe as hosts get it


def nvml_header_folder() -> Path:
    """The folder of nvml.h from PyPI's nvidia-nvml-dev (a test extra)."""
    for site in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for header in sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "include", "nvml.h"))):
            return Path(header).parent
    skip_or_fail("nvml.h is not installed (pip install nvidia-nvml-dev, a test extra)")


def compile_fake(folder: Path, *defines: str) -> Path:
    """Compile the fake into folder as libnvidia-ml.so.1 (with the -D defines given); a definition that differs from
    nvml.h's does not compile."""
    if shutil.which("gcc") is None:
        skip_or_fail("gcc is not installed")
    library = folder / "libnvidia-ml.so.1"
    done = subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-Wno-deprecated-declarations",
                           *(f"-D{name}" for name in defines), f"-I{nvml_header_folder()}", "-o", str(library), str(SOURCE)],
                          capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise AssertionError(f"the fake libnvidia-ml does not compile against nvml.h:\n{done.stderr}")
    return library


def exported(library: Path) -> set[str]:
    """The functions the compiled library exports."""
    listing = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, timeout=60, check=True)
    return {line.split()[-1] for line in listing.stdout.splitlines() if " T " in line}


def h100_nvml_answers() -> dict[str, str]:
    """What the recorded H100's NVML answered, as the fake's KEY=VALUE facts: facts.json (pynvml's answers) and, for
    the two versions facts.json lacks, nvidia-smi-q.xml of the same sitting. Fields the recording's NVML answered Not
    Supported (retired pages, NVLink, fabric on this PCIe H100) are left out, so the fake answers Not Supported too."""
    raw = json.loads((H100 / "facts.json").read_text())
    smi = ElementTree.parse(H100 / "nvidia-smi-q.xml").getroot()
    answers = {"count": str(len(raw["gpus"])), "driver_version": raw["driver_version"],
               "cuda_driver_version": str(raw["cuda_driver_version"])}
    for gpu in raw["gpus"]:
        xml_gpu = next(g for g in smi.iter("gpu") if g.get("id") == gpu["pci_bus_id"])
        i = gpu["index"]
        answers.update({
            f"{i}.name": gpu["name"], f"{i}.uuid": gpu["uuid"], f"{i}.pci_bus_id": gpu["pci_bus_id"],
            f"{i}.memory": f"{gpu['memory_total']} {gpu['memory_used']}",
            f"{i}.ecc_mode": " ".join(map(str, gpu["ecc_mode"])),
            f"{i}.ecc_uncorrected": f"{gpu['ecc_uncorrected_volatile']} {gpu['ecc_uncorrected_aggregate']}",
            f"{i}.remapped_rows": " ".join(map(str, gpu["remapped_rows"])),
            f"{i}.mig_mode": " ".join(map(str, gpu["mig_mode"])),
            f"{i}.persistence_mode": str(gpu["persistence_mode"]), f"{i}.compute_mode": str(gpu["compute_mode"]),
            f"{i}.pcie_gen": f"{gpu['pcie_gen_cur']} {gpu['pcie_gen_max']} {gpu['pcie_gen_gpu_max']}",
            f"{i}.pcie_width": f"{gpu['pcie_width_cur']} {gpu['pcie_width_max']}",
            f"{i}.temperature_c": str(gpu["temperature_c"]),
            f"{i}.clocks_event_reasons": str(gpu["clocks_throttle_reasons"]),
            f"{i}.vbios_version": xml_gpu.findtext("vbios_version") or "",
            f"{i}.inforom_image_version": xml_gpu.findtext("inforom_version/img_version") or "",
            # nvidia-smi printed <gpu_recovery_action>None</gpu_recovery_action>: NVML's field value 0.
            f"{i}.field230": "0" if xml_gpu.findtext("gpu_recovery_action") == "None" else "",
        })
    return answers


def write_answers(path: Path, answers: dict[str, str]) -> Path:
    """The fake's facts file."""
    assert all(re.fullmatch(r"[\w.]+", key) and "\n" not in value for key, value in answers.items())
    path.write_text("".join(f"{key}={value}\n" for key, value in answers.items()))
    return path


def probe_on_the_fake(library: Path, answers_file: Path, probe_source: str | None = None) -> dict[str, Any]:
    """The probe's facts with the real nvidia-ml-py loading the fake library (and no nvidia-smi on PATH)."""
    return probe_on_a_gpu_host({"LD_LIBRARY_PATH": str(library.parent), "FAKE_NVML_FACTS": str(answers_file),
                                "PATH": "/usr/bin:/bin"}, probe_source)


def probe_on_a_gpu_host(env: dict[str, str], probe_source: str | None = None) -> dict[str, Any]:
    """The probe's facts, run as the transport runs it (`python3 -`, the script on stdin) with env added to this
    environment, in a mount namespace where /proc/driver/nvidia exists as on a host with the driver."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        skip_or_fail("running the probe as on a GPU host needs root and unshare (a mount namespace)")
    script = f'mount -t tmpfs fake-driver /proc/driver || exit {NO_MOUNT}; mkdir /proc/driver/nvidia && exec "$0" -'
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, sys.executable],
                          input=probe_source if probe_source is not None else PROBE_SOURCE, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **env}, check=False)
    if done.returncode == NO_MOUNT:
        skip_or_fail(f"no tmpfs can be mounted in a mount namespace here: {done.stderr.strip()}")
    if done.returncode != 0:
        raise AssertionError(f"the probe failed:\n{done.stderr}")
    facts: dict[str, Any] = json.loads(done.stdout)
    return facts


# nvidia-smi as on the recorded H100: the CSV row is nvidia-smi.txt's values (the compute process left out, as
# facts.json counted none), -q -x prints the file FAKE_SMI_XML names, and the fabric and NVLink queries print nothing
# (a PCIe H100: N/A, Not Supported).
FAKE_SMI = """#!/bin/sh
case "$*" in
  *--query-gpu=*) echo "0, GPU-68238f7a-fa6f-b6b8-6132-63c29858a94f, 00000000:00:06.0, 81559, 2847, Enabled, 0, 0, 5, 5, 16, \
16, Enabled, Default, [N/A], 580.159.04, NVIDIA H100 80GB HBM3" ;;
  *--query-remapped-rows=*) echo "00000000:00:06.0, No, No" ;;
  "-q -x") cat "$FAKE_SMI_XML" ;;
esac
"""


def fake_nvidia_smi(folder: Path) -> Path:
    """A folder holding the fake nvidia-smi, to put on PATH."""
    smi = folder / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    return folder
