"""Shared fixtures: the namespace test cluster (preflight.sandbox), built per test run and always torn down."""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, NoReturn

import pytest

from preflight.errors import EnvironmentProblem
from preflight.sandbox import DEFAULT_STATE_ROOT, HostQuirks, Sandbox, check_requirements, subnet_count

REQUIRE_SANDBOX_ENV = "PREFLIGHT_REQUIRE_SANDBOX"  # CI sets it to 1: a missing sandbox fails instead of skipping
REQUIRE_GPU_ENV = "PREFLIGHT_REQUIRE_GPU"  # a run on a GPU host sets it to 1: a missing GPU fails instead of skipping
# The default sandbox, up when a test of `preflight sandbox up` starts: a user's, or left by a killed run. Never taken
# down by a test (it may be someone's work): such a test skips, and fails the run in CI.
LEFT_UP = "the default sandbox `pf` is up on this machine (a user's `preflight sandbox up`, or a killed test run's): " \
          "`preflight sandbox down` removes it"
# A dot keeps the folder out of the sandbox prefixes' namespace (lowercase letters and digits).
LOCKS = DEFAULT_STATE_ROOT / ".locks"
# 6 slots (a suite's 3 workers and a few sessions beside it) of 42 subnets: a worker that draws the units that build
# the most (the bench smokes, the band tests) built 17 in one run of 2026-11-26, past the 16 it had; with the rails
# (a subnet per rail) one worker went past 32 in the run of 2026-11-27 09:00.
_SLOTS = 6
_CLUSTERS_PER_SLOT = 42
# Tests use 198.19.0.0/16 (indexes 256 and up); 198.18.0.0/16 stays free for `preflight sandbox up`.
_FIRST_INDEX = 256


# The suite runs on three pytest-xdist workers (`-n 3 --dist loadgroup`, pyproject.toml) on two cores: a quarter of its
# time a worker waits on deadlines and SSH round trips, which a third worker fills (measured 7 min 28 s against 7 min 52 s
# to 8 min 34 s on two). Each module is one work unit, so its module-scoped clusters and checks are built once.
# A test that uses what this machine has only one of carries the marker `this_machine` (its own, or its module's
# pytestmark): the default rendezvous port 29500 on loopback (a local check, the quick start) and the default sandbox
# `pf` (its namespaces, its bridge, 198.18.0.0/16). Those tests run in one unit, one after the other;
# tests/test_suite.py fails any test that uses one of them without the marker. The user's config and cache folders are
# no longer among them: every test session has its own (pytest_configure below).
THIS_MACHINE_MARKER = "this_machine"
USER_FOLDERS = ("XDG_CONFIG_HOME", "XDG_CACHE_HOME")
FUZZ_SEED_ENV = "PREFLIGHT_FUZZ_SEED"  # the random fuzz's seed (tests/test_config_fuzz.py): given to replay a run
THIS_MACHINE_UNIT = "this-machine"
# Serial seconds of the heaviest units on the 2-core development machine (each test's wall time in one serial run,
# 2026-11-25, summed per unit): they start first, so the last unit to finish is a short one. A unit not listed is light.
# test_collective-own-clusters (the six-host split) was half of test_collective's own unit in one serial run of 2026-11-27
# (190 s against 371 s, load 15 to 17), not a third.
HEAVIEST_SECONDS = {"test_collective": 115, "test_speed": 70, "test_emit_launch": 65, "test_collective-own-clusters": 60,
                    "test_pairwise": 45, THIS_MACHINE_UNIT: 45, "test_config_fuzz": 35, "test_interrupt": 31, "test_scale": 30,
                    "test_slurm": 60, "test_worker": 25, "test_blame": 65, "test_connectivity": 22, "test_cli": 17,
                    "test_lost_host": 35, "test_ssh_transport": 28, "test_config": 16, "test_agent": 15, "test_report_outputs": 11,
                    "test_storage": 8,
                    # tests/test_speed_band.py, a unit per cluster size (three default checks each, 2026-11-26, load 5-10)
                    "test_speed_band-6": 100, "test_speed_band-4": 90,
                    # tests/test_bench_smoke.py's benches that build hosts, each a unit (alone, 2026-11-26, load 4 to 7; those
                    # whose --smoke left a step out, 2026-11-27, load 2.5 to 5)
                    "test_bench_smoke-collective_speed": 23, "test_bench_smoke-speed_relative": 25,
                    "test_bench_smoke-check_speed": 44, "test_bench_smoke-pairwise": 19, "test_bench_smoke-storage_speed": 15,
                    "test_bench_smoke-false_alarms": 14, "test_bench_smoke-speed_band": 21,
                    "test_bench_smoke-rail_connectivity": 30,  # 29 s alone, 2026-11-27, load 12
                    "test_bench_smoke-agent_scale": 62,  # 61 to 64 s alone, 2026-11-27, load 10 to 40
                    # Units added on 2026-11-27, from that day's runs beside other work (load 10 to 40): agent against
                    # check (three pairs of checks, and an agents-only run of 25 to 46 s), the sbatch under torchrun, rails
                    # in the collective, 1,000 hosts
                    "test_agent_check": 190, "test_agent_sbatch": 100, "test_cluster_file_scale": 50,
                    "test_rails_speed": 145}  # + its band test (a rail at 0.4x), 31 to 46 s alone, 2026-11-27, load 2 to 7


