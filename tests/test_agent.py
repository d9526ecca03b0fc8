"""Agent mode on the namespace cluster: torchrun starts `preflight agent` on every host, and rank 0's
report is the report `preflight check` makes over SSH of the same cluster."""

from __future__ import annotations

import glob
import json
import os
import shlex
import tempfile
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from conftest import preflight, preflight_exe
from test_cluster import COMMAND_S, CONNECT_S, Cluster
from test_emit_launch import run_on_hosts, torchrun_of

from preflight.agent import remove_empty_folders, torchrun_log_folder
from preflight.resources import load_schema
from preflight.sandbox import HostQuirks

ROOT = Path(__file__).resolve().parent.parent
AGENT_PORT = 29640
# What differs between two probes of the same host by nature: when each ran, how long it took, the temporary folder's
# free space (this machine's /tmp, which every test writes to), and the local ports TCP sockets hold (the agents run
# under torchrun, whose store connections hold some; SSH mode's probe has none beside it).
VOLATILE_FACTS = (("probe", "started_unix_s"), ("probe", "elapsed_s"), ("resources", "tmp", "free_bytes"),
                  ("resources", "tmp", "free_inodes"), ("resources", "local_ports", "in_use"))
# The clock-skew finding quotes the measured offsets, the temporary folder's the free space and the local ports' the
# free ports: no two runs share them.
VOLATILE_MESSAGES = {"PF505", "PF209", "PF310"}


