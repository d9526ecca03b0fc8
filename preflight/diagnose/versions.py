"""Versions and settings a log names: the driver, CUDA, NCCL and torch versions and the NCCL_* variables, wherever they
appear (nvidia-smi's header, NCCL's INFO banner, torch's collect_env, Lightning's and pip's listings), each checked
against the shipped denylist and pins with the same functions `preflight check` uses (checks/versions.py).

A log that names a denylisted driver or NCCL points at it even when no error line matches: that is how a hang with the
545 driver's broken peer-to-peer shows up in a log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache

import yaml

from preflight.checks.versions import LABELS, PIN_CODES, matches, parse_version
from preflight.diagnose.lines import lines_with, literal_finder
from preflight.diagnose.scan import Diagnosis, Excerpt, line_excerpt
from preflight.errors import EnvironmentProblem
from preflight.resources import shipped_dir
from preflight.spec import DenyEntry, PinsConfig

DENYLIST_CHECK = "PF102: preflight check cluster=NAME playbook=facts holds every host's versions against the denylist"
SHIPPED_PINS = "current"  # the conf/pins profile a log is held against (the default profile of `preflight check`)
KEPT_SETTINGS = 64

# Each pattern captures one component (its group's name is the component, as checks/versions.py names them).
MENTIONS: tuple[re.Pattern[str], ...] = tuple(re.compile(source) for source in (
    # nvidia-smi's header: "| NVIDIA-SMI 545.29.02   Driver Version: 545.29.02   CUDA Version: 12.3 |"
    r"Driver Version: (?P<driver>\d+\.\d+(?:\.\d+)?)\s+CUDA Version: (?P<cuda_driver>\d+\.\d+)",
    r"NVIDIA-SMI (?P<driver>\d+\.\d+(?:\.\d+)?)",
    # NCCL's banner with NCCL_DEBUG=INFO, and torch's error messages: "NCCL version 2.19.3+cuda12.3"
    r"NCCL version (?P<nccl>\d+\.\d+\.\d+)",
    r"NCCL INFO cudaDriverVersion (?P<cuda_driver_int>\d{4,6})",
    # python -m torch.utils.collect_env
    r"Nvidia driver version: (?P<driver>\d+\.\d+(?:\.\d+)?)",
    r"PyTorch version: (?P<torch>\d+\.\d+\.\d+\S*)",
    r"CUDA used to build PyTorch: (?P<torch_cuda>\d+\.\d+)",
    # pip and conda listings (collect_env's "[pip3] torch==2.1.0", "[conda] pytorch 2.1.0"), Lightning's env dump
    r"\[(?:pip3?|conda)\]\s+(?:torch|pytorch)(?:==|\s+)(?P<torch>\d+\.\d+\.\d+\S*)",
    r"\[(?:pip3?|conda)\]\s+nvidia-nccl-cu\d+(?:==|\s+)(?P<nccl>\d+\.\d+\.\d+)",
    r"- torch:\s+(?P<torch>\d+\.\d+\.\d+\S*)",
    # `pip list`: "torch                   2.11.0", "nvidia-nccl-cu13        2.28.9"
    r"^torch\s+(?P<torch>\d+\.\d+\.\d+\S*)\s*$",
    r"^nvidia-nccl-cu\d+\s+(?P<nccl>\d+\.\d+\.\d+)",
    # `pip freeze` and requirements echoed into a log: "torch==2.1.0+cu121", "nvidia-nccl-cu12==2.20.5"
    r"(?<![\w-])torch==(?P<torch>\d+\.\d+\.\d+[^\s,;'\"]*)",
    r"(?<![\w-])nvidia-nccl-cu\d+==(?P<nccl>\d+\.\d+\.\d+)",
))
# NCCL_* and TORCH_NCCL_* settings, and NAME=VALUE anywhere. NCCL prints the variable's text whole: param.cc's
# "%s set by environment to %s" (some callers end it with "."), net_ib.cc's "NCCL_IB_HCA set to %s" and socket.cc's
# "NCCL_SOCKET_IFNAME set to %s". A value is a list ("mlx5_0:1,mlx5_1:1", "^docker,lo"), an address ("10.1.0.11:29500")
# or a word, so it runs to the next blank; a sentence's own "." or "," after it is not part of it (_value).
SETTINGS = (re.compile(r"NCCL INFO (?P<name>NCCL_[A-Z0-9_]+) set (?:by environment )?to (?P<value>\S+)"),
            re.compile(r"(?<![A-Za-z0-9])(?P<name>(?:TORCH_)?NCCL_[A-Z0-9_]+)=(?P<value>[^\s;'\"`)\]]+)"))


def _value(text: str) -> str:
    """A setting's value without the punctuation of the sentence around it."""
    return text.rstrip(".,") or text