def work_unit(item: pytest.Item) -> str:
    """The xdist work unit a test runs in: its module's, unless it is marked this_machine or names its own group."""
    if item.get_closest_marker(THIS_MACHINE_MARKER) is not None:
        return THIS_MACHINE_UNIT
    marker = item.get_closest_marker("xdist_group")
    if marker is not None:
        return str(marker.args[0] if marker.args else marker.kwargs["name"])
    return item.path.stem


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Name every test's work unit for xdist's loadgroup, and run the heaviest units first (stable within a unit)."""
    for item in items:
        unit = work_unit(item)
        if item.get_closest_marker("xdist_group") is None or unit == THIS_MACHINE_UNIT:
            # First among the test's markers: xdist reads the closest one, and a this_machine test's own group yields.
            item.add_marker(pytest.mark.xdist_group(unit), append=False)
    items.sort(key=lambda item: -HEAVIEST_SECONDS.get(work_unit(item), 0))


def skip_or_fail(why: str, *, gpu: bool = False) -> NoReturn:
    """Skip a test this machine cannot run, the one way a test skips (tests/test_suite.py holds the suite to it); fail it
    where the run demands it: PREFLIGHT_REQUIRE_SANDBOX=1 (CI) for what CI's machines have (root, namespaces, the tools
    tests/setup.sh installs, no other session in the way), PREFLIGHT_REQUIRE_GPU=1 for what only a GPU host has
    (gpu=True: a GPU, nvidia-smi, a CUDA build of torch), which CI's machines do not."""
    required = REQUIRE_GPU_ENV if gpu else REQUIRE_SANDBOX_ENV
    if os.environ.get(required) == "1":
        pytest.fail(f"{required}=1 but {why}", pytrace=False)
    pytest.skip(why)


