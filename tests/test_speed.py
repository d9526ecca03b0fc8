"""A PASS that means the job will run at full speed: the neighbour test, the compute probe and each host's start-up,
judged on recorded-shape figures, and the default check naming a rate-limited host (slow network) and a CPU-throttled
host (slow compute) on the namespace cluster, with no healthy host failed."""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from preflight.collective.bandwidth import bandwidth_findings
from preflight.collective.contracts import SweepRow
from preflight.collective.host.plans import NEIGHBOUR_MAX_MESSAGES, neighbour_phases, next_chunk
from preflight.collective.speed_report import judged_against
from preflight.collective.speed_report import section as speed_section
from preflight.findings import Status
from preflight.hostlib.cgroup import cgroup_throttled_s
from preflight.spec import Backend, BandwidthProfile


@pytest.mark.parametrize("count", range(1, 10))
def test_neighbour_phases_never_share_a_host_and_give_each_host_two_partners(count: int) -> None:
    phases = neighbour_phases(count)
    links = [link for phase in phases for link in phase]
    assert len(links) == len(set(links))
    for phase in phases:
        used = [host for link in phase for host in link]
        assert len(used) == len(set(used))  # a host in one link of a phase at most
    for host in range(count if count > 1 else 0):
        partners = {b for a, b in links if a == host} | {a for a, b in links if b == host}
        assert len(partners) >= min(2, count - 1)
    if count >= 2:
        assert phases[0][0] == (0, 1)  # the ring first: even to odd
    if count % 2 == 0:
        # An even ring takes two phases, even to odd then odd to even, as NCCL's ring diagnostics.
        assert phases[0] == [(i, i + 1) for i in range(0, count, 2)]
        assert phases[1] == [(i, (i + 1) % count) for i in range(1, count, 2)]


def _send_for(budget_s: float, message_s: list[float], steady_s: float) -> tuple[int, float]:
    """A link of the neighbour test driven by next_chunk: each message takes the next of message_s, then steady_s each;
    the messages sent and their seconds."""
    sent, elapsed = 0, 0.0
    while chunk := next_chunk(budget_s, elapsed, sent):
        for k in range(sent, sent + chunk):
            elapsed += message_s[k] if k < len(message_s) else steady_s
        sent += chunk
    return sent, elapsed


@pytest.mark.parametrize(("message_s", "steady_s"), [
    ([], 0.002),  # a steady link
    ([0.0002, 0.0004], 0.004),  # its first messages timed ten times too fast: a socket buffer took them whole
    ([0.0001] * 20, 0.01),  # fast for a while, then slow
])
def test_a_neighbour_link_sends_for_about_its_budget_whatever_its_first_messages_took(message_s: list[float], steady_s: float) -> None:
    # The old count, decided from the first message alone, sent for five times the budget on a loaded gloo host.
    sent, elapsed = _send_for(0.15, message_s, steady_s)
    assert 0.15 - steady_s / 2 <= elapsed <= 0.15 * 1.5
    assert sent > 1


def test_a_link_slower_than_its_budget_sends_one_message_and_a_fast_one_stops_at_the_cap() -> None:
    assert _send_for(0.15, [], 0.4) == (1, 0.4)
    sent, elapsed = _send_for(0.15, [], 1e-6)
    assert sent == NEIGHBOUR_MAX_MESSAGES and elapsed < 0.15


def test_the_cgroup_throttled_time_is_read_from_v1_and_v2(tmp_path: Path) -> None:
    v1 = tmp_path / "cpu" / "limited"
    v1.mkdir(parents=True)
    (v1 / "cpu.stat").write_text("nr_periods 30\nnr_throttled 25\nthrottled_time 2500000000\n")
    (tmp_path / "cgroup").write_text("4:memory:/x\n1:cpu:/limited\n0::/\n")
    assert cgroup_throttled_s(str(tmp_path / "cgroup"), str(tmp_path)) == 2.5
    (tmp_path / "cpu.stat").write_text("usage_usec 10\nnr_throttled 3\nthrottled_usec 1500000\n")
    (tmp_path / "cgroup2").write_text("0::/\n")
    assert cgroup_throttled_s(str(tmp_path / "cgroup2"), str(tmp_path)) == 1.5
    assert cgroup_throttled_s(str(tmp_path / "absent"), str(tmp_path)) is None


