"""check -> emit-launch -> torchrun on the namespace cluster: the emitted launch trains a real DDP model.

Every host runs torchrun over SSH with nothing but what emit-launch wrote (the env file sourced, or the torchrun
line, or the Slurm node script), and the ranks' parameters must agree afterwards.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from test_cluster import Cluster, preflight
from test_collective import FAST

from preflight.resources import load_schema
from preflight.sandbox import HostQuirks

pytestmark = pytest.mark.sandbox

DDP_SCRIPT = Path(__file__).parent / "data" / "ddp_train.py"
TRAIN_DEADLINE_S = 150


@pytest.fixture(scope="module")
def cluster(sandbox_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    # h2's interface is ens5, the others' eth0: the launch must carry per-host interface names.
    sandbox = sandbox_factory(3, quirks={2: HostQuirks(ifname="ens5")})
    return Cluster(sandbox, tmp_path_factory.mktemp("emit3"), "emit3")


# The module's passing check lets the check pick the master port: every test that emits from it proves the picked port is
# the one emitted and trained on, in the one launch a check of this cluster costs (a port picked by a check of its own was
# a second full check: 17 s of CPU on this 2-core VM). The configured port's launch is test_failed_host_is_refused_then_left_out's
# (29500, trained on by h1 and h2).
PICKED = "network.master_port=0"


@pytest.fixture(scope="module")
def checked(cluster: Cluster) -> dict[str, Any]:
    report, _elapsed, _ = cluster.check(*FAST, PICKED, playbook="full")
    assert report["status"] == "pass", report["findings"][:3]
    return report


def torchrun_of(cluster: Cluster) -> str:
    return str(Path(cluster.sandbox.master.python).parent / "torchrun")


def emit(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return preflight("emit-launch", "--config-dir", str(cluster.folder / "conf"), f"cluster={cluster.name}",
                     f"state_dir={cluster.folder / 'state'}", *args, cwd=cluster.folder)


def run_on_hosts(cluster: Cluster, commands: Mapping[str, str]) -> dict[str, subprocess.CompletedProcess[str]]:
    """Run each host's shell command over SSH, all at once, within one deadline; kill what outlives it."""
    started = {host: subprocess.Popen(cluster.sandbox.ssh_argv(host, command), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True) for host, command in commands.items()}
    deadline = time.monotonic() + TRAIN_DEADLINE_S
    done = {}
    try:
        for host, process in started.items():
            stdout, stderr = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
            done[host] = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    except subprocess.TimeoutExpired:
        pytest.fail(f"training did not finish within {TRAIN_DEADLINE_S} s on {sorted(set(commands) - set(done))}")
    finally:
        for process in started.values():
            if process.poll() is None:
                process.kill()
                process.communicate()
    return done


def assert_trained_together(cluster: Cluster, runs: Mapping[str, subprocess.CompletedProcess[str]], document: dict[str, Any],
                            interface: Callable[[dict[str, Any]], str] | None = None) -> None:
    """Every rank ran, the sampler split the data, and the parameters agree after training; each rank's gloo on its
    host's interface, or on interface(its line) (a rank bound to its rail)."""
    ranks = []
    for host, run in runs.items():
        assert run.returncode == 0, f"{host}: {run.stderr[-3000:]}"
        lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith('{"rank"')]
        assert lines, f"{host} printed no rank: {run.stdout[-1000:]} {run.stderr[-2000:]}"
        for line in lines:
            assert line["host"] == host
            assert line["gloo_ifname"] == (interface(line) if interface else cluster.sandbox.host(host).ifname)  # each host its own
        ranks += lines
    world = document["world_size"]
    assert sorted(r["rank"] for r in ranks) == list(range(world))
    assert {r["world_size"] for r in ranks} == {world}
    # torchrun hands its workers the master's address and a store port of its own choosing (not the rendezvous port).
    assert {r["master_addr"] for r in ranks} == {document["master"]["addr"]} and len({r["master_port"] for r in ranks}) == 1
    assert len({r["initial"] for r in ranks}) == 1, "DDP did not give every rank rank 0's weights"
    assert len({r["params"] for r in ranks}) == 1, "the ranks' parameters differ after training"
    assert ranks[0]["params"] != ranks[0]["initial"] and ranks[0]["steps"] > 0
    shards = [set(r["indices"]) for r in ranks]
    assert sum(len(s) for s in shards) == 240 and set().union(*shards) == set(range(240)), "DistributedSampler did not split the data"
    cluster.assert_nothing_left()