# Literal words every version or setting line contains: only lines holding one are matched against the patterns.
_WORDS = literal_finder("Driver Version: ", "NVIDIA-SMI ", "NCCL version ", "cudaDriverVersion ", "Nvidia driver version: ",
                        "PyTorch version: ", "CUDA used to build PyTorch: ", "[pip", "[conda]", "- torch:", "torch ",
                        "nvidia-nccl-cu", "NCCL_", "torch==")


@cache
def shipped_pins() -> PinsConfig:
    """The shipped pins profile (conf/pins/current.yaml): its pins and its denylist."""
    path = shipped_dir("conf") / "pins" / f"{SHIPPED_PINS}.yaml"
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
        denylist = [DenyEntry(component=e["component"], specifier=e["specifier"], reason=" ".join(str(e["reason"]).split()),
                              workaround_env=dict(e.get("workaround_env") or {}), source=str(e.get("source") or ""))
                    for e in data.get("denylist") or []]
        pins = {component: str(data.get(component) or "") for component in PIN_CODES}
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as e:
        raise EnvironmentProblem(f"diagnose: cannot read the shipped pins {path}: {e}") from None
    return PinsConfig(**pins, denylist=denylist)


@dataclass
class VersionReader:
    """Feed it a log's blocks; then ask for what the log named and what of it the denylist and pins reject."""

    source: str = ""
    lines: int = 0
    seen: dict[str, dict[str, Excerpt]] = field(default_factory=dict)  # component -> version -> where first named
    settings: dict[str, str] = field(default_factory=dict)

    def start(self, source: str) -> None:
        """A new file begins (a folder's next log)."""
        self.source, self.lines = source, 0

    def feed(self, block: str) -> None:
        for line, text in lines_with(_WORDS, block, self.lines + 1):
            for pattern in MENTIONS:
                for match in pattern.finditer(text):
                    for component, value in match.groupdict().items():
                        if value is None:
                            continue
                        if component == "cuda_driver_int":  # NCCL prints the driver's CUDA as 12030
                            component, value = "cuda_driver", f"{int(value) // 1000}.{int(value) % 1000 // 10}"
                        versions = self.seen.setdefault(component, {})
                        if value not in versions and len(versions) < KEPT_SETTINGS:
                            versions[value] = Excerpt(line, line_excerpt(text, match.start()), self.source)
            for pattern in SETTINGS:
                for match in pattern.finditer(text):
                    if match["name"] in self.settings or len(self.settings) < KEPT_SETTINGS:
                        self.settings[match["name"]] = _value(match["value"])
        self.lines += block.count("\n")

    def named(self) -> dict[str, list[str]]:
        """What the log named: each component's versions, and the settings."""
        found = {LABELS[c]: list(v) for c, v in self.seen.items()}
        if self.settings:
            found["settings"] = [f"{name}={value}" for name, value in sorted(self.settings.items())]
        return found

    def outside_pins(self, pins: PinsConfig | None = None) -> list[str]:
        """Versions outside the shipped pins, as 'CODE label version (pin)': worth knowing, not a failure by itself."""
        pins = pins or shipped_pins()
        out = []
        for component, versions in self.seen.items():
            pin = getattr(pins, component, "")
            for raw in versions:
                version = parse_version(raw)
                if pin and version is not None and not matches(pin, version):
                    out.append(f"{PIN_CODES[component]} {LABELS[component]} {raw} does not satisfy {pin}")
        return out

    def denylisted(self, pins: PinsConfig | None = None) -> Diagnosis | None:
        """PF102 when the log names a denylisted version: which, where, and the denylist's reason."""
        pins = pins or shipped_pins()
        hits: list[tuple[DenyEntry, str, Excerpt]] = []
        for entry in pins.denylist:
            for raw, where in self.seen.get(entry.component, {}).items():
                version = parse_version(raw)
                if version is not None and matches(entry.specifier, version):
                    hits.append((entry, raw, where))
        if not hits:
            return None
        details: dict[str, list[str]] = {}
        for entry, raw, _ in hits:
            source = f"; {entry.source}" if entry.source else ""
            details.setdefault(LABELS[entry.component], []).append(f"{raw} (denylisted {entry.specifier}: {entry.reason}{source})")
        excerpts = sorted({where for _, _, where in hits}, key=lambda e: (e.source, e.line))
        workaround = sorted({f"{k}={v}" for entry, _, _ in hits for k, v in entry.workaround_env.items()})
        if workaround:
            details["workaround"] = workaround
        return Diagnosis(code="PF102", codes=("PF102", "PF606"), tier="cause", signatures=("version-in-log",),
                         first_line=excerpts[0].line, matches=len(hits), excerpts=tuple(excerpts[:3]), details=details, ranks=(),
                         before_job=DENYLIST_CHECK)
