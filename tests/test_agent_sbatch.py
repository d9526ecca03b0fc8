"""playbooks/slurm/agent-then-launch.sbatch run as Slurm runs a batch script, on 3 namespace hosts: the agents check the
allocation as the job's first step, and only a pass trains, with the launch emit-launch wrote from the agents' report.

Slurm here runs one node (tests/test_slurm.py), so torchrun stands in for srun (tests/data/srun_by_torchrun.py: the
script's SRUN): each step's command runs once on every host with the job's environment and SLURMD_NODENAME, the agents'
step as torchrun's one worker per host in one launch that meets where the script says (MASTER_ADDR:MASTER_PORT), the
training step as plain tasks. The script itself runs unchanged, here as the batch node, with the SLURM_* variables
sbatch gives it; scontrol expands the node list for real. The agents run the default playbook with a small sweep
(test_collective's FAST; the fault case stops after the mesh test): what is proven here is the gating and the launch,
not the sweep's figures (tests/test_agent_check.py compares the agents' verdicts with check's). The script's deadline
and its srun exit codes are proven under real Slurm, on one node (tests/test_slurm.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import preflight_exe, skip_or_fail
from test_blame import interface_mtu
from test_cluster import COMMAND_S, CONNECT_S, Cluster
from test_collective import FAST
from test_emit_launch import torchrun_of

pytestmark = pytest.mark.sandbox

ROOT = Path(__file__).resolve().parent.parent
SBATCH = ROOT / "playbooks" / "slurm" / "agent-then-launch.sbatch"
SRUN_BY_TORCHRUN = Path(__file__).parent / "data" / "srun_by_torchrun.py"
DDP_SCRIPT = Path(__file__).parent / "data" / "ddp_train.py"
HOSTS = 3
JOB_DEADLINE_S = 330  # two steps within their 150 s each (srun_by_torchrun.py), and emit-launch
# The agents' store on the first node: 20000 + job id % 10000, the script's default, away from the other tests' ports.
JOB_IDS = {"healthy": 7641, "mtu": 7642}


@pytest.fixture(scope="module")
def cluster(sandbox_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    if subprocess.run(["sh", "-c", "command -v scontrol"], capture_output=True, check=False).returncode != 0:
        skip_or_fail("the job script expands the node list with scontrol (Debian package slurm-wlm)")
    return Cluster(sandbox_factory(HOSTS), tmp_path_factory.mktemp("agentjob"), "agentjob")


def run_job(cluster: Cluster, job_id: int, *overrides: str, **settings: str) -> subprocess.CompletedProcess[str]:
    """The job script, with what sbatch gives it and torchrun as its srun, training ddp_train.py on a pass; overrides
    after the agents' own."""
    folder = cluster.folder
    hosts = [{"name": h.name, "address": h.address, "ssh": cluster.sandbox.ssh_argv(h.name)} for h in cluster.sandbox.hosts]
    (folder / "hosts.json").write_text(json.dumps(hosts))
    # scontrol reads a slurm.conf before it expands a host list, though it asks no controller for it.
    (folder / "slurm.conf").write_text("ClusterName=agentjob\nSlurmctldHost=localhost\n")
    srun = folder / "srun"
    srun.write_text(f'#!/bin/sh\nexec {sys.executable} {SRUN_BY_TORCHRUN} "$@"\n')
    srun.chmod(0o755)
    agent_args = ["--config-dir", str(folder / "conf"), f"cluster={cluster.name}", f"ssh.connect_timeout_s={CONNECT_S}",
                  f"ssh.command_timeout_s={COMMAND_S}", *FAST, *overrides]
    # What the script sets for the agents' step alone; a stray one here would reach the training step too.
    clean = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    env = {**clean, "SLURM_CONF": str(folder / "slurm.conf"), "SLURM_JOB_ID": str(job_id),
           "SLURM_JOB_NUM_NODES": str(HOSTS), "SLURM_JOB_NODELIST": f"h[1-{HOSTS}]",
           "SRUN": str(srun), "SRUN_BY_TORCHRUN_HOSTS": str(folder / "hosts.json"), "SRUN_BY_TORCHRUN_TORCHRUN": torchrun_of(cluster),
           "PREFLIGHT": preflight_exe(), "TORCHRUN": torchrun_of(cluster), "PREFLIGHT_AGENT_ARGS": " ".join(agent_args),
           # This repository's preflight on every host (srun passes the job's environment on).
           "PYTHONPATH": str(ROOT), **settings}
    job = subprocess.run(["bash", str(SBATCH), str(DDP_SCRIPT)], cwd=folder, env=env, capture_output=True, text=True,
                         timeout=JOB_DEADLINE_S, check=False)
    print(job.stdout[-3000:], job.stderr[-3000:], sep="\n")
    return job


