"""Slow hosts and links: the robust statistics, the pairing rounds over a stand-in runner, each host's sweep figure,
and the pairwise stage's rendering in the report."""

from __future__ import annotations

import contextlib
import io
import random
import re
import threading
from itertools import islice
from pathlib import Path
from typing import Any

import pytest

from preflight.collective.bandwidth import host_spreads
from preflight.collective.host.plans import pair_round_phases
from preflight.collective.pairwise import (
    IN_LAUNCH_ROUNDS,
    Measured,
    circle_rounds,
    in_launch_plan,
    localize,
    pairwise_findings,
)
from preflight.collective.run import configured_sweep
from preflight.findings import CLUSTER, Status
from preflight.sandbox.cgroups import group_path, groups_of
from preflight.spec import Backend, CollectiveConfig, PlaybookConfig, PreflightConfig
from preflight.spread import median, outliers

K, FRACTION = 4.0, 0.5


def test_median_and_mad_ignore_one_slow_figure() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([4.0, 1.0, 2.0, 3.0]) == 2.5
    with pytest.raises(ValueError):
        median([])
    figures = {f"h{k}": v for k, v in enumerate([10.0, 10.2, 9.9, 10.1, 9.8, 10.0, 10.3, 1.0], start=1)}
    found = outliers(figures, K, FRACTION)
    assert found.median == 10.0 and found.mad_log == pytest.approx(0.0149, abs=1e-4)  # within 1.5% of the median
    assert found.threshold == pytest.approx(5.0)  # median * e^(-4 * 0.015) is 9.4: the fraction is the stricter rule here
    assert found.outliers == ["h8"]
    assert found.summary() == {"count": 8, "median_GBps": 10.0, "mad_log": 0.014926, "threshold_GBps": 5.0}


def test_one_host_at_a_tenth_stands_out_of_a_noisy_set() -> None:
    """Two healthy hosts at 0.15 and 0.25 GB/s (a loaded machine) and one at 0.015: on the linear scale the MAD (0.05)
    would put median - 4 * MAD below zero and name nobody; on the logarithmic scale the slow one is named."""
    found = outliers({"h1": 0.25, "h2": 0.015, "h3": 0.15, "h4": 0.25}, K, FRACTION)
    assert found.outliers == ["h2"] and found.threshold == pytest.approx(0.072)


def test_a_noisy_healthy_set_and_a_tight_one_name_nobody() -> None:
    # A loaded machine: figures spread from 0.33 to 1.0. The fraction alone would name 0.33; the MAD keeps it.
    noisy = {f"p{k}": v for k, v in enumerate([1.0, 0.5, 0.33, 0.8, 0.45, 0.95, 0.7])}
    found = outliers(noisy, K, FRACTION)
    assert found.outliers == [] and found.threshold == pytest.approx(0.182, abs=1e-3)  # the fraction alone: 0.35
    # A tight set: MAD near 0, so the MAD rule names the figure 3% off; the fraction does not.
    tight = {"a": 10.0, "b": 10.0, "c": 10.0, "d": 9.7}
    assert outliers(tight, K, FRACTION).outliers == []


def test_two_figures_name_no_outlier() -> None:
    found = outliers({"a": 10.0, "b": 0.1}, K, FRACTION)
    assert found.threshold is None and found.outliers == [] and not found.below(0.0)
    assert outliers({}, K, FRACTION).summary() == {"count": 0, "median_GBps": None, "mad_log": None, "threshold_GBps": None}


