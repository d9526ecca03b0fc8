"""Finding what a sandbox left on this machine, and removing it, whoever built it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from preflight.errors import EnvironmentProblem
from preflight.sandbox.cgroups import groups_of, release
from preflight.sandbox.layout import DEFAULT_PREFIX, DEFAULT_STATE_ROOT
from preflight.sandbox.system import TEARDOWN_TIMEOUT_S, ip_batch

_NETNS_DIR = Path("/run/netns")  # where `ip netns add` pins namespaces


def _namespaces(prefix: str) -> list[str]:
    pattern = re.compile(rf"^{re.escape(prefix)}-h[0-9]+$")
    names = os.listdir(_NETNS_DIR) if _NETNS_DIR.is_dir() else []
    return sorted(n for n in names if pattern.match(n))


def _links(prefix: str) -> list[str]:
    # The bridge and each host's veth, and with rails each rail's bridge (br0, br1, ...) and veths (h1r0, ...).
    pattern = re.compile(rf"^{re.escape(prefix)}-(br[0-9]?|h[0-9]+(-v|r[0-9]))$")
    return sorted(n for n in os.listdir("/sys/class/net") if pattern.match(n))


def netns_pids(namespaces: Sequence[str]) -> dict[str, list[int]]:
    """What `ip netns pids` gives, for many namespaces in one pass over /proc."""
    wanted: dict[tuple[int, int], str] = {}
    for ns in namespaces:
        try:
            st = os.stat(_NETNS_DIR / ns)
        except FileNotFoundError:
            continue
        wanted[(st.st_dev, st.st_ino)] = ns
    found: dict[str, list[int]] = {ns: [] for ns in namespaces}
    if not wanted:
        return found
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:  # gone, or a zombie, which has no namespaces left
            continue
        ns_name = wanted.get((st.st_dev, st.st_ino))
        if ns_name is not None:
            found[ns_name].append(int(entry))
    return found


def leftovers(prefix: str = DEFAULT_PREFIX, *, state_root: Path | str = DEFAULT_STATE_ROOT) -> list[str]:
    """What exists of sandbox `prefix`: namespaces, interfaces, processes, cgroups and its state folder; [] when it is all
    gone."""
    state_root = Path(state_root)
    namespaces = _namespaces(prefix)
    found = [f"namespace {ns}" for ns in namespaces] + [f"interface {link}" for link in _links(prefix)]
    found += [f"process {pid} in {ns}" for ns, pids in netns_pids(namespaces).items() for pid in pids]
    found += [f"cgroup {path}" for path in groups_of(prefix)]
    if (state_root / prefix).exists():
        found.append(f"folder {state_root / prefix}")
    return found


def _kill_namespaces(namespaces: Sequence[str], deadline: float) -> None:
    """SIGKILL every process in the namespaces, until none is left (sshd may fork while we kill)."""
    for _ in range(10_000):
        pids = [pid for ns_pids in netns_pids(namespaces).values() for pid in ns_pids]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    raise EnvironmentProblem(f"sandbox: processes {pids} in {', '.join(namespaces)} survive SIGKILL")


def tear_down(prefix: str, state_root: Path, children: Sequence[subprocess.Popen[bytes]] = ()) -> list[str]:
    """Remove everything of sandbox `prefix`, whoever built it, within TEARDOWN_TIMEOUT_S; returns what was there."""
    # A second Ctrl-C during teardown must not leave half a sandbox: the signals wait until it is done.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
    try:
        return _remove(prefix, state_root, children)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _remove(prefix: str, state_root: Path, children: Sequence[subprocess.Popen[bytes]]) -> list[str]:
    # One deadline for every step: waits that each had their own added up with the hosts (a 128-host sandbox reaps 384
    # children), and whoever waits on a teardown (atexit, a test) needs its whole bound.
    deadline = time.monotonic() + TEARDOWN_TIMEOUT_S
    found = leftovers(prefix, state_root=state_root)
    namespaces = _namespaces(prefix)
    _kill_namespaces(namespaces, deadline)
    for child in children:  # reap them: they were in the namespaces, all killed above
        try:
            child.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            child.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=1.0)
    links = _links(prefix)
    if links or namespaces:
        # Deleting the veth first removes both ends now; a deleted namespace frees its end later.
        ip_batch([f"link del {link}" for link in links] + [f"netns del {ns}" for ns in namespaces], force=True,
                 timeout=max(deadline - time.monotonic(), 1.0))
    state_dir = state_root / prefix
    for group in groups_of(prefix):  # a throttled host's (Faults.throttle_cpu), empty now
        release(group)
    for config in _recorded_configs(state_dir):
        config.unlink(missing_ok=True)
    shutil.rmtree(state_dir, ignore_errors=True)
    for _ in range(10_000):
        remaining = leftovers(prefix, state_root=state_root)
        if not remaining:
            return found
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    raise EnvironmentProblem(f"sandbox: could not remove {'; '.join(remaining)} in {TEARDOWN_TIMEOUT_S:.0f} s")


def _recorded_configs(state_dir: Path) -> list[Path]:
    try:
        state = json.loads((state_dir / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [Path(p) for p in state.get("configs", [])]
