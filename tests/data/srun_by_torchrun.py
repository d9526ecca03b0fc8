"""srun, played by torchrun on namespace hosts, for a job script's steps where Slurm cannot run several nodes.

    srun_by_torchrun.py --nodes=N --ntasks=N --ntasks-per-node=1 --kill-on-bad-exit=0|1 COMMAND [ARGS...]

Runs COMMAND once on every host of the allocation (the JSON file SRUN_BY_TORCHRUN_HOSTS names: each host's name, address
and ssh command line, the allocation's first node first), with what srun gives a task and a job script relies on: the
job's environment (srun's default --export=ALL; an SSH session starts with none) and SLURMD_NODENAME. Its exit code is
srun's, the highest exit code of the tasks, and the tasks' output is this process's, as srun's is.

A step that names a store (MASTER_ADDR and MASTER_PORT in its environment: the agents') is where torchrun stands in:
every task is torchrun's one worker on its host, all in one launch that meets at MASTER_ADDR:MASTER_PORT, hosted by the
host of that name or address (so a job script that names the wrong first node does not meet at all). Its ranks are
torchrun's RANK/WORLD_SIZE, not srun's SLURM_PROCID/SLURM_NTASKS, and the store torchrun's, not one task 0 serves
(that path runs under real Slurm, on one node, in tests/test_slurm.py). Any other step's tasks are plain processes with
srun's SLURM_PROCID, SLURM_NTASKS and SLURM_NODEID, as srun starts them.

Not played: --kill-on-bad-exit=1 (srun ends the other tasks when one fails; here they end on their own).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HOSTS_ENV = "SRUN_BY_TORCHRUN_HOSTS"
TORCHRUN_ENV = "SRUN_BY_TORCHRUN_TORCHRUN"  # the hosts' torchrun
DEADLINE_S = 150  # a step that outlives it is killed: the job script's own deadlines are what the test proves
JOIN_TIMEOUT_S = 60
# What an SSH session has of its own, or the shell that ran this: not the job's.
NOT_FORWARDED = re.compile(r"SSH_\w+|PWD|OLDPWD|SHLVL|_|HOSTNAME|TERM")
# The task's exit code, as the task's own shell saw it: torchrun reports any worker failure as 1.
RECORD_EXIT = 'rc_file="$1"; shift; "$@"; rc=$?; echo "$rc" > "$rc_file"; exit "$rc"'


def usage(why: str) -> int:
    print(f"srun_by_torchrun: {why}", file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    options: dict[str, str] = {}
    while argv and argv[0].startswith("--"):
        key, _, value = argv.pop(0)[2:].partition("=")
        options[key] = value
    hosts = json.loads(Path(os.environ[HOSTS_ENV]).read_text())
    if set(options) - {"nodes", "ntasks", "ntasks-per-node", "kill-on-bad-exit"} or not argv:
        return usage(f"not an srun line this stand-in plays: {options} {argv}")
    if (options.get("nodes"), options.get("ntasks"), options.get("ntasks-per-node")) != (str(len(hosts)), str(len(hosts)), "1"):
        return usage(f"the allocation has {len(hosts)} node(s), one task each; asked for {options}")
    store = (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) if {"MASTER_ADDR", "MASTER_PORT"} <= set(os.environ) else None
    env = {k: v for k, v in os.environ.items() if not NOT_FORWARDED.fullmatch(k) and k not in (HOSTS_ENV, TORCHRUN_ENV)}
    run_id = f"srun-{secrets.token_hex(4)}"
    with tempfile.TemporaryDirectory(prefix="srun-by-torchrun-") as folder:
        Path(folder).chmod(0o755)
        started = []
        for index, host in enumerate(hosts):
            task = ["bash", "-c", RECORD_EXIT, "task", f"{folder}/{host['name']}.rc", *argv]
            task_env = {**env, "SLURMD_NODENAME": host["name"]}
            if store is None:
                task_env.update(SLURM_PROCID=str(index), SLURM_NTASKS=str(len(hosts)), SLURM_NODEID=str(index))
            else:
                master, port = store
                task = [os.environ[TORCHRUN_ENV], f"--nnodes={len(hosts)}", "--nproc-per-node=1", "--rdzv-backend=c10d",
                        f"--rdzv-endpoint={master}:{port}", f"--rdzv-id={run_id}", f"--local-addr={host['address']}",
                        f"--rdzv-conf=is_host={int(master in (host['name'], host['address']))},join_timeout={JOIN_TIMEOUT_S}",
                        "--max-restarts=0", "--no-python", *task]
            assignments = shlex.join(f"{k}={v}" for k, v in task_env.items())
            command = f"cd {shlex.quote(os.getcwd())} && exec env {assignments} {shlex.join(task)}"
            started.append((host["name"], subprocess.Popen([*host["ssh"], command], stdin=subprocess.DEVNULL)))
        deadline = time.monotonic() + DEADLINE_S
        codes = []
        try:
            for name, process in started:
                launcher_rc = process.wait(timeout=max(1.0, deadline - time.monotonic()))
                rc_file = Path(folder) / f"{name}.rc"
                # No code of the task's own: it never ran, or was killed with its launcher (torchrun, ssh), whose code says so.
                codes.append(int(rc_file.read_text()) if rc_file.exists() else launcher_rc or 1)
        except subprocess.TimeoutExpired:
            print(f"srun_by_torchrun: the step outlived {DEADLINE_S} s", file=sys.stderr)
            return 124
        finally:
            for _, process in started:
                if process.poll() is None:
                    process.kill()
                    process.wait()
    return max(codes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
