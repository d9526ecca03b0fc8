"""The host's supervisor ends only processes that are still its ranks: a rank's pid, once the rank has exited and been
reaped, may belong to any process of the host. The reuse is made to happen, in a pid namespace of the test's own where
the kernel hands out the next pid as /proc/sys/kernel/ns_last_pid says (as CRIU restores pids)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import skip_or_fail

ROOT = Path(__file__).resolve().parent.parent

# Inside the namespace: a rank seen by the supervisor exits and is reaped, a stranger gets its pid, and the supervisor
# then ends torchrun (already gone here) and the ranks it saw.
_REUSE = """
import json, subprocess, sys
from preflight import bundle
worker = bundle.load(bundle.WORKER)
config = worker.WorkerConfig.from_json(sys.argv[1])
supervisor = worker.Supervisor(config, 1, ["true"])
rank = subprocess.Popen(["sleep", "60"])
supervisor._track({"event": "phase", "phase": "verify", "rank": 0, "local_rank": 0, "host": "h1", "pid": rank.pid})
rank.kill()
rank.wait()
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(rank.pid - 1))
stranger = subprocess.Popen(["sleep", "60"])
torchrun = subprocess.Popen(["true"], start_new_session=True)
torchrun.wait()
supervisor._kill(torchrun)
try:
    stranger.wait(timeout=1)  # a SIGKILL ends a sleep at once
    stranger_alive = False
except subprocess.TimeoutExpired:
    stranger_alive = True
stranger.kill()
print(json.dumps({"reused": stranger.pid == rank.pid, "stranger_alive": stranger_alive}))
"""
# The same supervisor still ends a rank that runs: the check of who holds the pid lets its own rank through.
_LIVE = """
import json, subprocess, sys
from preflight import bundle
worker = bundle.load(bundle.WORKER)
supervisor = worker.Supervisor(worker.WorkerConfig.from_json(sys.argv[1]), 1, ["true"])
rank = subprocess.Popen(["sleep", "60"], start_new_session=True)
supervisor._track({"event": "phase", "phase": "verify", "rank": 0, "local_rank": 0, "host": "h1", "pid": rank.pid})
torchrun = subprocess.Popen(["true"], start_new_session=True)
torchrun.wait()
supervisor._kill(torchrun)
print(json.dumps({"ended": rank.wait(timeout=10) == -9}))
"""
CONFIG = json.dumps({"run_id": "test", "backend": "gloo", "seed": 1, "host": "h1",
                     "deadlines_s": {"init": 30, "identity": 20, "verify": 20, "compute": 20, "neighbours": 20, "sweep": 30,
                                     "finish": 20}, "verify_bytes": 4096,
                     "sweep": {"sizes": [], "ops": [], "warmup": 0, "iters": 1, "time_per_size_s": None}, "compute_s": 0.0,
                     "neighbour_s": 0.0, "neighbour_bytes": 1 << 20, "suspect_fraction": 0.7, "repeats": 0, "starved_repeats": 0,
                     "starved_fraction": 0.5, "neighbour_ring": True, "pair_rounds": [], "rails": 0})


def _in_a_pid_namespace(script: str) -> dict[str, bool]:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        skip_or_fail("a pid namespace of its own needs root and unshare(1)")
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", script, CONFIG],
                          capture_output=True, text=True, timeout=60, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    answer: dict[str, bool] = json.loads(done.stdout)
    return answer


def test_a_pid_the_rank_left_to_another_process_is_not_killed() -> None:
    assert _in_a_pid_namespace(_REUSE) == {"reused": True, "stranger_alive": True}


@pytest.mark.parametrize("hold", ["pidfd", "start time"])
def test_a_rank_still_running_is_killed(hold: str) -> None:
    # Where the host's kernel or python has no pidfd, the pid's start time tells its process.
    without_pidfd = "import os\ndel os.pidfd_open\n" if hold == "start time" else ""
    assert _in_a_pid_namespace(without_pidfd + _LIVE) == {"ended": True}
