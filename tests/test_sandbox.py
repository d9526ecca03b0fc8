"""The namespace test cluster is real: SSH, names, interfaces, /dev/shm, every fault, and a teardown that leaves nothing."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import LEFT_UP, SandboxFactory, claim_lock, eventually, skip_or_fail

from preflight.compose import load_spec
from preflight.errors import InputError
from preflight.sandbox import HostQuirks, Sandbox, leftovers
from preflight.sandbox.system import TEARDOWN_TIMEOUT_S

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[1]
SHM_BYTES = 64 << 20
CONNECT_TIMEOUT_S = 2


@pytest.fixture(scope="module")
def cluster(sandbox_factory: SandboxFactory) -> Sandbox:
    return sandbox_factory(3, quirks={
        1: HostQuirks(ifname="ens5"),
        2: HostQuirks(shm_bytes=SHM_BYTES),
        3: HostQuirks(own_name="loopback"),
    })


def ssh(cluster: Sandbox, name: str, *command: str) -> subprocess.CompletedProcess[str]:
    argv = cluster.ssh_argv(name, *command, connect_timeout=CONNECT_TIMEOUT_S)
    return subprocess.run(argv, capture_output=True, text=True, timeout=CONNECT_TIMEOUT_S + 15)


def subprocess_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def test_each_host_answers_ssh_with_its_own_name(cluster: Sandbox) -> None:
    for host in cluster.hosts:
        result = ssh(cluster, host.name, "hostname")
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == host.name


def test_known_hosts_names_every_host_by_name_too(cluster: Sandbox) -> None:
    # From inside h1, h2 is reached by name: resolved by h1's /etc/hosts, its key found under its name.
    argv = cluster.ssh_argv("h2", "hostname", connect_timeout=CONNECT_TIMEOUT_S)
    argv[-2] = "root@h2"
    result = cluster.run_in("h1", argv, timeout=20)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "h2"


def test_names_resolve_from_each_hosts_own_etc_hosts(cluster: Sandbox) -> None:
    h2 = cluster.host("h2")
    result = ssh(cluster, "h1", "getent", "hosts", "h2")
    assert result.stdout.split() == [h2.address, "h2"]
    assert cluster.run_in("h3", ["getent", "hosts", "h3"], timeout=10).stdout.split()[0] == "127.0.0.1"
    assert cluster.run_in("h1", ["getent", "hosts", "h3"], timeout=10).stdout.split()[0] == cluster.host("h3").address
    with open("/etc/hosts", encoding="utf-8") as f:
        assert "h2" not in f.read().split(), "the controller's /etc/hosts must stay untouched"


def test_small_dev_shm_on_one_host_only(cluster: Sandbox) -> None:
    sizes = {h.name: ssh(cluster, h.name, "df", "-B1", "--output=size", "/dev/shm").stdout.split()[-1] for h in cluster.hosts}
    assert sizes["h2"] == str(SHM_BYTES)
    assert sizes["h1"] != str(SHM_BYTES)


def test_interface_names(cluster: Sandbox) -> None:
    for host, expected in zip(cluster.hosts, ("ens5", "eth0", "eth0"), strict=True):
        assert host.ifname == expected
        result = ssh(cluster, host.name, "ip", "-o", "-4", "addr", "show", "dev", expected)
        assert result.returncode == 0, result.stderr
        assert f"inet {host.address}/24" in result.stdout
        assert sorted(ssh(cluster, host.name, "ls", "/sys/class/net").stdout.split()) == sorted(["lo", expected])


def test_hosts_reach_each_other(cluster: Sandbox) -> None:
    # A TCP connect to each peer's sshd: Debian's minimal image has no ping.
    probe = "import socket, sys; socket.create_connection((sys.argv[1], 22), timeout=1).close()"
    for source in cluster.hosts:
        for target in cluster.hosts:
            if target is not source:
                result = cluster.run_in(source.name, [sys.executable, "-c", probe, target.address], timeout=10)
                assert result.returncode == 0, f"{source.name} -> {target.name}: {result.stderr}"


def assert_heals(cluster: Sandbox, name: str) -> None:
    cluster.heal(name)
    result = ssh(cluster, name, "hostname")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == name
    # What is left in the host: its anchor and its sshd, once the session's processes are gone.
    assert eventually(lambda: len(cluster.pids(name)) == 2), cluster.pids(name)


def test_stopped_sshd_refuses_connections(cluster: Sandbox) -> None:
    cluster.stop_sshd("h2")
    try:
        result = ssh(cluster, "h2", "true")
        assert result.returncode == 255
        assert "Connection refused" in result.stderr
        assert ssh(cluster, "h1", "true").returncode == 0
    finally:
        assert_heals(cluster, "h2")


def test_blackholed_host_times_out_at_connect(cluster: Sandbox) -> None:
    cluster.blackhole("h3")
    try:
        start = time.monotonic()
        result = ssh(cluster, "h3", "true")
        elapsed = time.monotonic() - start
        assert result.returncode == 255
        assert "Connection timed out" in result.stderr
        assert CONNECT_TIMEOUT_S - 0.5 < elapsed < CONNECT_TIMEOUT_S + 3
    finally:
        assert_heals(cluster, "h3")


def test_denied_auth_is_permission_denied(cluster: Sandbox) -> None:
    cluster.deny_auth("h1")
    try:
        result = ssh(cluster, "h1", "true")
        assert result.returncode == 255
        assert "Permission denied (publickey)" in result.stderr
    finally:
        assert_heals(cluster, "h1")


def test_changed_host_key_fails_verification(cluster: Sandbox) -> None:
    cluster.change_host_key("h2")
    try:
        result = ssh(cluster, "h2", "true")
        assert result.returncode == 255
        assert "Host key verification failed" in result.stderr
    finally:
        assert_heals(cluster, "h2")


def test_silent_listener_times_out_waiting_for_the_banner(cluster: Sandbox) -> None:
    cluster.silence("h1", lifetime_s=60)
    try:
        start = time.monotonic()
        result = ssh(cluster, "h1", "true")
        elapsed = time.monotonic() - start
        assert result.returncode == 255
        assert "banner exchange" in result.stderr
        assert elapsed < CONNECT_TIMEOUT_S + 3
    finally:
        assert_heals(cluster, "h1")


def test_cluster_config_composes_into_a_spec(cluster: Sandbox, tmp_path: Path) -> None:
    path = cluster.write_cluster_config(tmp_path / "cluster" / "sbtest.yaml", name="sbtest")
    assert path.read_text(encoding="utf-8").startswith("# @package _global_\n")
    spec = load_spec(["cluster=sbtest"], config_dir=str(tmp_path))
    config = spec.config
    assert config.cluster.name == "sbtest" and config.cluster.master == "h1"
    assert [(h.name, h.address, h.interface) for h in config.cluster.hosts] == [(h.name, h.address, h.ifname) for h in cluster.hosts]
    assert {h.identity for h in config.cluster.hosts} == {str(cluster.identity)}
    assert config.ssh.known_hosts == str(cluster.known_hosts)


def test_clashes_and_bad_quirks_are_input_errors(cluster: Sandbox, sandbox_factory: SandboxFactory) -> None:
    prefix, _ = sandbox_factory.reserve()
    with pytest.raises(InputError, match="already exists"):
        Sandbox.up(1, prefix=cluster.prefix, index=cluster.index + 1)
    with pytest.raises(InputError, match=f"subnet {cluster.subnet} .* is in use on {cluster.bridge}"):
        Sandbox.up(1, prefix=prefix, index=cluster.index)
    with pytest.raises(InputError, match="not a Linux interface name"):
        Sandbox.up(1, prefix=prefix, quirks={1: HostQuirks(ifname="enp0s31f6-too-long")})
    assert leftovers(prefix) == []


def test_down_leaves_nothing_behind(sandbox_factory: SandboxFactory, tmp_path: Path) -> None:
    sandbox = sandbox_factory(2, quirks={2: HostQuirks(own_name="missing", shm_bytes=SHM_BYTES)})
    assert sandbox.run_in("h2", ["getent", "hosts", "h2"], timeout=10).returncode == 2, "h2's own name must not resolve"
    assert sandbox.run_in("h1", ["getent", "hosts", "h2"], timeout=10).returncode == 0
    config = sandbox.write_cluster_config(tmp_path / "cluster.yaml")
    session = subprocess.Popen(sandbox.ssh_argv("h1", "sleep", "30"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert eventually(lambda: len(sandbox.pids("h1")) > 2), "the session's sshd processes live in h1"
        sandbox.silence("h2", lifetime_s=60)
        sandbox.blackhole("h2")
        assert leftovers(sandbox.prefix)
        sandbox.down()
        assert leftovers(sandbox.prefix) == []
        assert not config.exists()
        assert session.wait(timeout=10) != 0, "the session died with its host"
        sandbox.down()  # idempotent
    finally:
        session.kill()
        session.wait(timeout=10)


def start_harness(prefix: str, index: int) -> subprocess.Popen[str]:
    code = (
        "import faulthandler, signal, sys, time\n"
        "from preflight.sandbox import Sandbox\n"
        "faulthandler.register(signal.SIGUSR1)\n"  # where it is, should it outlive the test's wait
        f"Sandbox.up(2, prefix={prefix!r}, index={index})\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    harness = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=subprocess_env())
    assert harness.stdout is not None
    ready, _, _ = select.select([harness.stdout], [], [], 20)
    assert ready and harness.stdout.readline().strip() == "up"
    return harness


def exit_status(harness: subprocess.Popen[str], timeout: float) -> int:
    """The harness's exit status; past timeout, fail with where it was stuck (its Python stack and its kernel wait)."""
    try:
        return harness.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc = Path(f"/proc/{harness.pid}")
        kernel = [f"{name}: {(proc / name).read_text(errors='replace').strip()}" for name in ("wchan", "stack")
                  if (proc / name).exists()]
        harness.send_signal(signal.SIGUSR1)
        time.sleep(1)
        harness.kill()
        _, err = harness.communicate(timeout=10)
        pytest.fail(f"the harness still ran {timeout:.0f} s after the signal\n" + "\n".join(kernel) + "\n" + err)


