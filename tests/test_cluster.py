"""`preflight check` over SSH on a real cluster: network namespaces, one sshd each, real faults.

Every fault case asserts the host's status and reason, that the deadline held, that the other
hosts' results are intact, and that nothing is left running on any host.
"""

from __future__ import annotations

import importlib.util
import io
import ipaddress
import json
import os
import subprocess
import sys
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from conftest import LEFT_UP, claim_lock, preflight, skip_or_fail

from preflight.resources import load_schema
from preflight.sandbox import HostMount, HostQuirks, Sandbox, foreign_address, leftovers
from preflight.sandbox.hosts import soft_nofile
from preflight.sandbox.system import ip_batch

pytestmark = pytest.mark.sandbox

CONNECT_S = 3.0  # ssh.connect_timeout_s in these tests
COMMAND_S = 6.0  # ssh.command_timeout_s in these tests
# A run pays for python start-up, Hydra's compose and the healthy hosts' probes besides the deadline.
SLACK_S = 6.0


class Cluster:
    """A sandbox plus the config folder that names it, and a way to run `preflight check` on it."""

    def __init__(self, sandbox: Sandbox, folder: Path, name: str) -> None:
        self.sandbox = sandbox
        self.folder = folder
        self.name = name
        sandbox.write_cluster_config(folder / "conf" / "cluster" / f"{name}.yaml", name=name)

    def check(self, *overrides: str, playbook: str | None = "facts", timeout: float = 120, terminal: bool = False
              ) -> tuple[dict[str, Any], float, subprocess.CompletedProcess[str]]:
        """One check: its report, wall seconds and the process. playbook None: the default one, as `preflight check`
        runs with no playbook given. terminal: the check prints its table (result.stdout) rather than JSON, and the
        report is the one it saved in the state folder."""
        began = time.monotonic()
        state = self.folder / "state"
        result = preflight("check", *([] if terminal else ["--json"]), "--config-dir", str(self.folder / "conf"), f"cluster={self.name}",
                           *([f"playbook={playbook}"] if playbook else []), f"ssh.connect_timeout_s={CONNECT_S}",
                           f"ssh.command_timeout_s={COMMAND_S}",
                           f"state_dir={state}", *overrides, cwd=self.folder, timeout=timeout)
        elapsed = time.monotonic() - began
        if result.returncode == 2 or not result.stdout:
            pytest.fail(f"preflight check failed to run: {result.stderr}")
        report = json.loads((state / "report.json").read_text() if terminal else result.stdout)
        jsonschema.validate(report, load_schema("report"))
        assert result.returncode == report["exit_code"]
        return report, elapsed, result

    def assert_nothing_left(self, hosts: Collection[str] | None = None, within_s: float = 5) -> None:
        """Only the hosts' own sshd (or silent listener) may live in their namespaces once a run is over (hosts: only
        these); what is still ending may take within_s."""
        deadline = time.monotonic() + within_s
        while True:
            stray = {}
            for host in self.sandbox.hosts:
                if hosts is not None and host.name not in hosts:
                    continue
                for pid in self.sandbox.pids(host.name):
                    try:
                        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                    except (FileNotFoundError, ProcessLookupError):  # ended meanwhile: /proc/PID answers ESRCH
                        continue
                    owned = (" -D " in f" {cmdline} " and "sshd" in cmdline) or "socket" in cmdline or "sleep infinity" in cmdline
                    if not owned and "pytest" not in cmdline:
                        stray[pid] = (host.name, cmdline)
            if not stray or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert stray == {}, f"left running on hosts: {stray}"


def hosts_by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["name"]: h for h in report["hosts"]}


def assert_others_pass(report: dict[str, Any], broken: str) -> None:
    for name, host in hosts_by_name(report).items():
        if name != broken:
            assert host["status"] in ("pass", "warn"), (name, host)
            assert host["facts"]["host"]["hostname"] == name