@pytest.mark.parametrize("n", range(2, 13))
def test_circle_rounds_are_disjoint_and_meet_new_partners(n: int) -> None:
    hosts = [f"h{k}" for k in range(1, n + 1)]
    rounds = list(circle_rounds(hosts))
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    assert rounds[0][:2] == [("h1", "h2"), ("h3", "h4")][:n // 2]  # round 1 pairs neighbours
    seen: set[frozenset[str]] = set()
    for pairs in rounds:
        members = [h for pair in pairs for h in pair]
        assert len(members) == len(set(members)) == 2 * (n // 2)  # disjoint; an odd host out sits the round out
        assert all(hosts.index(a) < hosts.index(b) for a, b in pairs)  # the pair's master is the one first in the cluster
        seen |= {frozenset(pair) for pair in pairs}
    assert len(seen) == n * (n - 1) // 2  # a whole round-robin: every pair once
    if 3 <= n < 6:
        wanted = {4: 2}.get(n, 3)
        partners = {h: {p for pairs in islice(circle_rounds(hosts), wanted) for pair in pairs if h in pair for p in pair if p != h}
                    for h in hosts}
        assert all(len(p) >= 2 for p in partners.values()), partners


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 9, 16])
def test_the_pair_rounds_of_a_launch_time_each_pair_both_ways_one_way_at_a_time(n: int) -> None:
    """The worker's phases for the rounds the full set's launch measures: per round, its pairs one way at once, then the
    other way at once; no host in two links of a phase."""
    rounds = [[(int(a[1:]) - 1, int(b[1:]) - 1) for a, b in pairs] for pairs in islice(circle_rounds(_hosts(n)), IN_LAUNCH_ROUNDS)]
    phases = pair_round_phases(rounds)
    assert len(phases) == 2 * len(rounds) == 2 * min(IN_LAUNCH_ROUNDS, n - 1 if n % 2 == 0 else n)
    for number, pairs in enumerate(rounds):
        forward, backward = phases[2 * number], phases[2 * number + 1]
        assert forward == pairs and backward == [(b, a) for a, b in pairs]
    for phase in phases:
        members = [h for link in phase for h in link]
        assert len(members) == len(set(members))


@pytest.mark.parametrize(("n", "stages", "neighbour_s", "rounds"), [
    (6, ["collective", "sweep", "pairwise"], 0.15, 5), (4, ["collective", "pairwise"], 0.15, 3),
    (9, ["collective", "sweep", "pairwise"], 0.15, 5), (6, ["collective", "sweep"], 0.15, 0),
    (6, ["collective", "pairwise"], 0.0, 0)])
def test_the_full_set_s_launch_carries_the_pair_rounds_with_the_pairwise_stage(n: int, stages: list[str], neighbour_s: float,
                                                                               rounds: int) -> None:
    """The first rounds of the round-robin, at most IN_LAUNCH_ROUNDS, ride on the configured sweep's plan (or on one
    without sizes); without the pairwise stage, or with no neighbour test's budget, the plan is the sweep's as it was."""
    config = PreflightConfig(playbook=PlaybookConfig(name="test", stages=stages), collective=CollectiveConfig(neighbour_time_s=neighbour_s))
    sweep = configured_sweep(config, Backend.gloo) if "sweep" in stages else None
    plan = in_launch_plan(config, Backend.gloo, _hosts(n), sweep)
    if not rounds:
        assert plan == sweep
        return
    assert plan is not None and plan.pair_rounds == list(islice(circle_rounds(_hosts(n)), rounds))
    assert plan.judges_speed == ("sweep" in stages) and bool(plan.sizes) == ("sweep" in stages)


def test_a_long_round_robin_shows_its_outliers_and_the_pairs_measured_again() -> None:
    """8 hosts, 5 rounds in the launch (20 pairs, more than the table shows whole), h1-h2 measured once more in round 6:
    the terminal shows the outlier and both runs of h1-h2, not the pairs of rounds 2 to 5 that are neither."""
    from rich.console import Console
    from test_history import report_of, section

    from preflight.report import render

    current = section(hosts=_hosts(8))
    pairs = [{"hosts": list(pair), "round": number, "status": "pass", "busbw_GBps": 1.0, "outlier": pair == ("h3", "h6"), "message": ""}
             for number, round_pairs in enumerate(islice(circle_rounds(_hosts(8)), IN_LAUNCH_ROUNDS), start=1) for pair in round_pairs]
    pairs.append({**pairs[0], "round": 6})
    current["pairwise"].update(op="sendrecv", bytes=1 << 20, rounds=6, pairs=pairs)  # type: ignore[union-attr, typeddict-item]
    out = io.StringIO()
    Console(file=out, width=200).print(render(report_of(current, 0)))
    shown = [row.groups() for row in (re.match(r"\s*(h\d+-h\d+)\W+(\d+)", line) for line in out.getvalue().splitlines()) if row]
    outlier = next(str(p["round"]) for p in pairs if p["outlier"])
    assert len(pairs) == 21 and shown == [("h1-h2", "1"), ("h3-h6", outlier), ("h1-h2", "6")], out.getvalue()