def state_of(cluster: Cluster, job_id: int) -> Path:
    return cluster.folder / ".preflight" / f"job-{job_id}"


def ranks_trained(output: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.splitlines() if line.startswith('{"rank"')]


def test_a_healthy_allocation_is_checked_by_its_agents_then_trains_with_the_emitted_launch(cluster: Cluster) -> None:
    job = run_job(cluster, JOB_IDS["healthy"])
    assert job.returncode == 0, job.stderr[-3000:]
    # The agents met on the allocation's first node, at the port the job id gives.
    assert f"== preflight agent: {HOSTS} node(s), meeting at h1:{20000 + JOB_IDS['healthy']}\n" in job.stdout
    state = state_of(cluster, JOB_IDS["healthy"])
    report = json.loads((state / "report.json").read_text())
    assert report["exit_code"] == 0 and report["playbook"] == "full", [f for f in report["findings"] if f["status"] != "pass"]
    assert report["collective"]["hosts"] == ["h1", "h2", "h3"] and report["collective"]["verify"]["ranks"] == HOSTS
    env_files = {path.stem: path.read_text() for path in (state / "launch").glob("*.env")}
    assert sorted(env_files) == ["h1", "h2", "h3"] and all("PREFLIGHT_FORCED" not in text for text in env_files.values())
    master_addr = next(line.split("=", 1)[1] for line in env_files["h1"].splitlines() if line.startswith("MASTER_ADDR="))

    # Each node's torchrun took its own env file: every host one rank, on its own interface, one DDP run.
    ranks = ranks_trained(job.stdout)
    assert sorted(r["rank"] for r in ranks) == list(range(HOSTS)), job.stdout[-2000:]
    assert sorted(r["host"] for r in ranks) == ["h1", "h2", "h3"]
    assert all(r["gloo_ifname"] == cluster.sandbox.host(r["host"]).ifname and r["world_size"] == HOSTS for r in ranks)
    assert {r["master_addr"] for r in ranks} == {master_addr.strip("'\"")}
    assert len({r["params"] for r in ranks}) == 1 and ranks[0]["params"] != ranks[0]["initial"] and ranks[0]["steps"] > 0
    assert sorted(i for r in ranks for i in r["indices"]) == list(range(240)), "DistributedSampler did not split the data"
    cluster.assert_nothing_left()


def test_a_host_that_fails_its_check_stops_the_job_before_training(cluster: Cluster) -> None:
    """h2's interface at MTU 1400 on a bridge of 1500: the agents' mesh test fails it (PF611), and the job ends with
    preflight's exit code for a failed check without emitting a launch or starting torchrun. The playbook stops after
    the mesh test (playbook=connectivity), which is where this fault is found: the collective on the other two hosts
    would cost a third of the test and prove nothing about the gating."""
    with interface_mtu(cluster, "h2", 1400):
        job = run_job(cluster, JOB_IDS["mtu"], "playbook=connectivity")
    assert job.returncode == 1, job.stderr[-3000:]
    state = state_of(cluster, JOB_IDS["mtu"])
    assert f"preflight: a check failed on this allocation (report above, {state}/report.json): no training" in job.stderr
    report = json.loads((state / "report.json").read_text())
    failed = {(f["code"], f["host"]) for f in report["findings"] if f["status"] == "fail"}
    assert ("PF611", "h2") in failed and {h["name"]: h["status"] for h in report["hosts"]}["h2"] == "fail", failed
    assert "== emit-launch" not in job.stdout and "== train" not in job.stdout
    assert not (state / "launch").exists() and not ranks_trained(job.stdout)
    cluster.assert_nothing_left()
