"""Per-host checks of versions (PF1xx): the driver, each pin, the denylist, torch's CUDA against the driver's, the two NCCLs."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from preflight.checks.registry import ClusterView, host_check, host_finding
from preflight.facts import HostFacts
from preflight.findings import Finding, Status
from preflight.records import HostRecord, driver_mismatched, gpus_denied, has_driver

# The version each pinnable component has, as the probe reports it.
COMPONENTS: dict[str, Callable[[HostFacts], str | None]] = {
    "driver": lambda f: f["gpu"]["driver_version"],
    "cuda_driver": lambda f: f["gpu"]["cuda_driver_version"],
    "torch": lambda f: f["torch"]["version"],
    "torch_cuda": lambda f: f["torch"]["cuda"],
    "nccl": lambda f: f["torch"]["nccl_version"],
}
GPU_COMPONENTS = ("driver", "cuda_driver", "torch_cuda", "nccl")
LABELS = {
    "driver": "NVIDIA driver",
    "cuda_driver": "CUDA (driver API)",
    "torch": "torch",
    "torch_cuda": "torch's CUDA",
    "nccl": "the NCCL torch loads",
}
PIN_CODES = {"driver": "PF101", "cuda_driver": "PF103", "torch": "PF104", "torch_cuda": "PF105", "nccl": "PF107"}


def parse_version(text: str | None) -> Version | None:
    """A PEP 440 version, or None when absent or unparsable."""
    if not text:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        return None


def matches(specifier: str, version: Version) -> bool:
    """Whether a version satisfies a specifier; pre-releases and local tags count."""
    return SpecifierSet(specifier, prereleases=True).contains(version)



# PyPI's torch wheels for Linux carry CUDA (several GB); a CPU host wants PyTorch's own CPU index.
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"


def torch_install_command(python: str, pin: str, uses_gpus: bool) -> str:
    """The one command that installs torch (within the pin) into that python: the CUDA build from PyPI for a GPU
    cluster, the CPU build for a gloo one."""
    command = f"{shlex.quote(python)} -m pip install {shlex.quote('torch' + pin.replace(' ', ''))}"
    return command if uses_gpus else f"{command} --index-url {CPU_TORCH_INDEX}"


@host_check("PF100")
def driver_present(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """A GPU cluster needs the NVIDIA driver; a gloo cluster does not."""
    gpu = record.facts["gpu"]
    if has_driver(record.facts):
        yield host_finding("PF100", Status.passed, record, f"NVIDIA driver {gpu['driver_version']} read through {gpu['source']}")
    elif view.uses_gpus and driver_mismatched(record.facts):  # not a missing driver: its fix is a reboot
        yield host_finding(
            "PF100", Status.fail, record,
            f"the NVIDIA kernel module is another driver version than its libraries (upgraded, not yet rebooted): {gpu['error']}",
            "reboot the host, or drain it and reload the nvidia modules, so that the module matches the installed "
            "driver (`preflight explain PF731`)",
        )
    elif view.uses_gpus and gpus_denied(record.facts):  # not a missing driver: the container's device rules are gone
        yield host_finding(
            "PF100", Status.fail, record,
            f"the NVIDIA driver is loaded but NVML may not open the GPUs (in a container: its access to them was taken "
            f"away): {gpu['error']}",
            "recreate the container; to stop it recurring, create the /dev/char links of the NVIDIA devices at boot "
            "(nvidia-ctk system create-dev-char-symlinks --create-all) or use the cgroupfs cgroup driver "
            "(`preflight explain PF732`)",
        )
    elif view.uses_gpus:
        yield host_finding(
            "PF100", Status.fail, record, f"no NVIDIA driver: {gpu['error']}",
            "install the NVIDIA driver and check `nvidia-smi`; or set training.backend=gloo for a CPU cluster",
        )
    else:
        yield host_finding("PF100", Status.passed, record, "no NVIDIA driver; none needed for the gloo backend")


@host_check("PF101", "PF103", "PF104", "PF105", "PF107")
def version_pins(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """Every pinned component's version satisfies its PEP 440 specifier."""
    facts = record.facts
    for component, code in PIN_CODES.items():
        if component in GPU_COMPONENTS and not (view.uses_gpus and has_driver(facts)):
            continue  # no GPU stack to pin (PF100 covers a missing driver on a GPU cluster)
        pin = view.pin(component)
        raw = COMPONENTS[component](facts)
        label = LABELS[component]
        if component == "torch" and not facts["torch"]["installed"]:
            python = facts["host"]["python_executable"]
            yield host_finding(code, Status.fail, record, f"torch is not installed for {python}",
                               f"install it: `{torch_install_command(python, pin, view.uses_gpus)}`; "
                               "or point the host's `python` at the training environment")
            continue
        if component == "torch_cuda" and raw is None:
            yield host_finding(code, Status.fail, record, f"torch {facts['torch']['version']} is a CPU build; the nccl backend needs CUDA",
                               "install a CUDA build of torch")
            continue
        version = parse_version(raw)
        if version is None:
            yield host_finding(code, Status.unknown if pin else Status.passed, record,
                               f"{label} version could not be read ({raw!r})",
                               "check the installation of this component" if pin else "")
        elif not pin:
            yield host_finding(code, Status.passed, record, f"{label} {raw} (not pinned)")
        elif matches(pin, version):
            yield host_finding(code, Status.passed, record, f"{label} {raw} satisfies {pin}")
        else:
            yield host_finding(code, Status.fail, record, f"{label} {raw} does not satisfy {pin}",
                               f"install a {label} version matching {pin}, or change pins.{component}")


