"""The band of slow hosts users meet, on the namespace cluster with the default playbook (gloo): a host at about half (0.4x) of
its peers' link speed, at about a quarter both ways, and at about a quarter sending only, on 4 and on 6 hosts. Each is
failed alone (PF620, with its sending and receiving figures), and no other host is named. And two bad NICs in one
6-host cluster, one sending and one receiving at a quarter: both are failed, each on its own way.

Every host's link is limited to the same rate (tbf, LINK), so that the links set the pace, as on a real cluster's fabric,
and not this machine's two cores, which move gloo's bytes for every host at once: unlimited, the same healthy link
varies tenfold from one second to the next while other work units run. LINK is well under what gloo moves between
two namespace hosts on a loaded machine (0.2-0.6 GB/s, about 2-5 Gbit/s). The faulted host is h3: a neighbour of the
master, neither the first nor the last of the ring."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.sandbox

LINK_MBIT = 120
# Short deadlines so a fault shows in seconds, and a sweep to 1 MiB (the sweep's sizes are no input of the speed judge,
# and at LINK its larger sizes take most of the check); the default playbook otherwise, as users run it, but for the
# neighbour test's phases: 0.6 s each, not 0.15. A healthy link's figure loses what its ranks stall for a CPU in a
# phase, while the faulted host's, paced by its tbf, does not; so the faulted host's ratio rises to the fail line (0.5)
# once a healthy rank stalls for a quarter of the phase. Under CI's load a healthy figure once fell to 0.68x (a stall
# of about 70 ms in 0.15 s) and h3's receiving at 0.4x measured over 0.5x in one repeat: the longer phase gives the
# same stall a quarter of the weight. The measurement is longer; no threshold and no fault changed.
# The compute probe likewise at 1.5 s, not 0.3: its three slices of 0.1 s gave a rank of six hosts sharing two cores a
# few scheduler quanta each (it waited for a CPU 60-85% of every slice), and the median host's slice ran 0.54x-1.81x of
# another's; CI once had h4 under 0.5x in all three, failed as slow compute (PF622). At 0.5 s a slice the same load ran
# 0.61x-1.35x (docs/benchmarks.md). A real host's idle cores give its rank the whole slice.
FAST = ["collective.verify_bytes=65536", "collective.rendezvous_timeout_s=30", "collective.init_timeout_s=60",
        "collective.identity_timeout_s=30", "collective.verify_timeout_s=30", "collective.sweep_timeout_s=60",
        "collective.finish_timeout_s=30", "ssh.command_timeout_s=60", "collective.sweep_max_bytes=1048576",
        "collective.neighbour_time_s=0.6", "collective.compute_time_s=1.5"]
# (what, direction, share of LINK): 0.4 is "about half", a fifth under the fail line (0.5): at 0.45 one repeat of one
# direction measured at 0.5x under the suite's load (a tbf burst), and the test asserts both directions fail, so the
# fault was made stronger rather than the assertion weaker. A NIC at half rate measures at the line or a little above,
# where the rule warns (tests/test_speed_judge.py).
FAULTS = [("0.4x both ways", "both", 0.4), ("0.22x both ways", "both", 0.22), ("0.22x sending only", "send", 0.22)]


@pytest.fixture(scope="module")
def clusters(sandbox_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, Any]]:
    """A 4-host and a 6-host cluster, built when first asked for."""
    from test_cluster import Cluster

    built: dict[int, Any] = {}

    class Lazy(dict[int, Any]):
        def __missing__(self, hosts: int) -> Any:
            built[hosts] = Cluster(sandbox_factory(hosts), tmp_path_factory.mktemp(f"band{hosts}"), f"band{hosts}")
            return built[hosts]

    yield Lazy()


def _check_with(cluster: Any, share: float, *faults: tuple[str, str]) -> dict[str, Any]:
    """The check with each (host, direction) of faults limited to share of LINK that way."""
    sandbox = cluster.sandbox
    try:
        for host in sandbox.hosts:
            sandbox.rate_limit(host.name, rate=f"{LINK_MBIT}mbit", burst="256kbit")
        for name, way in faults:  # that way's qdisc replaced, the other's LINK kept
            sandbox.rate_limit(name, rate=f"{round(LINK_MBIT * share)}mbit", burst="256kbit", direction=way)
        began = time.monotonic()
        report, _, _ = cluster.check(*FAST, playbook="full", timeout=300)
    finally:
        for host in sandbox.hosts:
            sandbox.heal(host.name)
    speed = report["collective"]["speed"]
    print(f"\n{len(sandbox.hosts)} hosts, {faults} at {share}x: {time.monotonic() - began:.1f} s, "
          f"{report['status']}; {speed['message']}")
    print("compute slices (ratio @ wait): " + "; ".join(
        f"{c['host']} " + " ".join(f"{r:.2f}@{w or 0:.0%}" for r, w in zip(c["slices"], c.get("slices_waited", []), strict=False))
        for c in speed["compute"]))
    return report


@pytest.mark.parametrize("hosts", [pytest.param(4, marks=pytest.mark.xdist_group("test_speed_band-4")),
                                   pytest.param(6, marks=pytest.mark.xdist_group("test_speed_band-6"))])
@pytest.mark.parametrize(("what", "direction", "share"), FAULTS, ids=[f[0] for f in FAULTS])
def test_a_host_in_the_band_users_meet_fails_alone(clusters: dict[int, Any], hosts: int, what: str, direction: str,
                                                   share: float) -> None:
    cluster = clusters[hosts]
    report = _check_with(cluster, share, ("h3", direction))
    named = sorted((f["code"], f["host"], f["status"]) for f in report["findings"]
                   if f["status"] in ("warn", "fail") and f["code"].startswith("PF6"))
    assert named == [("PF620", "h3", "fail")], (what, named, report["collective"]["speed"]["message"])
    assert {h["name"] for h in report["hosts"] if h["status"] == "fail"} == {"h3"}
    row = {h["host"]: h for h in report["collective"]["speed"]["hosts"]}["h3"]
    assert row["sending"] == "fail" and row["receiving"] == ("fail" if direction == "both" else "ok"), row
    (finding,) = [f for f in report["findings"] if f["code"] == "PF620" and f["status"] == "fail"]
    assert "sends at" in finding["message"] and "receives at" in finding["message"]
    assert "under 0.5x in each of 3 repeats" in finding["message"], finding["message"]
    if direction == "send":
        # The neighbour that received from it was a suspect, and its own repeats cleared it.
        assert "h4 receiving" in report["collective"]["speed"]["noise"]["cleared"]
    assert all(h["sending"] in ("ok", "noise") and h["receiving"] in ("ok", "noise")
               for h in report["collective"]["speed"]["hosts"] if h["host"] != "h3")
    cluster.assert_nothing_left()


@pytest.mark.xdist_group("test_speed_band-6")
def test_two_bad_nics_in_one_cluster_are_both_failed(clusters: dict[int, Any]) -> None:
    """h2 sends at 0.22x and h4 receives at 0.22x, two ring places apart: h3 between them shares a slow link with each.
    In the judge's model the two cleared each other in a phase they shared (tests/test_speed_judge.py); both fail."""
    cluster = clusters[6]
    report = _check_with(cluster, 0.22, ("h2", "send"), ("h4", "receive"))
    named = sorted((f["code"], f["host"], f["status"]) for f in report["findings"]
                   if f["status"] in ("warn", "fail") and f["code"].startswith("PF6"))
    assert named == [("PF620", "h2", "fail"), ("PF620", "h4", "fail")], (named, report["collective"]["speed"]["message"])
    rows = {h["host"]: h for h in report["collective"]["speed"]["hosts"]}
    assert (rows["h2"]["sending"], rows["h2"]["receiving"]) == ("fail", "ok"), rows["h2"]
    assert (rows["h4"]["sending"], rows["h4"]["receiving"]) == ("ok", "fail"), rows["h4"]
    assert all(h["sending"] in ("ok", "noise") and h["receiving"] in ("ok", "noise") for h in rows.values()
               if h["host"] not in ("h2", "h4"))
    cluster.assert_nothing_left()