def test_json_validates_and_the_env_files_train_with_torchrun(cluster: Cluster, checked: dict[str, Any], tmp_path: Path) -> None:
    result = emit(cluster, PICKED, "--format", "json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    jsonschema.validate(document, load_schema("launch"))
    sandbox = cluster.sandbox
    assert document["master"] == {"host": "h1", "addr": sandbox.host("h1").address, "port": checked["collective"]["port"]}
    assert document["forced"] is False and document["nnodes"] == 3 and document["world_size"] == 3
    by_name = {h["name"]: h for h in document["hosts"]}
    assert [h["is_host"] for h in document["hosts"]] == [True, False, False]
    for name, host in by_name.items():
        assert host["local_addr"] == sandbox.host(name).address
        assert host["env"]["GLOO_SOCKET_IFNAME"] == sandbox.host(name).ifname
        assert host["env"]["PET_LOCAL_ADDR"] == sandbox.host(name).address
    assert by_name["h2"]["env"]["GLOO_SOCKET_IFNAME"] == "ens5"

    out = tmp_path / "launch"
    result = emit(cluster, PICKED, "--out", str(out))  # env is the default format
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["h1.env", "h2.env", "h3.env"]  # and no temporary file left
    commands = {name: f"set -a; . {shlex.quote(str(out / f'{name}.env'))}; set +a; exec {torchrun_of(cluster)} {DDP_SCRIPT}"
                for name in by_name}
    assert_trained_together(cluster, run_on_hosts(cluster, commands), document)


def test_torchrun_lines_and_the_slurm_node_script_train_as_written(cluster: Cluster, checked: dict[str, Any]) -> None:
    settings = [PICKED, f"launch.torchrun={torchrun_of(cluster)}", f"launch.script={DDP_SCRIPT}"]
    document = json.loads(emit(cluster, "--format", "json", *settings).stdout)

    script = emit(cluster, "--format", "torchrun", *settings)
    assert script.returncode == 0, script.stderr
    lines = script.stdout.splitlines()
    commands = {}
    for host in document["hosts"]:
        heading = lines.index(f"# {host['name']} (node {host['node_rank']})")
        commands[host["name"]] = lines[heading + 1]
    assert_trained_together(cluster, run_on_hosts(cluster, commands), document)

    sbatch = emit(cluster, "--format", "slurm", *settings)
    assert sbatch.returncode == 0, sbatch.stderr
    assert "#SBATCH --nodes=3\n#SBATCH --ntasks-per-node=1\n#SBATCH --nodelist=h1,h2,h3\n" in sbatch.stdout
    srun = shlex.split(sbatch.stdout[sbatch.stdout.index("exec srun"):])
    assert srun[:2] == ["exec", "srun"] and srun[-3:-1] == ["bash", "-c"]
    node_script = srun[-1]
    # What srun runs on each node, with the variable slurmd gives it.
    commands = {name: f"SLURMD_NODENAME={name} bash -c {shlex.quote(node_script)}" for name in commands}
    assert_trained_together(cluster, run_on_hosts(cluster, commands), document)


def test_refuses_another_config_and_a_stale_report(cluster: Cluster, checked: dict[str, Any]) -> None:
    other = emit(cluster, "network.master_port=29600")
    assert other.returncode == 1 and "another config (its network differs)" in other.stderr, other.stderr
    stale = emit(cluster, PICKED, "launch.max_report_age_h=0.00001")
    assert stale.returncode == 1 and "h old (launch.max_report_age_h=1e-05)" in stale.stderr, stale.stderr
    forced = emit(cluster, "--format", "json", "--force", "network.master_port=29600")
    assert forced.returncode == 0, forced.stderr
    document = json.loads(forced.stdout)
    assert document["forced"] is True and "another config" in document["forced_over"][0]
    assert all(h["env"]["PREFLIGHT_FORCED"] == "1" for h in document["hosts"])
    assert "forced over" in forced.stderr


def test_a_port_picked_by_the_check_is_the_one_emitted(cluster: Cluster, checked: dict[str, Any]) -> None:
    port = checked["collective"]["port"]
    assert 1024 <= port <= 64000, checked["collective"]
    document = json.loads(emit(cluster, PICKED, "--format", "json").stdout)
    assert document["master"]["port"] == port and all(h["env"]["MASTER_PORT"] == str(port) for h in document["hosts"])


def test_failed_host_is_refused_then_left_out(cluster: Cluster, checked: dict[str, Any], tmp_path: Path) -> None:
    """A missing interface on h3: the check names it, splits it out, and runs h1 + h2 together again; emit-launch
    refuses the failed report, and with launch.exclude_failed launches that confirmed pair. The module's last test: its
    check's report replaces the one the tests above emit from."""
    broken = "cluster.hosts.2.interface=eth9"
    report, _elapsed, _ = cluster.check(*FAST, broken, playbook="full", timeout=240)
    assert report["status"] == "fail"
    assert next(f for f in report["findings"] if f["code"] == "PF303" and f["host"] == "h3")["status"] == "fail"
    collective = report["collective"]
    assert collective["status"] in ("fail", "hang") and collective["phase"] == "init" and "h3" in collective["message"]
    assert collective["isolation"]["culprits"] == ["h3"]
    assert next(f for f in report["findings"] if f["code"] == "PF605" and f["host"] == "h3")["status"] == "fail"
    confirmed = collective["isolation"]["confirmed"]
    assert (confirmed["hosts"], confirmed["port"], confirmed["status"]) == (["h1", "h2"], 29500, "pass")
    cluster.assert_nothing_left()
    refused = emit(cluster, broken)
    assert refused.returncode == 1, refused.stderr
    assert "h3: PF303" in refused.stderr and "launch.exclude_failed=true leaves them out" in refused.stderr

    document = json.loads(emit(cluster, broken, "launch.exclude_failed=true", "--format", "json").stdout)
    assert [h["name"] for h in document["hosts"]] == ["h1", "h2"] and document["nnodes"] == 2
    assert document["master"]["port"] == 29500  # the configured port, where the tests above train on a picked one
    assert document["excluded"][0]["host"] == "h3" and "PF303" in document["excluded"][0]["reason"]
    out = tmp_path / "launch"
    result = emit(cluster, broken, "launch.exclude_failed=true", "--out", str(out))
    assert result.returncode == 0 and "left out h3" in result.stderr, result.stderr
    env_text = (out / "h1.env").read_text()
    assert "# left out: h3: PF303" in env_text and "PET_NNODES=2" in env_text
    commands = {name: f"set -a; . {shlex.quote(str(out / f'{name}.env'))}; set +a; exec {torchrun_of(cluster)} {DDP_SCRIPT}"
                for name in ("h1", "h2")}
    assert_trained_together(cluster, run_on_hosts(cluster, commands), document)