class StandIn:
    """Pairs at ~1 GB/s with 10% noise; a slow host's pairs at 0.02, a slow link at 0.05 (or once only), a broken host's
    pairs hang."""

    def __init__(self, slow_hosts: frozenset[str] = frozenset(), slow_links: frozenset[frozenset[str]] = frozenset(),
                 broken: frozenset[str] = frozenset(), slow_once: frozenset[frozenset[str]] = frozenset(), seed: int = 7) -> None:
        self.slow_hosts, self.slow_links, self.broken, self.slow_once = slow_hosts, slow_links, broken, set(slow_once)
        self.rounds: list[list[tuple[str, str]]] = []
        self.random = random.Random(seed)

    def __call__(self, pairs: list[tuple[str, str]]) -> list[Measured]:
        self.rounds.append(pairs)
        out: list[Measured] = []
        for pair in pairs:
            if set(pair) & self.broken:
                out.append(("hang", 0.0, "HANG in sweep"))
            elif set(pair) & self.slow_hosts:
                out.append(("pass", 0.02 * self.random.uniform(0.9, 1.1), ""))
            elif frozenset(pair) in self.slow_links:
                out.append(("pass", 0.05, ""))
            elif frozenset(pair) in self.slow_once:
                self.slow_once.discard(frozenset(pair))
                out.append(("pass", 0.05, ""))
            else:
                out.append(("pass", self.random.uniform(0.9, 1.1), ""))
        return out


def _hosts(n: int) -> list[str]:
    return [f"h{k}" for k in range(1, n + 1)]


@pytest.mark.parametrize("n", [3, 4, 5, 6, 7, 8, 9, 16, 64, 240])
def test_a_slow_host_is_named_in_at_most_three_rounds(n: int) -> None:
    slow = f"h{n // 2 + 1}"
    runner = StandIn(slow_hosts=frozenset({slow}))
    found = localize(_hosts(n), runner, K, FRACTION)
    assert found.slow_hosts == [slow] and found.slow_links == []
    assert found.rounds == len(runner.rounds) <= 3
    if n >= 6:
        assert found.mode == "re-pair" and found.rounds == 2
        assert len(runner.rounds[0]) == n // 2  # N/2 pairs at once
        assert len(runner.rounds[1]) <= 3  # only the suspects (and an odd host out) again
    findings = pairwise_findings(found, 1 << 20)
    (named,) = findings
    assert (named.code, named.status, named.host) == ("PF607", Status.fail, slow)
    assert "slow with every partner at 1,048,576 B: its best pair 0.0" in named.message
    assert "the median of the hosts' best pairs" in named.message


@pytest.mark.parametrize("n", [3, 4, 5, 6, 8, 11, 32])
def test_a_slow_link_is_named_and_neither_host_is(n: int) -> None:
    link = frozenset({"h1", "h2"})  # neighbours: paired in round 1 whatever n
    runner = StandIn(slow_links=frozenset({link}))
    found = localize(_hosts(n), runner, K, FRACTION)
    assert found.slow_hosts == []
    assert [set(p.hosts) for p in found.slow_links] == [set(link)]
    # Round 1, the suspects with good partners (or the round-robin), then the link once more to confirm it.
    assert found.rounds == {3: 4, 4: 3, 5: 4}.get(n, 3) and runner.rounds[-1] == [("h1", "h2")]
    (named,) = pairwise_findings(found, 4096)
    assert (named.code, named.status, named.host) == ("PF608", Status.fail, CLUSTER)
    assert named.message.startswith("the link h1-h2 is slow at 4,096 B: h1-h2 0.05 GB/s (round 1), "
                                    f"h1-h2 0.05 GB/s (round {found.rounds}); the pairs' median")
    assert "each host is fast with other partners (h1 " in named.message
    # On gloo, beside h2 named slow at compute (PF622): a warning that says its CPU is the likely cause.
    (starved,) = pairwise_findings(found, 4096, cpu_bound=["h2"])
    assert (starved.code, starved.status) == ("PF608", Status.warn)
    assert starved.message.endswith("h2 is slow at compute or start-up (PF622, PF623): likely its CPU, not the link")