@pytest.fixture(scope="module")
def cluster(sandbox_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    sandbox = sandbox_factory(4)
    yield Cluster(sandbox, tmp_path_factory.mktemp("cluster4"), "ns4")


@pytest.fixture
def healed(cluster: Cluster) -> Iterator[Cluster]:
    yield cluster
    for host in cluster.sandbox.hosts:
        cluster.sandbox.heal(host.name)


def test_healthy_cluster_passes(cluster: Cluster) -> None:
    report, _elapsed, _ = cluster.check()
    assert report["status"] == "pass"
    assert [h["name"] for h in report["hosts"]] == ["h1", "h2", "h3", "h4"]
    numa_balancing = int(Path("/proc/sys/kernel/numa_balancing").read_text())
    for name, host in hosts_by_name(report).items():
        assert host["facts"]["host"]["hostname"] == name  # each host really is its own machine
        assert host["facts"]["host"]["resolves_to"] == [cluster.sandbox.host(name).address]
        # The GPU node's facts, read for real over SSH: the kernel log (root here), sysfs topology, no fabric.
        facts = host["facts"]
        assert (facts["kernel_log"]["source"], facts["kernel_log"]["error"]) == ("kmsg", None)
        assert facts["topology"]["numa_balancing"] == numa_balancing and facts["fabric"]["nvswitch_count"] == 0
        # Its speed is bench/probe_speed.py's to measure (docs/benchmarks.md); here, that it was measured.
        assert facts["probe"]["schema"] == 4 and facts["probe"]["elapsed_s"] > 0
    codes = {(f["code"], f["host"]): f for f in report["findings"]}
    assert codes[("PF303", "h2")]["status"] == "pass" and cluster.sandbox.host("h2").address in codes[("PF303", "h2")]["message"]
    assert codes[("PF501", "*")]["status"] == "pass" and "on all 4 hosts" in codes[("PF501", "*")]["message"]
    assert codes[("PF505", "*")]["status"] == "pass"
    assert codes[("PF506", "*")]["status"] == "pass" and codes[("PF506", "*")]["message"].startswith("4 hosts, each its own machine")
    cluster.assert_nothing_left()


def test_dcgm_stage_on_hosts_without_dcgm_is_not_run(cluster: Cluster) -> None:
    report, _elapsed, _ = cluster.check("playbook.stages=[facts,dcgm]", "dcgm.timeout_s=30")
    assert report["status"] == "pass"
    assert [(h["host"], h["status"]) for h in report["dcgm"]["hosts"]] == [(n, "not run") for n in ("h1", "h2", "h3", "h4")]
    assert {(f["host"], f["status"], f["message"]) for f in report["findings"] if f["code"] == "PF852"} == {
        (n, "pass", "not run: dcgmi is not installed") for n in ("h1", "h2", "h3", "h4")}
    from rich.console import Console

    from preflight.report import render

    out = io.StringIO()
    Console(file=out, width=200).print(render(report))  # type: ignore[arg-type]
    assert "dcgm NOT RUN  dcgmi diag -r 1: h1: not run; h2: not run; h3: not run; h4: not run" in out.getvalue()
    from preflight.report_html import report_html

    page = report_html(report)  # type: ignore[arg-type]
    assert '<h2 id="dcgm">DCGM diagnostic</h2>' in page and "on 4 host(s), each within 30 s</p>" in page


def test_sshd_stopped(healed: Cluster) -> None:
    healed.sandbox.stop_sshd("h3")
    report, elapsed, _ = healed.check()
    h3 = hosts_by_name(report)["h3"]
    assert report["status"] == "incomplete" and h3["status"] == "unknown"
    assert "refused" in h3["reason"]
    assert elapsed < CONNECT_S + SLACK_S
    assert_others_pass(report, "h3")
    healed.assert_nothing_left()


def test_blackholed_host_times_out_within_the_connect_deadline(healed: Cluster) -> None:
    healed.sandbox.blackhole("h2")
    report, elapsed, _ = healed.check()
    h2 = hosts_by_name(report)["h2"]
    assert h2["status"] == "unknown" and "timed out" in h2["reason"]
    assert CONNECT_S - 0.5 < elapsed < CONNECT_S + SLACK_S
    assert_others_pass(report, "h2")
    healed.assert_nothing_left()


def test_a_host_whose_local_port_range_is_used_up_fails_before_the_job(healed: Cluster) -> None:
    # A real gloo job of one rank per host under torchrun (make_logs.py ports-exhausted, torch 2.13) failed "bind:
    # Address already in use" with 3 local ports and ran with 4: torchrun's agent's 2 store connections, the rank's
    # 1, its gloo listener's 1. The check draws the line there: h3 narrowed to 3 ports fails, at 4 passes.
    sandbox = healed.sandbox
    before = sandbox.run_in("h3", ["sysctl", "-n", "net.ipv4.ip_local_port_range"]).stdout.split()
    seen = {}
    try:
        for last in (40002, 40003):
            assert sandbox.run_in("h3", ["sysctl", "-q", "-w", f"net.ipv4.ip_local_port_range=40000 {last}"]).returncode == 0
            report, _, _ = healed.check()
            seen[last] = {(f["code"], f["host"]): f for f in report["findings"]}
    finally:
        sandbox.run_in("h3", ["sysctl", "-q", "-w", f"net.ipv4.ip_local_port_range={' '.join(before)}"])
    narrowed, enough = seen[40002][("PF310", "h3")], seen[40003][("PF310", "h3")]
    assert narrowed["status"] == "fail" and narrowed["message"].startswith("local ports 40000-40002: 3 free of 3, under 4"), narrowed
    assert enough["status"] == "pass" and enough["message"].startswith("local ports 40000-40003: 4 free of 4, at least 4"), enough
    assert {seen[40002][("PF310", h)]["status"] for h in ("h1", "h2", "h4")} == {"pass"}


def test_auth_denied(healed: Cluster) -> None:
    healed.sandbox.deny_auth("h4")
    report, elapsed, _ = healed.check()
    h4 = hosts_by_name(report)["h4"]
    assert h4["status"] == "unknown" and "auth" in h4["reason"].lower()
    assert elapsed < CONNECT_S + SLACK_S
    assert_others_pass(report, "h4")
    healed.assert_nothing_left()


@pytest.mark.parametrize("policy", ["strict", "accept-new"])
def test_changed_host_key_is_refused(healed: Cluster, policy: str) -> None:
    healed.sandbox.change_host_key("h2")
    before = healed.sandbox.known_hosts.read_text()
    report, _elapsed, _ = healed.check(f"ssh.host_key_policy={policy}")
    h2 = hosts_by_name(report)["h2"]
    assert h2["status"] == "unknown" and "changed" in h2["reason"].lower()
    assert healed.sandbox.known_hosts.read_text() == before  # a changed key is never recorded
    assert_others_pass(report, "h2")
    healed.assert_nothing_left()


def test_listener_that_never_speaks_ssh(healed: Cluster) -> None:
    healed.sandbox.silence("h1")
    report, elapsed, _ = healed.check()
    h1 = hosts_by_name(report)["h1"]
    assert h1["status"] == "unknown" and "banner" in h1["reason"].lower()
    assert elapsed < CONNECT_S + SLACK_S
    assert_others_pass(report, "h1")
    healed.assert_nothing_left()


def test_remote_command_that_hangs_is_cut_at_its_deadline(healed: Cluster, tmp_path: Path) -> None:
    hanging = tmp_path / "hanging-python"
    hanging.write_text("#!/bin/sh\nexec sleep 600\n")
    hanging.chmod(0o755)
    report, elapsed, _ = healed.check(f"cluster.hosts.2.python={hanging}")
    h3 = hosts_by_name(report)["h3"]
    assert h3["status"] == "unknown" and f"timed out after {COMMAND_S:g} s" in h3["reason"]
    assert COMMAND_S - 0.5 < elapsed < COMMAND_S + SLACK_S
    assert_others_pass(report, "h3")
    healed.assert_nothing_left()  # no `sleep 600` survives on h3


def other_torch_env(folder: Path, version: str) -> Path:
    """A second environment whose torch reports another version.

    A second real torch build cannot be installed here (only the local CPU wheel exists), so this
    environment links every file of the real torch package and changes only version.py's
    __version__: the field under test."""
    env = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(env)], check=True, timeout=60)
    spec = importlib.util.find_spec("torch")  # finds the package without importing it
    assert spec is not None and spec.submodule_search_locations
    real = Path(spec.submodule_search_locations[0])
    site = next((env / "lib").glob("python3*/site-packages"))
    linked = site / "torch"
    linked.mkdir()
    for entry in real.iterdir():
        if entry.name != "version.py":
            (linked / entry.name).symlink_to(entry)
    text = (real / "version.py").read_text()
    current = next(line for line in text.splitlines() if line.startswith("__version__"))
    (linked / "version.py").write_text(text.replace(current, f"__version__ = '{version}'"))
    return env / "bin" / "python"