@host_check("PF102")
def denylist(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """No component runs a version known to break distributed training."""
    hits = []
    for entry in view.config.pins.denylist:
        version = parse_version(COMPONENTS[entry.component](record.facts))
        if version is not None and matches(entry.specifier, version):
            hits.append(entry)
    for entry in hits:
        raw = COMPONENTS[entry.component](record.facts)
        label = LABELS[entry.component]
        source = f" (source: {entry.source})" if entry.source else ""
        yield host_finding("PF102", Status.fail, record, f"{label} {raw} is denylisted ({entry.specifier}): {entry.reason}{source}",
                           f"move {label} off {entry.specifier}; see `preflight explain PF102`", dict(entry.workaround_env))
    if not hits:
        yield host_finding("PF102", Status.passed, record, "no denylisted version")


def _major_minor(text: str | None) -> tuple[int, int] | None:
    version = parse_version(text)
    if version is None:
        return None
    release = (*version.release, 0)
    return release[0], release[1]


@host_check("PF106")
def torch_cuda_vs_driver(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """torch's CUDA must not be newer than the CUDA the driver supports."""
    facts = record.facts
    if not (view.uses_gpus and has_driver(facts)):
        return
    built = _major_minor(facts["torch"]["cuda"])
    supported = _major_minor(facts["gpu"]["cuda_driver_version"])
    if built is None or supported is None:
        return  # PF105 reports a CPU build; a driver without a CUDA version is PF103's
    torch_cuda, driver_cuda = facts["torch"]["cuda"], facts["gpu"]["cuda_driver_version"]
    if built[0] > supported[0]:
        yield host_finding("PF106", Status.fail, record,
                           f"torch is built for CUDA {torch_cuda} but the driver supports CUDA {driver_cuda}: CUDA init fails",
                           f"upgrade the driver to one supporting CUDA {torch_cuda}, or install torch built for CUDA {supported[0]}.x")
    elif built > supported:
        yield host_finding("PF106", Status.warn, record,
                           f"torch is built for CUDA {torch_cuda}, the driver supports {driver_cuda}: "
                           "minor-version compatibility only (PTX JIT and newer features fail)",
                           f"upgrade the driver to one supporting CUDA {torch_cuda}")
    else:
        yield host_finding("PF106", Status.passed, record, f"torch's CUDA {torch_cuda} <= the driver's CUDA {driver_cuda}")


@host_check("PF108")
def nccl_two_answers(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """Say which NCCL torch loads when the system has a different one (information, not a fault)."""
    torch_nccl = record.facts["torch"]["nccl_version"]
    system_nccl = record.facts["nccl"]["system_version"]
    if view.uses_gpus and torch_nccl and system_nccl and torch_nccl != system_nccl:
        yield host_finding("PF108", Status.passed, record,
                           f"torch loads NCCL {torch_nccl} ({record.facts['torch']['nccl_library']}); "
                           f"the system's libnccl is {system_nccl}: NCCL_VERSION and nccl-tests describe the latter")