def _row(op: str, size: int, busbw: float) -> SweepRow:
    return {"op": op, "bytes": size, "ranks": 16, "busbw_min_GBps": busbw, "busbw_mean_GBps": busbw, "algbw_mean_GBps": busbw}


H100 = BandwidthProfile(gpu_name="H100", gpus_per_host=8, min_bytes=1 << 30, all_reduce_busbw_gbps=430.0, all_gather_busbw_gbps=320.0)


def test_a_sweep_that_plateaued_before_the_profile_s_size_is_judged_at_its_largest() -> None:
    """A degraded fabric: busbw flat at 90 GB/s from 64 MiB, the adaptive sweep stopped at 256 MiB, the floor's 1 GiB never
    reached: the floor is judged there, and fails, saying so."""
    sweep = [_row(op, size << 20, rate) for op in ("all_gather", "all_reduce") for size, rate in ((64, 88.0), (128, 90.0), (256, 91.0))]
    findings = bandwidth_findings(H100, sweep, planned_max=1 << 30)
    assert [(f.code, f.status) for f in findings] == [("PF604", Status.fail), ("PF604", Status.fail)]
    stopped = "stopped at 268,435,456 B, below the profile's 1,073,741,824 B: busbw had plateaued, or one iteration"
    assert all(stopped in f.message for f in findings)


def test_a_sweep_cut_by_its_own_largest_size_below_the_profile_s_warns() -> None:
    sweep = [_row("all_reduce", 128 << 20, 300.0)]
    (finding,) = bandwidth_findings(H100, sweep, planned_max=128 << 20)
    assert finding.status == Status.warn and "busbw may still grow" in finding.message


def test_the_verdict_says_when_speed_was_not_judged_against_a_reference() -> None:
    sweep = [_row("all_reduce", 64 << 20, 0.4)]
    reference, message = judged_against(None, sweep, None, 3)
    assert reference == "none" and message.startswith("speed not judged against a reference")
    assert message.endswith("hosts and links were judged against each other only")
    # One host has no other to be judged against: the line said it was, on the default local cluster.
    assert judged_against(None, sweep, None, 1)[1].endswith("one host, so not judged at all")
    assert judged_against(H100, sweep, None, 3)[0] == "profile"
    history: Any = {"runs": 5, "wanted": 10, "tolerance_percent": 15.0, "message": "", "figures": [{"source": "sweep"}]}
    assert judged_against(None, sweep, history, 1) == ("history", "speed judged against this cluster's last 5 passing runs")


def test_the_terminal_and_the_page_show_each_host_s_speed_and_the_verdict_says_what_it_was_judged_against() -> None:
    from rich.console import Console
    from test_history import report_of, section
    from test_speed_judge import launch, verdicts

    from preflight.report import render, verdict_line
    from preflight.report_html import report_html

    _, found, _ = verdicts(launch(["h1", "h2", "h3"], 0.4, send={"h3": 0.01}, recv={"h3": 0.01}))
    speed = speed_section(found, Backend.gloo)
    speed["reference"], speed["reference_message"] = judged_against(None, [_row("all_reduce", 1 << 20, 0.4)], None, 3)
    collective = section()
    collective["speed"] = speed
    report = report_of(collective, 0)
    console = Console(width=200, color_system=None)
    with console.capture() as captured:
        console.print(render(report))
    text = captured.get()
    assert "speed per host" in text and "GFLOPS" in text
    assert "speed not judged against a reference" in str(verdict_line(report))
    page = report_html(report)
    assert 'id="speed"' in page and "speed not judged against a reference" in page


def test_a_one_host_check_says_no_link_was_measured_rather_than_print_an_empty_figure() -> None:
    """On a lent H200 the one-host check printed "neighbour test 0 B per message" and "median best link  GB/s"."""
    from rich.console import Console
    from test_history import report_of, section
    from test_speed_judge import launch, verdicts

    from preflight.report import render

    _, found, _ = verdicts(launch(["h1"], 0.4))
    collective = section(hosts=["h1"])
    collective["speed"] = speed_section(found, Backend.gloo)
    console = Console(width=200, color_system=None)
    with console.capture() as captured:
        console.print(render(report_of(collective, 0)))
    text = captured.get()
    assert "no neighbour test: no link between hosts" in text and "median compute" in text, text
    assert "median best link" not in text and " B per message" not in text, text
    # The summary line said "0 link figure(s), median unknown GB/s; ... no host or link far from the others" and the
    # links' rule, on the default local cluster too.
    summary = collective["speed"]["message"]
    assert summary.startswith("no neighbour test: no link between hosts; compute median "), summary
    assert summary.endswith("one host, no other to compare it with"), summary
    # Several hosts without a link figure (the neighbour test off, collective.neighbour_time_s=0) have links all the same.
    _, several, _ = verdicts(launch(["h1", "h2", "h3"], 0.4))
    several = dataclasses.replace(several, table=[])
    assert speed_section(several, Backend.gloo)["message"].startswith("no neighbour test figure in this launch; compute median ")
    collective = section(hosts=["h1", "h2", "h3"])
    collective["speed"] = speed_section(several, Backend.gloo)
    with console.capture() as captured:
        console.print(render(report_of(collective, 0)))
    assert "speed per host (no neighbour test figure, compute probe" in captured.get(), captured.get()