def test_a_host_python_too_old_for_the_probe_is_named_with_its_version(cluster: Cluster) -> None:
    # An old distribution's python3 (3.6 on CentOS 7): before, it compiled the probe and stopped at its first newer line
    # with a bare "SyntaxError: invalid syntax". This machine's image carries older CPythons beside its own (pyenv).
    olds = sorted(Path("/root/.pyenv/versions").glob("3.[67].*/bin/python3"))
    if not olds:
        skip_or_fail("no python older than 3.8 on this machine (/root/.pyenv/versions/3.6.* or 3.7.*)")
    old = olds[0]
    version = old.parent.parent.name
    report, _elapsed, _ = cluster.check(f"cluster.hosts.1.python={old}")
    assert report["status"] == "incomplete"
    h2 = hosts_by_name(report)["h2"]
    assert h2["status"] == "unknown"
    assert h2["reason"] == f"the probe failed with {old}: Python {version}; preflight's host scripts need 3.8 or newer"
    assert_others_pass(report, "h2")
    cluster.assert_nothing_left()


def test_host_with_another_torch_is_named_by_the_cross_host_check(cluster: Cluster, tmp_path: Path) -> None:
    python = other_torch_env(tmp_path, "2.12.1+cpu")
    report, _elapsed, _ = cluster.check(f"cluster.hosts.3.python={python}")
    assert report["status"] == "fail"
    assert hosts_by_name(report)["h4"]["facts"]["torch"]["version"] == "2.12.1+cpu"
    (drift,) = [f for f in report["findings"] if f["code"] == "PF501" and f["status"] == "fail"]
    assert drift["host"] == "h4" and "h4 has 2.12.1+cpu" in drift["message"] and "other 3 have" in drift["message"]
    assert report["findings"][0] == drift  # the root cause comes first
    cluster.assert_nothing_left()