@pytest.fixture(scope="module")
def cluster(sandbox_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    # h2 has Docker's /dev/shm (a failure both modes must agree on) and h3's interface is ens5 (per-host settings).
    sandbox = sandbox_factory(3, quirks={2: HostQuirks(shm_bytes=64 << 20), 3: HostQuirks(ifname="ens5")})
    return Cluster(sandbox, tmp_path_factory.mktemp("agent3"), "agent3")


def agent_commands(cluster: Cluster, *overrides: str, state: str, playbook: str | None = "facts", nnodes: int = 3) -> dict[str, str]:
    """Each host's command: torchrun starting `preflight agent` with the overrides Cluster.check gives (playbook None: the
    default one, as `check` runs with none given)."""
    master = cluster.sandbox.master
    commands = {}
    for host in cluster.sandbox.hosts:
        argv = [torchrun_of(cluster), f"--nnodes={nnodes}", "--nproc-per-node=1", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={master.address}:{AGENT_PORT}", f"--rdzv-id={cluster.name}", f"--local-addr={host.address}",
                f"--rdzv-conf=is_host={int(host is master)},join_timeout=60", "--max-restarts=0",
                "--no-python", preflight_exe(), "agent", "--json", "--config-dir", str(cluster.folder / "conf"),
                # The overrides Cluster.check gives, so that both modes check the same config.
                f"cluster={cluster.name}", *([f"playbook={playbook}"] if playbook else []), f"ssh.connect_timeout_s={CONNECT_S}",
                f"ssh.command_timeout_s={COMMAND_S}",
                f"state_dir={cluster.folder / state}", *overrides]
        # This repository's preflight on every host, as the controller's `check` runs it (an SSH session starts with a
        # fresh environment).
        commands[host.name] = f"cd {shlex.quote(str(cluster.folder))} && PYTHONPATH={shlex.quote(str(ROOT))} {shlex.join(argv)}"
    return commands


def without_volatile(facts: dict[str, Any]) -> dict[str, Any]:
    copy = json.loads(json.dumps(facts))
    for *parents, key in VOLATILE_FACTS:
        holder = copy
        for name in parents:
            holder = holder.get(name) or {}
        holder.pop(key, None)
    return copy


def comparable(report: dict[str, Any]) -> dict[str, Any]:
    return {
        "status": report["status"], "exit_code": report["exit_code"], "cluster": report["cluster"], "playbook": report["playbook"],
        "spec_digest": report["spec_digest"], "config_digests": report["config_digests"],
        "hosts": [{**h, "facts": without_volatile(h["facts"]) if h["facts"] else None} for h in report["hosts"]],
        "findings": [{**f, "message": None} if f["code"] in VOLATILE_MESSAGES else f for f in report["findings"]],
    }


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two JSON documents differ, as readable paths (pytest's diff of big reports hides them)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


@pytest.mark.sandbox
def test_agents_under_torchrun_write_the_report_ssh_mode_writes(cluster: Cluster) -> None:
    over_ssh, _elapsed, _ = cluster.check()
    assert over_ssh["status"] == "fail"

    # The same state_dir as the check, since it is part of the config both reports were made for.
    torchruns_folders = f"{tempfile.gettempdir()}/torchelastic_*/{cluster.name}_*"
    before = set(glob.glob(torchruns_folders))
    runs = run_on_hosts(cluster, agent_commands(cluster, state="state"))
    printed = {host: run for host, run in runs.items() if run.stdout.strip()}
    assert len(printed) == 1, {h: (r.returncode, r.stdout[-500:], r.stderr[-1500:]) for h, r in runs.items()}
    (lead, run), = printed.items()
    by_agents = json.loads(run.stdout)
    jsonschema.validate(by_agents, load_schema("report"))
    # Rank 0 exits with the report's code (torchrun passes a failure on as 1); the others' part was done.
    assert run.returncode == 1, run.stderr[-2000:]
    assert all(r.returncode == 0 for h, r in runs.items() if h != lead), {h: r.stderr[-1500:] for h, r in runs.items()}
    saved = json.loads((cluster.folder / "state" / "report.json").read_text())
    assert saved == by_agents

    differ = differences(comparable(by_agents), comparable(over_ssh))
    assert not differ, "\n".join(differ)
    failed = {(f["code"], f["host"]) for f in by_agents["findings"] if f["status"] == "fail"}
    assert failed == {("PF203", "h2")}
    ens5 = next(f for f in by_agents["findings"] if f["code"] == "PF303" and f["host"] == "h3")
    assert ens5["message"].startswith("interface ens5 is up")
    # The store's clock exchange bounded every host's offset, as the SSH round trip does.
    skew = next(f for f in by_agents["findings"] if f["code"] == "PF505")
    assert skew["status"] == "pass", skew
    cluster.assert_nothing_left()
    # torchrun, given no --log-dir, made a log folder in /tmp for each host's agent; each agent took its own away.
    assert set(glob.glob(torchruns_folders)) <= before


@pytest.mark.sandbox
def test_an_agent_missing_from_the_launch_is_could_not_check(cluster: Cluster, tmp_path: Path) -> None:
    """Two agents for a three-host cluster: the third host is `unknown`, never a silent pass."""
    commands = agent_commands(cluster, "playbook.deadline_s=5", state="agent-two")
    two = {name: command.replace("--nnodes=3", "--nnodes=2") for name, command in commands.items() if name != "h3"}
    runs = run_on_hosts(cluster, two)
    (run,) = [r for r in runs.values() if r.stdout.strip()]
    report = json.loads(run.stdout)
    h3 = next(h for h in report["hosts"] if h["name"] == "h3")
    assert h3["status"] == "unknown" and h3["facts"] is None
    assert h3["reason"] == "not checked: no agent reported from this host within 35 s (2 of 2 agents did)"
    assert {h["name"]: h["status"] for h in report["hosts"]}["h2"] == "fail"
    cluster.assert_nothing_left()


@pytest.mark.parametrize(("env", "message"), [
    ({}, "preflight agent runs under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or srun"),
    ({"RANK": "3", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
     "preflight agent: rank '3', world size '2' and port '29500' are not a valid launch"),
])
def test_agent_outside_a_launch_is_bad_input(tmp_path: Path, env: dict[str, str], message: str) -> None:
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID")}
    result = preflight("agent", env={**clean, **env}, cwd=tmp_path, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"preflight: error: {message}")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_the_log_folder_torchrun_made_itself_is_found_and_one_it_was_given_is_not(tmp_path: Path) -> None:
    made = f"{tmp_path}/torchelastic_k2esuv4a/gate-0042_4_0z7w0r/attempt_0/0/error.json"  # mkdtemp's suffix may hold _
    assert torchrun_log_folder({"TORCHELASTIC_ERROR_FILE": made, "TORCHELASTIC_RUN_ID": "gate-0042"}, str(tmp_path)) \
        == tmp_path / "torchelastic_k2esuv4a"
    for error_file, run_id in ((made, "other-job"), (made, ""),
                               # --log-dir named by the user: theirs, wherever it is
                               (f"{tmp_path}/job-logs/gate-0042_x1/attempt_0/0/error.json", "gate-0042"),
                               ("/scratch/torchelastic_k2esuv4a/gate-0042_x1/attempt_0/0/error.json", "gate-0042"),
                               ("", "gate-0042")):
        assert torchrun_log_folder({"TORCHELASTIC_ERROR_FILE": error_file, "TORCHELASTIC_RUN_ID": run_id},
                                   str(tmp_path)) is None, (error_file, run_id)
    assert torchrun_log_folder({}, str(tmp_path)) is None  # srun: no torchrun


def test_only_empty_folders_are_removed(tmp_path: Path) -> None:
    root = tmp_path / "torchelastic_k2esuv4a"
    for rank in ("0", "1"):
        (root / "gate_x1" / "attempt_0" / rank).mkdir(parents=True)
    (root / "gate_x1" / "attempt_0" / "1" / "stderr.log").write_text("kept by --tee\n")
    remove_empty_folders(root)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "torchelastic_k2esuv4a", "torchelastic_k2esuv4a/gate_x1", "torchelastic_k2esuv4a/gate_x1/attempt_0",
        "torchelastic_k2esuv4a/gate_x1/attempt_0/1", "torchelastic_k2esuv4a/gate_x1/attempt_0/1/stderr.log"]
    (root / "gate_x1" / "attempt_0" / "1" / "stderr.log").unlink()
    remove_empty_folders(root)
    assert list(tmp_path.iterdir()) == []
