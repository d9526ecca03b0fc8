"""The scheduler examples in playbooks/, run for real on this machine.

Slurm: a one-node cluster (Debian's munged, slurmctld and slurmd, everything in a temporary folder) runs
playbooks/slurm/ as a site would: slurmd runs the HealthCheckProgram at start and every interval, the
prolog before each job, and sbatch runs the gate-then-launch script, whose srun trains under torchrun, and
the agent-then-launch script, whose first srun step is `preflight agent` (several nodes: tests/test_agent_sbatch.py).

Kubernetes cannot run here (no kubelet, no registry): the manifest's initContainer command, taken from the
file, runs in a private mount namespace whose /dev/shm is first a container's own 64 MiB, then the size of
the manifest's memory-backed emptyDir.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import skip_or_fail
from test_collective import FAST

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parent.parent
SLURM_PLAYBOOKS = REPO / "playbooks" / "slurm"
HEALTH_CHECK = SLURM_PLAYBOOKS / "preflight-healthcheck.sh"
PROLOG = SLURM_PLAYBOOKS / "preflight-prolog.sh"
SBATCH_SCRIPT = SLURM_PLAYBOOKS / "gate-then-launch.sbatch"
AGENT_SBATCH_SCRIPT = SLURM_PLAYBOOKS / "agent-then-launch.sbatch"
POD_MANIFEST = REPO / "playbooks" / "k8s" / "preflight-gate-pod.yml"
AGENT_JOB_MANIFEST = REPO / "playbooks" / "k8s" / "preflight-agent-indexed-job.yml"
DDP_SCRIPT = Path(__file__).parent / "data" / "ddp_train.py"
# The environment's own scripts, not a version manager's shims: slurmd runs the health check without PATH.
BIN = Path(sys.executable).parent
PREFLIGHT = BIN / "preflight"
TORCHRUN = BIN / "torchrun"

# More /dev/shm than any machine has: PF203 fails here for real, nothing else changes.
FAILING_GATE = "thresholds.dev_shm_min_bytes=1000000000000000"
HEALTH_CHECK_INTERVAL_S = 2
START_DEADLINE_S = 20
STATE_DEADLINE_S = 4 * HEALTH_CHECK_INTERVAL_S + 4
STOP_DEADLINE_S = 10
CALL_TIMEOUT_S = 10
JOB_DEADLINE_S = 120
AGENT_JOB_DEADLINE_S = 240
# A backstop for the daemons if pytest itself is killed; teardown stops them long before.
DAEMON_LIFETIME_S = 900
SLURM_TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo", "squeue", "scancel", "timeout")
ADMIN_REASON = "admin: reseat the riser card"


def require(condition: bool, why: str) -> None:
    if not condition:
        skip_or_fail(why)


def gate_line(*args: str) -> str:
    """What `preflight gate` prints on this machine with these arguments: the reason the scripts must pass on."""
    result = subprocess.run([str(PREFLIGHT), "gate", *args], capture_output=True, text=True, timeout=60, check=False)
    assert result.stdout.count("\n") == 1, result.stdout + result.stderr
    return result.stdout.strip()


def free_port() -> int:
    """A loopback port below the ephemeral range, so that no outgoing connection takes it before the daemon binds."""
    for _ in range(100):
        port = 17000 + secrets.randbelow(10000)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 17000-26999")


def processes_naming(text: str) -> list[str]:
    """Processes whose command line or environment contains text (this cluster's folder), as 'pid command'."""
    found = []
    needle = text.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone meanwhile, or a kernel thread
        if needle in cmdline or needle in environ:
            command = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
            found.append(f"{entry.name} {command}")
    return found


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    # slurmd may be reading a settings file at any moment: it sees the old one or the new one, never half.
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.chmod(mode)
    partial.replace(path)


@dataclass
class SlurmCluster:
    """A running one-node Slurm cluster in folder, and how the tests drive it."""

    folder: Path
    node: str
    env: dict[str, str]  # this process's environment with SLURM_CONF: what sbatch exports to a job
    health_check_settings: Path  # the HealthCheckProgram's defaults file (what /etc/default/preflight is on a site)
    prolog_settings: Path
    health_check_runs: Path  # a line per HealthCheckProgram run slurmd finished: its start (epoch seconds) and exit code
    health_checks_before_idle: int = 0  # the runs slurmd had finished when the node first came up idle

    @property
    def health_check_paused(self) -> Path:
        """While this file is there, slurmd's HealthCheckProgram runs skip the program (a run by hand is under way)."""
        return self.folder / "healthcheck.paused"

    def call(self, *argv: str, timeout: float = CALL_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False)

    def settings_text(self, gate_args: str, **extra: str) -> str:
        values = {"SLURM_CONF": self.env["SLURM_CONF"], "PREFLIGHT": str(PREFLIGHT), "PREFLIGHT_GATE_ARGS": gate_args, **extra}
        return "".join(f"{key}={shlex.quote(value)}\n" for key, value in values.items()) + "export SLURM_CONF\n"

    def set_health_check(self, gate_args: str = "", **extra: str) -> None:
        write_atomically(self.health_check_settings, self.settings_text(gate_args, **extra))

    def set_prolog(self, gate_args: str = "") -> None:
        write_atomically(self.prolog_settings, self.settings_text(gate_args))

    def node_state(self) -> tuple[str, str]:
        """(state, reason) as sinfo gives them: ('drained', 'Prolog error'), ('idle', 'none')."""
        result = self.call("sinfo", "--noheader", "--Node", f"--nodes={self.node}", "--format=%T %E")
        state, _, reason = result.stdout.strip().partition(" ")
        return state, reason

    def listed_reasons(self) -> list[str]:
        """`sinfo -R`, whole reasons (its default format cuts them at 20 characters)."""
        return self.call("sinfo", "--list-reasons", "--noheader", "--format=%E|%N").stdout.splitlines()

    def wait_for_node(self, what: str, wanted: Callable[[str, str], bool], deadline_s: float = STATE_DEADLINE_S) -> tuple[str, str]:
        deadline = time.monotonic() + deadline_s
        while True:
            state, reason = self.node_state()
            if wanted(state, reason):
                return state, reason
            if time.monotonic() > deadline:
                pytest.fail(f"node {self.node} not {what} within {deadline_s} s: {state!r} {reason!r}\n{self.log_tails()}")
            time.sleep(0.1)

    def finished_health_checks(self) -> int:
        return len(self.health_check_runs.read_text().splitlines()) if self.health_check_runs.exists() else 0

    def wait_for_a_health_check_from_now(self) -> None:
        """Until slurmd has finished a health check that started after this call."""
        now = time.time()
        limit_s = 2 * HEALTH_CHECK_INTERVAL_S + 4
        deadline = time.monotonic() + limit_s
        while not any(float(line.split()[0]) > now for line in self.health_check_runs.read_text().splitlines()):
            if time.monotonic() > deadline:
                pytest.fail(f"slurmd finished no health check started in the last {limit_s} s\n{self.log_tails()}")
            time.sleep(0.1)

    def health_check_env(self) -> dict[str, str]:
        """Where this cluster's HealthCheckProgram finds its settings and its lock (/etc/default/preflight and /run/lock on a site)."""
        return {"PREFLIGHT_DEFAULTS": str(self.health_check_settings), "PREFLIGHT_HEALTHCHECK_LOCK": str(self.folder / "healthcheck.lock")}

    def run_health_check(self) -> subprocess.CompletedProcess[str]:
        """The playbook's HealthCheckProgram run by hand, in the environment slurmd gives it: SLURMD_NODENAME alone."""
        env = {"SLURMD_NODENAME": self.node, **self.health_check_env()}
        # slurmd runs the same program every HealthCheckInterval (2 s), drained nodes too, under the same lock; on a
        # loaded machine its run can hold the lock past the program's 5 s wait, and this run would then (rightly) leave
        # the node alone. So slurmd's launcher skips its runs while this one is paused (CI once saw a run of slurmd's
        # start between the lock coming free and this run taking it), and this run starts when slurmd's last one is
        # done, within the program's own bound of 57 s.
        self.health_check_paused.touch()
        try:
            with open(self.folder / "healthcheck.lock", "a") as lock:
                deadline = time.monotonic() + 60.0
                while True:
                    try:
                        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        fcntl.flock(lock, fcntl.LOCK_UN)
                        break
                    except BlockingIOError:
                        if time.monotonic() > deadline:
                            break
                        time.sleep(0.1)
            return subprocess.run([str(HEALTH_CHECK)], env=env, capture_output=True, text=True, timeout=60, check=False)
        finally:
            self.health_check_paused.unlink(missing_ok=True)

    def sbatch(self, *args: str, env: Mapping[str, str] | None = None) -> str:
        result = subprocess.run(["sbatch", "--parsable", *args], env={**self.env, **(env or {})}, capture_output=True, text=True,
                                timeout=CALL_TIMEOUT_S, check=False)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """The job's fields from `scontrol show job` (JobState, Reason, ExitCode, ...)."""
        text = self.call("scontrol", "--oneliner", "show", "job", job_id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait_for_job(self, job_id: str, deadline_s: float = JOB_DEADLINE_S) -> dict[str, str]:
        deadline = time.monotonic() + deadline_s
        while True:
            fields = self.job(job_id)
            if fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
                return fields
            if time.monotonic() > deadline:
                self.call("scancel", job_id)
                pytest.fail(f"job {job_id} did not end within {deadline_s} s: {fields}\n{self.log_tails()}")
            time.sleep(0.2)

    def log_tails(self) -> str:
        return "\n".join(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
                         for log in sorted((self.folder / "log").glob("*.log")))

    def reset(self) -> None:
        """No job, both gates passing, the node idle: what each test starts from."""
        self.call("scancel", "--user=root")
        self.set_health_check()
        self.set_prolog()
        deadline = time.monotonic() + STATE_DEADLINE_S
        while self.call("squeue", "--noheader").stdout.strip():
            if time.monotonic() > deadline:
                pytest.fail(f"jobs left after scancel: {self.call('squeue').stdout}")
            time.sleep(0.1)
        if self.node_state()[0].startswith("drain"):
            self.call("scontrol", "update", f"nodename={self.node}", "state=resume")
        self.wait_for_node("idle", lambda state, reason: state == "idle" and reason == "none")


def slurm_conf(folder: Path, node_line: str, *, ctld_port: int, slurmd_port: int) -> str:
    """The slurm.conf of a one-node cluster whose state, logs and sockets live in folder."""
    return f"""\
ClusterName=preflighttest
SlurmctldHost={socket.gethostname()}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
# Bind the loopback address the host name resolves to, not every address of the machine.
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={folder}/munge/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd.log
# No cgroups: this machine's are not delegated to a test, and nothing here needs them.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# Schedule a batch job when it comes, not up to 3 s later (the default, for sites that submit thousands).
SchedulerParameters=batch_sched_delay=0
ReturnToService=2
HealthCheckProgram={folder}/healthcheck
HealthCheckInterval={HEALTH_CHECK_INTERVAL_S}
# Not on allocated nodes: there the gate sees the running job's own GPU memory and processes (PF204, PF205).
HealthCheckNodeState=IDLE
Prolog={folder}/prolog
PrologFlags=Alloc,DeferBatch
{node_line} NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=main Nodes=ALL Default=YES MaxTime=10 State=UP
"""


def start_daemon(argv: list[str], env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(["timeout", "--kill-after=5", str(DAEMON_LIFETIME_S), *argv], env=dict(env), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def stop_daemons(daemons: list[subprocess.Popen[bytes]]) -> None:
    # timeout(1) passes SIGTERM on to the daemon it runs; the last one started goes first.
    for daemon in reversed(daemons):
        if daemon.poll() is None:
            daemon.terminate()
        try:
            daemon.wait(timeout=STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait(timeout=STOP_DEADLINE_S)


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    require(os.geteuid() == 0, "the Slurm tests run slurmd as root")
    missing = [tool for tool in SLURM_TOOLS if shutil.which(tool) is None]
    require(not missing, f"the Slurm tests need {', '.join(missing)} (Debian packages slurm-wlm, munge)")
    require(PREFLIGHT.exists() and TORCHRUN.exists(), f"preflight and torchrun are not installed next to {sys.executable}")
    folder = tmp_path_factory.mktemp("slurm")
    for name in ("state", "spool", "log"):
        (folder / name).mkdir()
    munge = folder / "munge"
    munge.mkdir()
    key = munge / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    node_line = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=CALL_TIMEOUT_S, check=True).stdout.splitlines()[0]
    # The memory slurmd measures moves between starts; a configured RealMemory above it drains the node.
    node_line = re.sub(r" RealMemory=\d+", "", node_line)
    node = node_line.split()[0].removeprefix("NodeName=")
    conf = folder / "slurm.conf"
    conf.write_text(slurm_conf(folder, node_line, ctld_port=free_port(), slurmd_port=free_port()))
    cluster = SlurmCluster(folder=folder, node=node, env={**os.environ, "SLURM_CONF": str(conf)},
                           health_check_settings=folder / "healthcheck.env", prolog_settings=folder / "prolog.env",
                           health_check_runs=folder / "healthcheck.runs")
    cluster.set_health_check()
    cluster.set_prolog()
    # What slurm.conf names: the playbook's scripts with this cluster's settings files; the health check's
    # launcher also counts the runs slurmd finishes, and skips them while a run by hand is under way.
    settings = " ".join(f"{key}={value}" for key, value in cluster.health_check_env().items())
    write_atomically(folder / "healthcheck", f"#!/bin/sh\n[ -e {cluster.health_check_paused} ] && exit 0\n"
                     f"started=$(date +%s.%N)\n{settings} {HEALTH_CHECK}\n"
                     f"rc=$?\necho $started $rc >> {cluster.health_check_runs}\nexit $rc\n", 0o755)
    write_atomically(folder / "prolog", f"#!/bin/sh\nPREFLIGHT_DEFAULTS={cluster.prolog_settings} exec {PROLOG}\n", 0o755)

    daemons: list[subprocess.Popen[bytes]] = []
    try:
        # --force: pytest's folders are private to root, and munged refuses a socket other users cannot reach.
        daemons.append(start_daemon(["munged", "--foreground", "--force", f"--socket={munge}/munge.socket",
                                     f"--key-file={key}", f"--pid-file={munge}/munged.pid", f"--log-file={folder}/log/munged.log",
                                     f"--seed-file={munge}/munged.seed"], cluster.env, folder / "log" / "munged.out"))
        deadline = time.monotonic() + START_DEADLINE_S
        while not (munge / "munge.socket").exists():
            if time.monotonic() > deadline or daemons[0].poll() is not None:
                pytest.fail(f"munged did not start: {(folder / 'log' / 'munged.out').read_text()}")
            time.sleep(0.05)
        daemons.append(start_daemon(["slurmctld", "-D", "-c"], cluster.env, folder / "log" / "slurmctld.out"))
        daemons.append(start_daemon(["slurmd", "-D"], cluster.env, folder / "log" / "slurmd.out"))
        cluster.wait_for_node("idle", lambda state, reason: state == "idle", START_DEADLINE_S)
        cluster.health_checks_before_idle = cluster.finished_health_checks()
        yield cluster
    finally:
        try:
            subprocess.run(["scancel", "--user=root"], env=cluster.env, capture_output=True, timeout=CALL_TIMEOUT_S, check=False)
        finally:
            stop_daemons(daemons)
        deadline = time.monotonic() + STOP_DEADLINE_S
        while left := processes_naming(f"{folder}/"):
            if time.monotonic() > deadline:
                for line in left:
                    os.kill(int(line.split()[0]), signal.SIGKILL)
                pytest.fail(f"left running after the cluster stopped (now killed): {left}")
            time.sleep(0.1)


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    slurm_cluster.reset()
    yield slurm_cluster
    slurm_cluster.reset()


def test_slurmd_runs_the_health_check_which_drains_with_preflights_line_then_resumes(slurm: SlurmCluster) -> None:
    assert slurm.health_checks_before_idle >= 1, "slurmd runs the HealthCheckProgram when it starts, before the node is up"
    expected = gate_line(FAILING_GATE)
    assert expected.startswith("preflight: PF203 /dev/shm "), expected

    slurm.set_health_check(FAILING_GATE)
    state, _ = slurm.wait_for_node("drained by the health check", lambda state, reason: reason == expected)
    assert state == "drained"
    assert f"{expected}|{slurm.node}" in slurm.listed_reasons()

    slurm.set_health_check()
    slurm.wait_for_node("resumed by the health check", lambda state, reason: state == "idle" and reason == "none")


def test_health_check_leaves_an_admins_drain_alone(slurm: SlurmCluster) -> None:
    assert slurm.call("scontrol", "update", f"nodename={slurm.node}", "state=drain", f"reason={ADMIN_REASON}").returncode == 0
    passing = slurm.run_health_check()
    assert passing.returncode == 0, passing.stderr
    assert slurm.node_state() == ("drained", ADMIN_REASON)

    slurm.set_health_check(FAILING_GATE)
    failing = slurm.run_health_check()
    assert failing.returncode == 1
    assert f"node left as it is: already drained with reason: {ADMIN_REASON}" in failing.stderr
    assert slurm.node_state() == ("drained", ADMIN_REASON), "the admin's reason must not be replaced, or a pass would resume it"


def test_health_check_drains_when_the_gate_cannot_answer_and_ignores_bad_input(slurm: SlurmCluster) -> None:
    slurm.set_health_check(PREFLIGHT_GATE_TIMEOUT_S="0.05")
    timed_out = slurm.run_health_check()
    assert timed_out.returncode == 3, timed_out.stderr
    reason = "preflight: could not check: the gate did not answer within 0.05 s"
    assert slurm.node_state() == ("drained", reason)

    slurm.set_health_check("thresholds.no_such_limit=1")
    bad_input = slurm.run_health_check()
    assert bad_input.returncode == 2
    assert "bad input, node left as it is: preflight: error: " in bad_input.stderr
    assert slurm.node_state() == ("drained", reason)

    slurm.set_health_check()
    assert slurm.run_health_check().returncode == 0
    # A resumed node is "idle*" (not responding) until slurmctld's next ping.
    slurm.wait_for_node("resumed", lambda state, reason: state == "idle" and reason == "none")
    slurm.set_health_check("thresholds.no_such_limit=1")
    assert slurm.run_health_check().returncode == 2
    assert slurm.node_state() == ("idle", "none"), "a configuration mistake drains no node"


def test_failing_prolog_drains_with_prolog_error_and_the_health_check_leaves_it(slurm: SlurmCluster) -> None:
    expected = gate_line(FAILING_GATE)
    slurm.set_prolog(FAILING_GATE)
    job = slurm.sbatch("--output=/dev/null", "--wrap=true")
    slurm.wait_for_node("drained by the prolog", lambda state, reason: reason == "Prolog error")
    assert f"Prolog error|{slurm.node}" in slurm.listed_reasons()
    queued = slurm.call("squeue", "--noheader", f"--jobs={job}", "--format=%T|%r").stdout.strip()
    assert queued == "PENDING|launch failed requeued held", queued
    assert f"prolog failed: rc:1 output:{expected}" in (slurm.folder / "log" / "slurmd.log").read_text()

    # slurmd's own health checks pass on this node, and must not resume a drain Slurm set.
    slurm.wait_for_a_health_check_from_now()
    assert slurm.node_state() == ("drained", "Prolog error")


def job_output(slurm: SlurmCluster, tmp_path: Path, **env: str) -> tuple[dict[str, str], str]:
    """Submit gate-then-launch.sbatch with ddp_train.py; its end state and its output."""
    output = tmp_path / "job.out"
    job = slurm.sbatch(f"--output={output}", f"--chdir={tmp_path}", "--time=3", str(SBATCH_SCRIPT), str(DDP_SCRIPT),
                       env={"PREFLIGHT": str(PREFLIGHT), "TORCHRUN": str(TORCHRUN), **env})
    fields = slurm.wait_for_job(job)
    return fields, output.read_text()


def test_sbatch_gates_every_node_then_trains_with_the_emitted_launch(slurm: SlurmCluster, tmp_path: Path) -> None:
    # A port of its own: the default 29500 on loopback belongs to the this_machine tests (conftest.py).
    fields, output = job_output(slurm, tmp_path, PREFLIGHT_CHECK_ARGS=" ".join([*FAST, f"network.master_port={free_port()}"]))
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), output
    assert f"\n{slurm.node} preflight: ok, " in output
    assert "PASS  local: 1 host(s) (1 pass), playbook full" in output
    env_file = next((tmp_path / ".preflight").glob("job-*/launch/localhost.env"))
    assert "PET_RDZV_BACKEND=c10d" in env_file.read_text()
    ranks = [json.loads(line) for line in output.splitlines() if line.startswith('{"rank"')]
    # One CPU host: the launch's two gloo ranks (launch.SINGLE_HOST_GLOO_RANKS), as the check ran them.
    assert len(ranks) == 2, output
    for rank in ranks:
        # The launch came from the env file: gloo on the interface and address the check passed on.
        assert (rank["world_size"], rank["master_addr"], rank["gloo_ifname"]) == (2, "127.0.0.1", "lo")
        assert rank["steps"] > 0 and rank["params"] != rank["initial"]
    assert ranks[0]["params"] == ranks[1]["params"]  # DDP kept the two replicas equal
    assert sorted(ranks[0]["indices"] + ranks[1]["indices"]) == list(range(240))


def test_sbatch_stops_at_a_failing_gate(slurm: SlurmCluster, tmp_path: Path) -> None:
    fields, output = job_output(slurm, tmp_path, PREFLIGHT_GATE_ARGS=FAILING_GATE)
    assert (fields["JobState"], fields["ExitCode"]) == ("FAILED", "1:0"), output
    assert f"\n{slurm.node} {gate_line(FAILING_GATE)}\n" in output
    assert "a node failed its gate" in output and "== check" not in output
    assert not (tmp_path / ".preflight").exists()


def agent_job(slurm: SlurmCluster, tmp_path: Path, **env: str) -> tuple[dict[str, str], str]:
    """Submit agent-then-launch.sbatch with ddp_train.py: srun starts `preflight agent` (the default playbook, a small
    sweep), and a pass trains; its end state and its output."""
    output = tmp_path / "job.out"
    # Ports of its own: the agents' store and the collective's (29500 on loopback belongs to the this_machine tests).
    settings = {"PREFLIGHT": str(PREFLIGHT), "TORCHRUN": str(TORCHRUN), "PREFLIGHT_AGENT_PORT": str(free_port()),
                "PREFLIGHT_AGENT_ARGS": " ".join([*FAST, f"network.master_port={free_port()}"]), **env}
    job = slurm.sbatch(f"--output={output}", f"--chdir={tmp_path}", "--time=5", str(AGENT_SBATCH_SCRIPT), str(DDP_SCRIPT),
                       env=settings)
    # Three torch launches in one job (the agent, the collective's ranks, the training's): 107 s with other sessions'
    # tests beside it on this 2-core VM (load 13), past 120 s at load 20.
    return slurm.wait_for_job(job, deadline_s=AGENT_JOB_DEADLINE_S), output.read_text()


def test_agent_sbatch_checks_the_node_with_srun_then_trains_from_the_agents_report(slurm: SlurmCluster, tmp_path: Path) -> None:
    fields, output = agent_job(slurm, tmp_path)
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), output
    # The agents met on the allocation's first node, named by scontrol from the job's node list.
    assert f"== preflight agent: 1 node(s), meeting at {slurm.node}:" in output
    state = next((tmp_path / ".preflight").glob("job-*"))
    report = json.loads((state / "report.json").read_text())
    # The whole check, not the facts alone: srun's one task was rank 0, and ran the collective in its own process group.
    assert (report["exit_code"], report["playbook"], report["collective"]["status"]) == (0, "full", "pass"), report["findings"]
    assert "PET_RDZV_BACKEND=c10d" in (state / "launch" / "localhost.env").read_text()
    ranks = [json.loads(line) for line in output.splitlines() if line.startswith('{"rank"')]
    assert len(ranks) == 2 and {r["world_size"] for r in ranks} == {2}, output
    assert ranks[0]["params"] == ranks[1]["params"] != ranks[0]["initial"]
    assert sorted(ranks[0]["indices"] + ranks[1]["indices"]) == list(range(240))


def test_agent_sbatch_stops_agents_past_their_deadline_and_says_could_not_check(slurm: SlurmCluster, tmp_path: Path) -> None:
    """Each node's agent stopped 1 s after it starts: srun passes timeout's 124 on, and the job ends with preflight's
    could-not-check, 3. The report a requeued job's earlier run left in its folder is gone, so nothing launches from it."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "report.json").write_text('{"status": "pass"}')
    fields, output = agent_job(slurm, tmp_path, PREFLIGHT_AGENT_TIMEOUT_S="1", PREFLIGHT_STATE_DIR=str(state))
    assert (fields["JobState"], fields["ExitCode"]) == ("FAILED", "3:0"), output
    assert "preflight: could not check: an agent did not finish within 1 s: no training" in output
    assert "== emit-launch" not in output and not (state / "report.json").exists()


# --- Kubernetes -------------------------------------------------------------------------------------------------

def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity with a binary suffix (16Gi) in bytes."""
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)?", quantity)
    assert match, f"the test reads only binary-suffixed quantities, not {quantity!r}"
    number, suffix = match.groups()
    return int(number) << {None: 0, "Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40}[suffix]


def in_container(argv: list[str], env: Mapping[str, str], shm_bytes: int) -> subprocess.CompletedProcess[str]:
    """argv in a mount namespace of its own whose /dev/shm is a tmpfs of shm_bytes, as a container runtime gives it."""
    mount_then_run = f'mount -t tmpfs -o size={shm_bytes},mode=1777 shm /dev/shm && exec "$@"'
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", mount_then_run, "container", *argv],
                          env=dict(env), capture_output=True, text=True, timeout=60, check=False)


def test_k8s_init_container_gate_fails_on_a_containers_shm_and_passes_on_the_empty_dir() -> None:
    require(os.geteuid() == 0 and shutil.which("unshare") is not None, "a private mount namespace needs root and unshare")
    job = yaml.safe_load(POD_MANIFEST.read_text())
    pod = job["spec"]["template"]["spec"]
    (gate,) = (c for c in pod["initContainers"] if c["name"] == "preflight-gate")
    shm_volumes = {v["name"]: v for v in pod["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"}
    for container in (gate, *pod["containers"]):
        mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
        assert mounts.get("/dev/shm") in shm_volumes, f"{container['name']} has no memory-backed /dev/shm"
    empty_dir_bytes = quantity_bytes(shm_volumes[mounts["/dev/shm"]]["emptyDir"]["sizeLimit"])
    rule = job["spec"]["podFailurePolicy"]["rules"][0]
    assert rule["onExitCodes"]["containerName"] == gate["name"] and rule["onExitCodes"]["values"] == [2]

    argv = [*gate["command"], *gate.get("args", [])]
    # The image's PATH would find the image's preflight; here it is this environment's.
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", **{e["name"]: e["value"] for e in gate.get("env", [])}}
    without_empty_dir = in_container(argv, env, 64 << 20)
    assert without_empty_dir.returncode == 1, without_empty_dir.stderr
    assert without_empty_dir.stdout == "preflight: PF203 /dev/shm 64MiB < 1GiB\n"
    with_empty_dir = in_container(argv, env, empty_dir_bytes)
    assert with_empty_dir.returncode == 0, with_empty_dir.stdout + with_empty_dir.stderr
    assert with_empty_dir.stdout.startswith("preflight: ok, ")


def kubernetes_expanded(text: str, env: Mapping[str, str]) -> str:
    """A command or argument as the kubelet runs it: $(NAME) of a variable the container defines is its value, $$ is $,
    and any other $(...) stays as written."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), text)


def test_k8s_indexed_job_meets_at_pod_0_and_trains_only_from_the_agents_launch(tmp_path: Path) -> None:
    """No cluster here: the manifest's wiring is read from the file, and its cluster file is composed by preflight."""
    documents = {d["kind"]: d for d in yaml.safe_load_all(AGENT_JOB_MANIFEST.read_text())}
    service, config_map, job = documents["Service"], documents["ConfigMap"], documents["Job"]
    name, service_name, spec = job["metadata"]["name"], service["metadata"]["name"], job["spec"]
    pod = spec["template"]["spec"]
    # Every pod at once, by index; one launch, so a failed pod fails the Job.
    assert (spec["completionMode"], spec["parallelism"], spec["backoffLimit"], pod["restartPolicy"]) == (
        "Indexed", spec["completions"], 0, "Never")
    # Stable names resolvable while the pods are still in their init containers.
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": name} and pod["subdomain"] == service_name

    (config_volume,) = (v for v in pod["volumes"] if v.get("configMap", {}).get("name") == config_map["metadata"]["name"])
    files = {item["path"]: config_map["data"][item["key"]] for item in config_volume["configMap"]["items"]}
    cluster = yaml.safe_load(files["cluster/pods.yaml"])
    stable = [f"{name}-{index}" for index in range(spec["completions"])]  # an Indexed Job's hostnames
    assert [h["name"] for h in cluster["hosts"]] == stable and cluster["master"] == stable[0]
    assert [h["address"] for h in cluster["hosts"]] == [f"{host}.{service_name}" for host in stable]

    agent, launch = pod["initContainers"]  # in this order: the launch is emitted only once the agents are done
    (train,) = pod["containers"]
    env = {e["name"]: e.get("value") or e["valueFrom"]["fieldRef"]["fieldPath"] for e in agent["env"]}
    assert env["RANK"] == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert (env["WORLD_SIZE"], env["MASTER_ADDR"]) == (str(spec["completions"]), cluster["hosts"][0]["address"])
    assert int(env["MASTER_PORT"]) in {p["port"] for p in service["spec"]["ports"]}
    timeout, kill_after, deadline_s, *agent_command = agent["command"]
    assert (timeout, kill_after, agent_command) == ("timeout", "--kill-after=10", ["preflight", "agent"]) and int(deadline_s) > 0
    # emit-launch composes the agents' config exactly (a report for another config is refused), and never forces.
    assert launch["command"] == ["preflight", "emit-launch"] and launch["args"][:-2] == agent["args"]
    assert launch["args"][-2] == "--out" and "--force" not in launch["args"]
    assert {e["name"]: e["valueFrom"] for e in launch["env"]}["JOB_UID"]["fieldRef"]["fieldPath"] == env["JOB_UID"]

    def mounts(container: dict[str, Any]) -> dict[str, str]:
        return {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    config_dir = agent["args"][agent["args"].index("--config-dir") + 1]
    state_dir = next(a for a in agent["args"] if a.startswith("state_dir=")).removeprefix("state_dir=")
    shared = next(v["name"] for v in pod["volumes"] if "persistentVolumeClaim" in v)
    for container in (agent, launch):
        assert mounts(container)[config_dir] == config_volume["name"]
        assert any(mounts(container).get(str(path)) == shared for path in Path(state_dir).parents), container["name"]
    out = launch["args"][-1]
    assert mounts(launch)[out] == mounts(train)[out], "the training container must see the env files emit-launch wrote"
    command = kubernetes_expanded(train["command"][-1], {})
    assert f". {out}/$(hostname).env" in command and command.endswith("exec torchrun train.py"), command

    # The cluster file, as the kubelet lays the ConfigMap out, is a config preflight composes (exit 0, nothing touched).
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    args = [kubernetes_expanded(a, {"JOB_UID": "0b6c6a4e"}).replace(config_dir, str(tmp_path)) for a in agent["args"]]
    composed = subprocess.run([str(PREFLIGHT), "check", "--cfg", "job", *args], capture_output=True, text=True, timeout=60, check=False)
    assert composed.returncode == 0, composed.stderr
    assert yaml.safe_load(composed.stdout)["state_dir"] == "/shared/preflight/0b6c6a4e"