# --- on the namespace cluster: the default playbook, real faults ------------------------------------------------------

# Short deadlines so a fault shows in seconds; the default playbook (playbook=full) otherwise, as users run it, but for
# a compute probe of 1.5 s, not 0.3: six hosts' ranks share two cores here, and a 0.1 s slice of it is a few scheduler
# quanta of one rank, noisy enough to put a healthy host under 0.5x three times (tests/test_speed_band.py says more).
FAST = ["collective.verify_bytes=65536", "collective.rendezvous_timeout_s=30", "collective.init_timeout_s=60",
        "collective.identity_timeout_s=30", "collective.verify_timeout_s=30", "collective.sweep_timeout_s=60",
        "collective.finish_timeout_s=30", "ssh.command_timeout_s=60", "collective.compute_time_s=1.5"]


@pytest.fixture(scope="module")
def cluster6(sandbox_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from test_cluster import Cluster

    return Cluster(sandbox_factory(6), tmp_path_factory.mktemp("speed6"), "speed6")


def _named(report: dict[str, Any]) -> dict[str, list[str]]:
    named: dict[str, list[str]] = {}
    for f in report["findings"]:
        if f["status"] in ("fail", "warn"):
            named.setdefault(f["code"], []).append(f["host"])
    return named


def _failed_hosts(report: dict[str, Any]) -> set[str]:
    return {h["name"] for h in report["hosts"] if h["status"] == "fail"}


def _check(cluster: Any, what: str, terminal: bool = False) -> dict[str, Any]:
    began = time.monotonic()
    report, _, result = cluster.check(*FAST, playbook="full", timeout=300, terminal=terminal)
    if terminal:
        report["terminal"] = result.stdout
    speed = report["collective"]["speed"]
    print(f"\n{what}: default check {time.monotonic() - began:.1f} s, {report['status']}; {speed['message']}; "
          f"{speed['reference_message']}")
    return report


@pytest.mark.sandbox
def test_default_check_of_a_healthy_cluster_fails_no_host(cluster6: Any) -> None:
    """No host is failed or named slow compute. On this loaded 2-core machine a slow link (PF621) or a host slow with its
    ring partners and its re-test partner alike (PF620) may warn: CI saw the master's links starved by three test
    workers at once. A warning, never a failure: a healthy host is never failed."""
    report = _check(cluster6, "healthy 6 hosts", terminal=True)
    assert report["collective"]["status"] == "pass"
    # The terminal shows every host's speed beside the others', and its verdict line says what speed was judged against.
    # Each host a row of figures. Not "sends GB/s" whole: at the 80 columns of a check without a terminal, rich wraps a
    # header in two lines once the last column holds a warning's words (the suite's run of 2026-11-26 23:44, h1 and h6
    # warned).
    assert "speed per host" in report["terminal"], report["terminal"]
    table = report["terminal"].split("speed per host", 1)[1]
    rows = [h.name for h in cluster6.sandbox.hosts if re.search(rf"^\s*{h.name}\s*│\s*[0-9]", table, re.M)]
    assert "sends" in table and rows == [h.name for h in cluster6.sandbox.hosts], table
    verdict = " ".join(report["terminal"].split("PASS  speed6:", 1)[1].split())
    assert "speed not judged against a reference" in verdict, report["terminal"]
    assert _failed_hosts(report) == set(), _named(report)
    speed = report["collective"]["speed"]
    assert speed["slow_compute"] == [] and len(speed["links"]) >= 6  # 6: the ring; more: a re-test
    slow = [f for f in report["findings"] if f["code"] == "PF620" and f["status"] != "pass"]
    assert {f["host"] for f in slow} == set(speed["slow_hosts"]) and all(f["status"] == "warn" for f in slow), slow
    assert speed["reference"] == "none" and "not judged against a reference" in speed["reference_message"]


@pytest.mark.sandbox
def test_default_check_names_a_rate_limited_host_as_slow_network(cluster6: Any) -> None:
    """h3's link limited to 40 Mbit/s both ways (tbf on its veth and in its namespace)."""
    try:
        cluster6.sandbox.rate_limit("h3", rate="40mbit")
        report = _check(cluster6, "h3 at 40 Mbit/s")
    finally:
        cluster6.sandbox.heal("h3")
    named = _named(report)
    assert "h3" in named.get("PF620", []), named
    assert "h3" not in named.get("PF622", []) + named.get("PF623", []), named
    assert _failed_hosts(report) == {"h3"}, named
    assert {h["host"]: h["verdict"] for h in report["collective"]["speed"]["hosts"]}["h3"] == "slow network"
    cluster6.assert_nothing_left()


@pytest.fixture(scope="module")
def cluster4(sandbox_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from test_cluster import Cluster

    return Cluster(sandbox_factory(4), tmp_path_factory.mktemp("speed4"), "speed4")


@pytest.mark.sandbox
def test_default_check_names_a_cpu_throttled_host_as_slow_compute(cluster4: Any) -> None:
    """h2's processes (its sshd and all it starts) in a CPU cgroup held at 3% of one CPU while its ranks measure, on 4
    hosts. Not 15% from the start: every namespace host shares this machine's two cores with the other work on it (a
    load of 12 gives each rank about 16% of a CPU), where 15% is no slower than a healthy host's share; and throttled
    from its start, its ranks would spend most of a minute importing torch (test_pairwise's watcher, reused)."""
    from test_pairwise import _throttle_when_measuring

    stop, throttled = threading.Event(), []
    cluster4.sandbox.throttle_cpu("h2", None)
    watcher = threading.Thread(target=_throttle_when_measuring, args=(cluster4.sandbox, "h2", 3.0, stop, throttled), daemon=True)
    watcher.start()
    try:
        report = _check(cluster4, "h2 at 3% of a CPU while measuring")
    finally:
        stop.set()
        watcher.join(timeout=5)
        cluster4.sandbox.heal("h2")
    assert throttled, "h2 was never throttled"
    named = _named(report)
    assert named.get("PF622") == ["h2"], named
    assert "h2" not in named.get("PF620", []), named  # not a slow network
    assert _failed_hosts(report) == {"h2"}, named
    assert {h["host"]: h["verdict"] for h in report["collective"]["speed"]["hosts"]}.get("h2") in ("ok", "slow compute")
    cluster4.assert_nothing_left()


@pytest.mark.sandbox
def test_default_check_names_a_host_under_a_cpu_quota_from_the_start_and_leaves_it_out(cluster4: Any) -> None:
    """h2's processes at 15% of one CPU from before the check (a cgroup quota on its sshd, as a container's CPU limit):
    the probe reads the quota, PF206 names h2 before any launch, and the collective runs on the three others instead of
    waiting on h2's torch start at 15% of a CPU and then blaming its links."""
    cluster4.sandbox.throttle_cpu("h2", 15.0)
    try:
        report = _check(cluster4, "h2 at 15% of a CPU from the start")
    finally:
        cluster4.sandbox.heal("h2")
    named = _named(report)
    (quota,) = [f for f in report["findings"] if f["code"] == "PF206" and f["status"] == "fail"]
    assert quota["host"] == "h2" and "allows 0.15 CPU(s)" in quota["message"], quota
    assert _failed_hosts(report) == {"h2"}, named
    collective = report["collective"]
    assert collective["status"] == "pass", collective["message"]
    assert collective["hosts"] == ["h1", "h3", "h4"] and "3 host(s) x 1 rank(s)" in collective["message"]
    assert "h2" not in named.get("PF620", []) + named.get("PF621", []), named
    cluster4.assert_nothing_left()
    # emit-launch leaves h2 out and launches the three the collective proved.
    from test_emit_launch import emit

    document = json.loads(emit(cluster4, "launch.exclude_failed=true", "--format", "json").stdout)
    assert [h["name"] for h in document["hosts"]] == ["h1", "h3", "h4"]
    assert [(e["host"], "PF206" in e["reason"]) for e in document["excluded"]] == [("h2", True)]