def test_one_machine_under_a_second_address_fails_its_second_listing(cluster: Cluster, tmp_path: Path) -> None:
    """h4's entry names an address h1 also holds, as a hostfile that lists one machine by its name and by its IP: the
    addresses differ, so the config is valid, and every stage would check h1 twice. Before PF506 the check passed."""
    h1 = cluster.sandbox.host("h1")
    alias = str(ipaddress.ip_address(h1.address) + 189)  # the sandbox's /24 numbers its hosts from .11
    known = tmp_path / "known_hosts"  # strict host keys still: h1's key under its second address too
    known.write_text(cluster.sandbox.known_hosts.read_text().replace(f"{h1.address},", f"{h1.address},{alias},", 1))
    ip_batch([f"addr add {alias}/24 dev {h1.ifname}"], netns=h1.netns)
    try:
        report, _elapsed, _ = cluster.check(f"cluster.hosts.3.address={alias}", f"ssh.known_hosts={known}")
    finally:
        ip_batch([f"addr del {alias}/24 dev {h1.ifname}"], netns=h1.netns)
    assert report["status"] == "fail"
    assert hosts_by_name(report)["h4"]["facts"]["host"]["hostname"] == "h1"
    (twice,) = [f for f in report["findings"] if f["code"] == "PF506"]
    assert (twice["status"], twice["host"]) == ("fail", "h4")
    assert twice["message"].startswith(f"h4 ({alias}) is the machine h1 is: both answer with {h1.ifname} ")
    assert f"{h1.address}/24, {alias}/24" in twice["message"]
    assert [h["status"] for h in report["hosts"]] == ["pass", "pass", "pass", "fail"]
    cluster.assert_nothing_left()