def eventually(condition: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    """Whether condition holds by the deadline, asked every 50 ms: a test waits for what it expects, never a fixed time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def preflight_exe() -> str:
    """The installed console script, as users run it."""
    exe = shutil.which("preflight")
    if exe is None:
        pytest.fail("the console script `preflight` is not installed (pip install -e .)")
    return exe


def preflight(*args: str, cwd: Path | None = None, stdin: str | None = None, env: Mapping[str, str] | None = None,
              timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`preflight ARGS...` run to its end (bounded by timeout), its output captured."""
    return subprocess.run([preflight_exe(), *args], cwd=cwd, input=stdin, env=None if env is None else dict(env),
                          capture_output=True, text=True, timeout=timeout, check=False)


def free_port() -> int:
    """A loopback port free at this moment."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pytest_configure(config: pytest.Config) -> None:
    """Every test session (each xdist worker too) gets empty config and cache folders of its own, XDG_CONFIG_HOME and
    XDG_CACHE_HOME, from collection on, in this process and the commands it starts: what the user or another session
    keeps in ~/.config/preflight (a cluster named like a test's, a `sandbox up`'s config) or ~/.cache/preflight can
    change no test's answer."""
    folder = Path(tempfile.mkdtemp(prefix="preflight-tests-user-"))
    saved = {name: os.environ.get(name) for name in USER_FOLDERS}
    for name in USER_FOLDERS:
        os.environ[name] = str(folder / name.lower())

    def restore() -> None:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(folder, ignore_errors=True)

    config.add_cleanup(restore)
    # Picked here, before xdist starts its workers, which inherit it: every process of the run draws the same values.
    os.environ.setdefault(FUZZ_SEED_ENV, str(secrets.randbits(32)))
    # A suite started as a script's background job inherits SIGINT ignored, and so would every check it starts (an
    # ignored signal stays ignored across exec; Python then installs no KeyboardInterrupt handler): the interrupt tests'
    # Ctrl-C would do nothing. A handler of this process's own resets to the default in each process it starts.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_report_header() -> str:
    """The run's fuzz seed, at the top of its output: `PREFLIGHT_FUZZ_SEED=N python3 -m pytest ...` replays it."""
    return f"fuzz seed: {FUZZ_SEED_ENV}={os.environ[FUZZ_SEED_ENV]}"


def claim_lock(name: str) -> IO[str] | None:
    """An exclusive lock on LOCKS/name held while the file stays open, or None if another process holds it.

    The kernel drops the lock when its holder dies, so the holder may remove whatever a killed
    holder left under that name."""
    LOCKS.mkdir(parents=True, exist_ok=True)
    lock = open(LOCKS / f"{name}.lock", "w")  # noqa: SIM115 - it must stay open as long as the lock is held
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    return lock


class SandboxFactory:
    """Builds sandboxes whose prefixes and subnets no other cluster uses, and tears them all down.

    Each test session (or xdist worker) claims a slot by lock, so concurrent sessions on one
    machine never touch each other's clusters."""

    def __init__(self) -> None:
        for slot in range(_SLOTS):
            lock = claim_lock(f"slot{slot:02d}")
            if lock is not None:
                break
        else:
            raise RuntimeError(f"all {_SLOTS} sandbox slots are held by other test sessions")
        self.slot = slot
        self._lock = lock
        self._count = 0
        self._reserved: list[str] = []

    def reserve(self, subnets: int = 1) -> tuple[str, int]:
        """A fresh (prefix, index) for a sandbox built some other way (e.g. in a subprocess), its subnets the /24s from
        index on (a sandbox with rails takes more: layout.subnet_count); removed at the end too."""
        if self._count + subnets > _CLUSTERS_PER_SLOT:
            raise RuntimeError(f"a test session may use at most {_CLUSTERS_PER_SLOT} sandbox subnets")
        # Fixed names, not random ones: the next session in this slot removes what a killed one left, on these subnets too.
        for count in range(self._count + 1, self._count + subnets + 1):
            prefix = f"pt{self.slot:02d}{count:02d}"
            Sandbox.down_prefix(prefix)
        self._count += subnets
        self._reserved.append(prefix)
        return prefix, _FIRST_INDEX + self.slot * _CLUSTERS_PER_SLOT + self._count - subnets

    def __call__(self, n: int, *, quirks: Mapping[int, HostQuirks] | None = None, rails: int = 0) -> Sandbox:
        """A running sandbox of n hosts (with rails, each host has that many rails besides its interface); quirks are
        keyed by host number, 1 being the master."""
        prefix, index = self.reserve(subnet_count(rails))
        return Sandbox.up(n, prefix=prefix, index=index, quirks=quirks, rails=rails)

    def close(self) -> None:
        """Tear down every sandbox this factory made or reserved."""
        try:
            for prefix in reversed(self._reserved):
                Sandbox.down_prefix(prefix)
            self._reserved.clear()
        finally:
            self._lock.close()


@pytest.fixture(scope="session")
def sandbox_factory() -> Iterator[SandboxFactory]:
    """Builds namespace clusters; skips the test (fails it when PREFLIGHT_REQUIRE_SANDBOX=1) on a machine that cannot."""
    try:
        check_requirements()
    except EnvironmentProblem as e:
        skip_or_fail(str(e))
    factory = SandboxFactory()
    try:
        yield factory
    finally:
        factory.close()