def test_down_prefix_cleans_up_after_a_killed_harness(sandbox_factory: SandboxFactory) -> None:
    prefix, index = sandbox_factory.reserve()
    harness = start_harness(prefix, index)
    harness.kill()
    harness.wait(timeout=10)
    assert any(item.startswith("process ") for item in leftovers(prefix)), "SIGKILL leaves the hosts running"
    removed = Sandbox.down_prefix(prefix)
    assert f"namespace {prefix}-h1" in removed and f"interface {prefix}-br" in removed
    assert leftovers(prefix) == []


def test_sigterm_tears_down(sandbox_factory: SandboxFactory) -> None:
    prefix, index = sandbox_factory.reserve()
    harness = start_harness(prefix, index)
    harness.send_signal(signal.SIGTERM)
    # The bound is the teardown's own (one deadline for all its steps) and the interpreter's exit: a loaded CI machine
    # once took over 20 s here, so a failure now says where the harness was.
    status = exit_status(harness, TEARDOWN_TIMEOUT_S + 20)
    assert status == 128 + signal.SIGTERM, "SIGTERM exits through atexit"
    assert leftovers(prefix) == []


@pytest.mark.this_machine  # the default sandbox `pf` (conftest.py)
def test_cli_sandbox_outlives_its_process_until_down(sandbox_factory: SandboxFactory, tmp_path: Path) -> None:
    lock = claim_lock("pf")
    if lock is None:
        skip_or_fail("another test session on this machine is testing `preflight sandbox up`")
    if leftovers():
        lock.close()
        skip_or_fail(LEFT_UP)
    env = {**subprocess_env(), "XDG_CONFIG_HOME": str(tmp_path)}

    def run(call: str) -> str:
        code = f"from preflight.sandbox import sandbox_up, sandbox_down; print({call})"
        # sandbox_down() is a teardown: its bound and the interpreter's start, as test_sigterm_tears_down waits
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                timeout=TEARDOWN_TIMEOUT_S + 20)
        assert result.returncode == 0, result.stderr
        return result.stdout

    config = tmp_path / "preflight" / "cluster" / "sandbox.yaml"
    try:
        assert str(config) in run("sandbox_up(2)")
        assert "removed by `preflight sandbox down`" in config.read_text(encoding="utf-8")
        spec = load_spec(["cluster=sandbox"], config_dir=str(tmp_path / "preflight"))
        h2 = spec.config.cluster.hosts[1]
        assert h2.identity is not None and spec.config.ssh.known_hosts is not None
        argv = ["ssh", "-F", "none", "-i", h2.identity, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={spec.config.ssh.known_hosts}", "-o", "ConnectTimeout=5", f"root@{h2.address}", "hostname"]
        assert subprocess.run(argv, capture_output=True, text=True, timeout=20).stdout.strip() == "h2"
        assert run("sandbox_down()").startswith("sandbox down: removed 2 namespaces")
        assert leftovers() == [] and not config.exists()
        assert run("sandbox_down()").strip() == "sandbox down: nothing to remove"
    finally:
        Sandbox.down_prefix()
        lock.close()
