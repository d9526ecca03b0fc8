"""The README's quick start, run as written in a clean virtual environment: `pip install . && preflight check` installs
the project and its dependencies from scratch and ends in a passing check whose two gloo ranks verified the all_gather.

The venv has no system site-packages. torch is the one thing not installed into it: torch belongs to the user's
training environment (the quick start's line before, which on this machine would unpack the same local 190 MB wheel
in 33 s of the suite's time), so the venv sees this machine's installed torch and its own requirements through a
.pth file pointing at a folder of links to exactly those distributions. Everything preflight needs comes from pip.
No numpy either, as in a fresh environment: torch's all_gather_object needs it, and the ranks once used that.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from packaging.requirements import Requirement

# The quick start's check rendezvous on the default port 29500 on loopback, as a user's does (conftest.py).
pytestmark = pytest.mark.this_machine

ROOT = Path(__file__).resolve().parent.parent
INSTALL_TIMEOUT_S = 300
DEFAULT_MASTER_PORT = 29500  # conf/network/default.yaml
PORT_WAIT_S = 60


def wait_for_free_port(port: int) -> None:
    """The quick start's check rendezvous on the default port, as a user's would; a check run beside this test (a
    developer's, on a shared machine) may hold it for a few seconds, which would make this one incomplete (exit 3)."""
    deadline = time.monotonic() + PORT_WAIT_S
    while True:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
                return
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"port {port} stayed taken for {PORT_WAIT_S} s: the quick start's check cannot rendezvous")
        time.sleep(1)


def quick_start_lines() -> list[str]:
    """The command lines of the README's quick start block."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "the quick start has no sh block"
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def torch_distributions() -> set[str]:
    """torch and every distribution it requires (markers evaluated for this interpreter, no extras)."""
    found: set[str] = set()
    todo = ["torch"]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        for text in metadata.distribution(name).requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name.lower().replace("_", "-"))
    return found


def link_torch(site_packages: Path, folder: Path) -> None:
    """Make this machine's torch importable in the venv, and nothing else of this machine's site-packages."""
    folder.mkdir()
    for name in sorted(torch_distributions()):
        dist = metadata.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops - {"bin"}:
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (folder / top).exists():
                (folder / top).symlink_to(source)
    (site_packages / "training-environment-torch.pth").write_text(f"{folder}\n")


def test_quick_start_installs_and_passes_in_a_clean_venv(tmp_path: Path) -> None:
    lines = quick_start_lines()
    command = "pip install . && preflight check"
    assert command in lines, lines
    if shutil.which("git") is None:
        pytest.fail("git is needed to copy the repository's files")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    site_packages = next((venv / "lib").glob("python3*/site-packages"))
    link_torch(site_packages, tmp_path / "torch-links")
    # The checkout as a user has it: the repository's files, not this tree's build outputs or state.
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, timeout=60).stdout.decode().split("\0")
    checkout = tmp_path / "preflight"
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, checkout / name)
    assert f"master_port: {DEFAULT_MASTER_PORT}\n" in (ROOT / "conf" / "network" / "default.yaml").read_text()
    wait_for_free_port(DEFAULT_MASTER_PORT)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "NO_COLOR", "FORCE_COLOR")}
    env["COLUMNS"] = "100"
    # conftest gave this run a config folder of its own (XDG_CONFIG_HOME), where pip looks for its user config too: a
    # machine's own (an index, a folder of wheels) comes along, as the user's pip would read it.
    pip_conf = Path.home() / ".config" / "pip" / "pip.conf"
    if pip_conf.is_file() and "PIP_CONFIG_FILE" not in env:
        env["PIP_CONFIG_FILE"] = str(pip_conf)
    result = subprocess.run(["bash", "-c", f". {venv}/bin/activate && {command}"], cwd=checkout, env=env, capture_output=True,
                            text=True, timeout=INSTALL_TIMEOUT_S, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import preflight; print(preflight.__file__)"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    assert where.startswith(str(site_packages)), where  # the installed package, not the checkout
    # torch does not require numpy, and a fresh environment has none: the ranks' identity exchange once needed it.
    numpy = subprocess.run([str(venv / "bin" / "python"), "-c", "import numpy"], env=env, capture_output=True, timeout=60, check=False)
    assert numpy.returncode != 0
    flat = " ".join(result.stdout.split())
    assert "collective PASS 1 host(s) x 2 rank(s) at localhost:" in flat
    assert "every byte of the all_gather verified" in flat and "0 wrong" in flat
    assert "bandwidth (gloo, 2 ranks" in flat
    assert "PASS local: 1 host(s) (1 pass), playbook full" in flat
    # One host has no path between hosts and no other host to be judged against: said so, not "0 TCP paths open, MTU
    # passed on 0 paths", "0 link figure(s), median unknown GB/s" or "judged against each other".
    assert "connectivity PASS 1 host: rendezvous port localhost:" in flat and "open; no path between hosts to test" in flat
    assert "speed no neighbour test: no link between hosts; compute median " in flat
    assert "judged against each other" not in flat and "0 TCP paths" not in flat and "link figure(s)" not in flat