@pytest.mark.parametrize("n", [4, 8])
def test_a_pair_slow_once_is_noise_not_a_link(n: int) -> None:
    """Another pair's start-up on a shared machine, another job's burst: slow once, measured again it is not."""
    runner = StandIn(slow_once=frozenset({frozenset({"h3", "h4"})}))
    found = localize(_hosts(n), runner, K, FRACTION)
    assert found.slow_hosts == [] and found.slow_links == [] and [p.hosts for p in found.transient] == [("h3", "h4")]
    (passed,) = pairwise_findings(found, 4096)
    assert passed.status == Status.passed and "slow once, not again (noise): h3-h4" in passed.message


@pytest.mark.parametrize("n", [2, 4, 8, 9])
def test_a_healthy_cluster_takes_one_round_from_six_hosts(n: int) -> None:
    runner = StandIn()
    found = localize(_hosts(n), runner, K, FRACTION)
    assert found.slow_hosts == [] and found.slow_links == []
    (passed,) = pairwise_findings(found, 4096)
    assert passed.status == Status.passed and passed.host == CLUSTER
    if n == 8:
        assert found.rounds == 1 and "no slow host or link" in passed.message
    if n == 9:
        assert found.rounds == 2 and len(runner.rounds[1]) == 1  # the odd host out, with a known-good partner
    if n == 2:
        assert found.rounds == 1 and "too few pairs to name a slow one" in passed.message


def test_an_unsuspected_pair_at_half_the_best_is_not_named() -> None:
    """bench/pairwise.py's run that named h7 and h8 beside h6: round 1's h7-h8 at 0.13 GB/s (four pairs of launches on
    two cores) is above the pairs' threshold, so neither is a suspect; the re-paired hosts' best pairs (0.28) must not
    make the hosts' median a yardstick that h7-h8's single run falls under."""
    rounds: list[list[tuple[str, str]]] = []

    def measure(pairs: list[tuple[str, str]]) -> list[Measured]:
        rounds.append(pairs)
        return [("pass", 0.0015 if "h6" in pair else 0.13 if pair == ("h7", "h8") else 0.28, "") for pair in pairs]

    found = localize(_hosts(8), measure, K, FRACTION)
    assert found.slow_hosts == ["h6"] and found.slow_links == [], (rounds, found.best)
    assert found.rounds == 2 and found.best["h7"] == 0.13 and found.host_stats.below(0.13)  # the old yardstick would name it


def test_two_slow_hosts_paired_together_are_both_named() -> None:
    found = localize(_hosts(8), StandIn(slow_hosts=frozenset({"h3", "h4"})), K, FRACTION)
    assert found.slow_hosts == ["h3", "h4"] and found.rounds == 2


def test_a_host_whose_pairs_hang_counts_as_zero_and_is_named() -> None:
    found = localize(_hosts(8), StandIn(broken=frozenset({"h5"})), K, FRACTION)
    assert found.slow_hosts == ["h5"] and found.best["h5"] == 0.0
    (named,) = pairwise_findings(found, 4096)
    assert "with h6 hang (HANG in sweep) (round 1)" in named.message


def _result(host: str, rank: int, rows: list[tuple[str, int, float, float]]) -> dict[str, Any]:
    return {"host": host, "rank": rank, "sweep": [{"op": op, "bytes": size, "time_us": t, "algbw_GBps": bw, "busbw_GBps": bw}
                                                  for op, size, t, bw in rows]}


def test_each_host_s_sweep_figure_is_its_slowest_rank_at_the_largest_size() -> None:
    results = []
    for k, host in enumerate(_hosts(5)):
        bw = 0.1 if host == "h4" else 1.0 + k / 100
        for local in range(2):
            slower = 0.9 if local else 1.0
            results.append(_result(host, 2 * k + local, [("all_reduce", 1 << 20, 50.0, 2.0),
                                                          ("all_reduce", 1 << 22, 4000 / (bw * slower), bw * slower)]))
    (spread,) = host_spreads(results, K, FRACTION)  # type: ignore[arg-type]
    assert (spread["op"], spread["bytes"]) == ("all_reduce", 1 << 22)
    figures = {f["host"]: f for f in spread["hosts"]}
    assert figures["h1"]["busbw_GBps"] == 0.9 and figures["h1"]["ranks"] == 2
    assert figures["h4"]["outlier"] and not figures["h1"]["outlier"]
    assert figures["h4"]["time_us"] == pytest.approx(4000 / 0.09, rel=1e-6)