def test_host_quirks_are_caught_over_ssh(sandbox_factory: Any, tmp_path: Path) -> None:
    """Interface drift, Docker's 64 MiB /dev/shm and a hostname mapped to loopback, each on its own host; a hostname its
    own /etc/hosts maps to an address no host has (a cloned image's stale entry), on a host whose sshd (and so every
    session) has systemd's default open-file limit of 1024. h1's ~/.bashrc prints a welcome line before every command's
    output: it is read all the same (before, its probe's JSON came after the line and h1 was unknown, PF002). h2's /tmp
    is a 64 MiB filesystem of its own, too small for torch.compile's cache."""
    small_tmp = (HostMount("/tmp", "tmpfs", size_bytes=64 << 20),)
    sandbox = sandbox_factory(4, quirks={1: HostQuirks(login_banner="Welcome to h1 {managed by ops}"),
                                         2: HostQuirks(ifname="ens5", mounts=small_tmp),
                                         3: HostQuirks(shm_bytes=64 << 20, own_name="loopback"),
                                         4: HostQuirks(own_name="foreign", nofile=1024)})
    cluster = Cluster(sandbox, tmp_path, "quirks")
    report, _elapsed, _ = cluster.check("network.socket_ifname=eth0", "cluster.hosts.1.interface=auto")
    findings = {(f["code"], f["host"]): f for f in report["findings"]}
    assert report["status"] == "fail"
    assert findings[("PF303", "h2")]["status"] == "fail" and "eth0 does not exist" in findings[("PF303", "h2")]["message"]
    assert "ens5" in findings[("PF303", "h2")]["message"]
    assert findings[("PF203", "h3")]["message"] == "/dev/shm 64MiB < 1GiB" and findings[("PF203", "h3")]["status"] == "fail"
    assert findings[("PF301", "h3")]["status"] == "warn" and "127.0.0.1" in findings[("PF301", "h3")]["message"]
    stale = findings[("PF309", "h4")]
    assert stale["status"] == "warn" and f"resolves to {foreign_address(sandbox.index)}, an address of no interface" in stale["message"]
    assert {host for code, host in findings if code == "PF309"} == {"h4"}
    low = findings[("PF208", "h4")]
    assert low["status"] == "warn" and low["message"].startswith("open-file limit 1024, under 4096"), low
    assert {(h, findings[("PF208", h)]["status"]) for h in ("h1", "h2", "h3")} == {("h1", "pass"), ("h2", "pass"), ("h3", "pass")}
    assert findings[("PF208", "h1")]["message"] == f"open-file limit {soft_nofile(65536)} (at least 4096)"
    small = findings[("PF209", "h2")]
    assert small["status"] == "fail" and small["message"].startswith("/tmp: ") and small["message"].endswith(
        " free of 64MiB, under 1GiB (thresholds.tmp_min_free_bytes)"), small
    assert {(h, findings[("PF209", h)]["status"]) for h in ("h1", "h3", "h4")} == {("h1", "pass"), ("h3", "pass"), ("h4", "pass")}
    assert findings[("PF303", "h1")]["status"] == "pass" and findings[("PF203", "h1")]["status"] == "pass"
    assert hosts_by_name(report)["h1"]["status"] == "pass" and hosts_by_name(report)["h1"]["facts"]["host"]["hostname"] == "h1"
    banner = subprocess.run(sandbox.ssh_argv("h1", "true"), capture_output=True, text=True, timeout=30, check=True)
    assert banner.stdout == "Welcome to h1 {managed by ops}\n"  # the quirk is there: what any ssh command gets first
    cluster.assert_nothing_left()


@pytest.mark.this_machine  # the default sandbox `pf` (conftest.py)
def test_sandbox_cli_up_check_down(tmp_path: Path) -> None:
    """The user's path: `preflight sandbox up 4 && preflight check cluster=sandbox playbook=facts`, then down."""
    lock = claim_lock("pf")  # the CLI's sandbox has one fixed name per machine
    if lock is None:
        skip_or_fail("another test session on this machine is testing `preflight sandbox up`")
    if leftovers():
        lock.close()
        skip_or_fail(LEFT_UP)
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["preflight", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180, check=False)

    up = run("sandbox", "up", "4")
    if up.returncode == 2 and "is not installed (Debian" in up.stderr:  # no `ip` or sshd here (the GPU host has neither)
        lock.close()
        skip_or_fail(up.stderr.strip())
    try:
        assert up.returncode == 0, up.stderr
        assert (tmp_path / "config" / "preflight" / "cluster" / "sandbox.yaml").exists()
        check = run("check", "cluster=sandbox", "playbook=facts", "--json")
        report = json.loads(check.stdout)
        assert check.returncode == 0 and report["status"] == "pass", check.stdout[-2000:]
        assert len(report["hosts"]) == 4
    finally:
        down = run("sandbox", "down")
        lock.close()
    assert down.returncode == 0, down.stderr
    assert leftovers() == []
    assert not (tmp_path / "config" / "preflight" / "cluster" / "sandbox.yaml").exists()
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    assert "pf-" not in namespaces and "pf-" not in links
    assert subprocess.run(["pgrep", "-f", "/run/preflight-sandbox/pf/"], capture_output=True, check=False).returncode == 1
