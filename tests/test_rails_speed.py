"""The bandwidth test rail by rail (#38, item 3) on a namespace cluster whose hosts have two rails, each rail a bridge
and a /24 of its own: local rank r of every host is bound to rail r (preflight/rail_env.py), the neighbour test's links
of rail r are judged against rail r's median, and a slow rail is named as (host, rail, interface)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from test_cluster import Cluster
from test_speed import FAST


@pytest.fixture(scope="module")
def rails4(sandbox_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    return Cluster(sandbox_factory(4, rails=2), tmp_path_factory.mktemp("railspeed"), "railspeed")


def default_check(cluster: Cluster, what: str) -> dict[str, Any]:
    began = time.monotonic()
    report, _, _ = cluster.check(*FAST, playbook="full", timeout=300)
    speed = report["collective"]["speed"]
    rails = [(r["rail"], r["median_GBps"], [(h["host"], h["ratio"], h["verdict"]) for h in r["hosts"]]) for r in speed.get("rails", [])]
    print(f"\n{what}: default check {time.monotonic() - began:.1f} s, {report['status']}; {speed['message']}; rails {rails}")
    return report


def named(report: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    return [(f["code"], f["status"], f["host"], f["message"]) for f in report["findings"]
            if f["code"] in ("PF607", "PF608", "PF620", "PF621") and f["status"] in ("warn", "fail")]


@pytest.mark.sandbox
def test_two_rail_hosts_pass_with_one_rank_per_rail_each_rail_judged_on_its_own(rails4: Cluster) -> None:
    report = default_check(rails4, "healthy 4 hosts x 2 rails")
    collective = report["collective"]
    assert collective["status"] == "pass" and collective["nproc_per_node"] == 2, collective["message"]
    assert {h["name"]: h["status"] for h in report["hosts"]} == dict.fromkeys(("h1", "h2", "h3", "h4"), "pass"), named(report)
    rails = collective["speed"]["rails"]
    assert [r["rail"] for r in rails] == [0, 1]
    for r in rails:
        assert [(h["host"], h["interface"]) for h in r["hosts"]] == [(f"h{k}", f"eth{r['rail'] + 1}") for k in range(1, 5)]
        assert r["median_GBps"] and r["slow_hosts"] == []
    # Every link of the ring on both rails: rank r sent on rail r only.
    assert {(link["src"], link["dst"]) for link in collective["speed"]["links"]} >= {("h1", "h2"), ("h2", "h3"), ("h3", "h4"), ("h4", "h1")}


@pytest.mark.sandbox
def test_one_host_s_rail_1_rate_limited_is_named_on_that_rail_and_no_other(rails4: Cluster) -> None:
    """h3's eth2 (rail 1) held to 100 Mbit/s both ways by tbf (about a twentieth of a healthy rail here, a strong fault on
    this loaded 2-core machine): named on rail 1 with its interface, against rail 1's median and beside its rail 0."""
    try:
        rails4.sandbox.rate_limit("h3", rate="100mbit", rail=1)
        report = default_check(rails4, "h3 rail 1 at 100 Mbit/s")
    finally:
        rails4.sandbox.heal("h3")
    found = named(report)
    assert [(code, host) for code, _, host, _ in found] == [("PF620", "h3")], found
    (_, status, _, message) = found[0]
    assert status == "fail" and message.startswith("rail 1 (eth2): slow network: "), message
    assert "against rail 1's median" in message and "its other rails: rail 0 (eth1) at" in message, message
    assert {h["name"] for h in report["hosts"] if h["status"] == "fail"} == {"h3"}
    rails = {r["rail"]: r for r in report["collective"]["speed"]["rails"]}
    assert rails[1]["slow_hosts"] == ["h3"] and rails[0]["slow_hosts"] == [] and rails[1]["slow_links"] == []
    rails4.assert_nothing_left()