# --- on the namespace cluster: real torchrun pairs, real faults --------------------------------------------------------

# As tests/test_collective.py's FAST, with the pairwise playbook's own stages and a sweep that stops at 256 KiB (a 64 MiB
# all_gather through a 20 Mbit/s link takes minutes). The stage's rounds are measured in the full set's launch; a pair
# measured once more takes a launch of its own, which starts torchrun's agent and a rank on each of its hosts (about 5 s
# of torch import per host on this machine).
PAIRWISE = ["collective.verify_bytes=65536", "collective.rendezvous_timeout_s=20", "collective.init_timeout_s=20",
            "collective.identity_timeout_s=20", "collective.verify_timeout_s=30", "collective.sweep_timeout_s=60",
            "collective.finish_timeout_s=20", "ssh.command_timeout_s=30", "collective.sweep_max_bytes=262144"]


@pytest.fixture(scope="module")
def cluster4(sandbox_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from test_cluster import Cluster

    return Cluster(sandbox_factory(4), tmp_path_factory.mktemp("pairwise4"), "pair4")


def _shown(pairwise: dict[str, Any]) -> str:
    """The pairs and hosts in one line, for a failing assertion."""
    pairs = ", ".join(f"{'-'.join(p['hosts'])} r{p['round']} {p['busbw_GBps']:.4f}" for p in pairwise["pairs"])
    return f"{pairs}; hosts {pairwise['host_spread']}; pairs {pairwise['pair_spread']}"


def _named(report: dict[str, Any]) -> str:
    """The collective's findings that name a host or link, for the test's output."""
    return "; ".join(f"{f['code']} {f['status']} {f['host']}: {f['message']}" for f in report["findings"]
                     if f["code"].startswith("PF6") and f["status"] in ("fail", "warn"))


def _pairwise(report: dict[str, Any]) -> dict[str, Any]:
    """The pairwise section, measured in the full set's launch and judged with the rest of it once: its slow hosts and
    links are the speed section's, so the two parts of the report never contradict each other."""
    collective = report["collective"]
    assert collective["status"] == "pass", (collective["message"], collective["isolation"])
    pairwise: dict[str, Any] = collective["pairwise"]
    assert pairwise["op"] == "sendrecv" and pairwise["mode"] == "round-robin", _shown(pairwise)
    speed = collective["speed"]
    assert (speed["slow_hosts"], speed["slow_links"]) == (pairwise["slow_hosts"], pairwise["slow_links"]), \
        (speed["message"], _shown(pairwise))
    assert not any(f["code"] in ("PF620", "PF621") and f["status"] != "pass" for f in report["findings"])  # reported as PF607, PF608
    return pairwise


@pytest.mark.sandbox
def test_rate_limited_host_is_named_with_its_bandwidth(cluster4: Any) -> None:
    """h3's link limited to 20 Mbit/s both ways (tbf on its veth): every pair with h3 is slow, h3 is named."""
    try:
        cluster4.sandbox.rate_limit("h3")
        report, elapsed, _ = cluster4.check(*PAIRWISE, playbook="pairwise", timeout=240)
    finally:
        cluster4.sandbox.heal("h3")
    pairwise = _pairwise(report)
    assert report["status"] == "fail"
    assert pairwise["slow_hosts"] == ["h3"] and pairwise["slow_links"] == [], _shown(pairwise)
    assert pairwise["rounds"] == 3  # a whole round-robin in the launch
    hosts = {h["host"]: h for h in pairwise["hosts"]}
    assert hosts["h3"]["verdict"] == "slow" and hosts["h3"]["best_GBps"] < 0.0025  # 20 Mbit/s is 0.0025 GB/s
    (named,) = [f for f in report["findings"] if f["code"] == "PF607" and f["status"] != "pass"]
    assert (named["status"], named["host"]) == ("fail", "h3")
    assert named["message"].startswith("slow network: sends at 0.00") and "under 0.5x in each of 3 repeats" in named["message"]
    print(f"\nrate-limited h3 of 4, playbook=pairwise: {elapsed:.1f} s wall, {pairwise['rounds']} round(s); {_named(report)}")
    assert "tbf" not in cluster4.sandbox.run_in("h3", ["tc", "qdisc", "show"]).stdout  # healed
    cluster4.assert_nothing_left()


def _run_folders(sandbox: Any, host: str) -> set[Path]:
    """The run folders of this sandbox's host, from the command lines of the processes in its CPU cgroup: every process
    of the host, and none of another work unit's host of the same name (their folders share this machine's /tmp)."""
    try:
        pids = (group_path(sandbox.host(host).netns) / "cgroup.procs").read_text().split()
    except OSError:
        return set()
    folders = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for arg in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                found = re.search(rf"/tmp/preflight-[^/]*-{re.escape(host)}-[^/]*", arg.decode(errors="replace"))
                if found:
                    folders.add(Path(found.group(0)))
    return folders


def _throttle_when_measuring(sandbox: Any, host: str, percent: float, stop: threading.Event, throttled: list[str]) -> None:
    """Hold host's CPU cgroup at percent of one CPU while a rank of it runs with torch loaded (its phase, as its host's
    supervisor keeps it in the run's folder, is identity, verify, compute, neighbours or sweep), and without a quota otherwise, launch after
    launch, until stop: a host whose CPUs throttle under load. Throttled from its start, each rank would spend most of a
    minute importing torch (2.7 s of CPU) at 3%."""
    limited = False
    while not stop.is_set():
        phases = set()
        for folder in _run_folders(sandbox, host):
            with contextlib.suppress(OSError):
                phases.add((folder / "status").read_text().strip())
        measuring = bool(phases & {"identity", "verify", "compute", "neighbours", "sweep"})
        if measuring != limited:
            sandbox.set_cpu_quota(host, percent if measuring else None)
            limited = measuring
            if measuring:
                throttled.append(host)
        stop.wait(0.01)


@pytest.mark.sandbox
def test_cpu_throttled_host_is_named(cluster4: Any) -> None:
    """h2's processes (its sshd and all it starts) in a CPU cgroup held at 3% of one CPU while its ranks measure: h2 is
    named for its CPU (PF622, the launch's compute probe, with its cgroup's throttled time), and never as a slow network
    or a slow link: on gloo the CPU moves every byte, and the one judgement puts h2's slow pairs down to it."""
    stop, throttled = threading.Event(), []
    cluster4.sandbox.throttle_cpu("h2", None)
    watcher = threading.Thread(target=_throttle_when_measuring, args=(cluster4.sandbox, "h2", 3.0, stop, throttled), daemon=True)
    watcher.start()
    try:
        report, elapsed, _ = cluster4.check(*PAIRWISE, playbook="pairwise", timeout=240)
    finally:
        stop.set()
        watcher.join(timeout=5)
        cluster4.sandbox.heal("h2")
    assert not groups_of(cluster4.sandbox.prefix)  # healed: the cgroup is gone
    pairwise = _pairwise(report)
    assert throttled, "h2 was never throttled"
    named: dict[str, list[str]] = {}
    for f in report["findings"]:
        if f["status"] in ("fail", "warn"):
            named.setdefault(f["code"], []).append(f["host"])
    assert named.get("PF622") == ["h2"] and "h2" not in named.get("PF620", []), _named(report)
    # Its quota, proven by its cgroup, explains every slow pair of h2's: no slow host, no slow link.
    assert pairwise["slow_hosts"] == [] and pairwise["slow_links"] == [], _shown(pairwise)
    assert {h["name"] for h in report["hosts"] if h["status"] == "fail"} == {"h2"}, _named(report)
    # On gloo the CPU moves every byte: h2's slow pairs are put down to its CPU (PF622), never named a slow network.
    assert not [f for f in report["findings"] if f["code"] == "PF607" and f["status"] != "pass"], _named(report)
    print(f"\nCPU-throttled h2 of 4, playbook=pairwise: {elapsed:.1f} s wall, {pairwise['rounds']} round(s); {_named(report)}")
    cluster4.assert_nothing_left()
