"""Blame on the namespace cluster, with the default playbook (`preflight check` as users run it): the host at fault is
named, no healthy host is failed, and emit-launch with launch.exclude_failed=true leaves out that host alone.

One 4-host cluster for the module: a host with a smaller MTU than the others (1200, below the smallest common size the
path-MTU ladder tries, and 1000; 1400 with the connectivity playbook alone), then a host whose python has no torch.
Each test prints its check's wall time (pytest -s shows it).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import preflight
from test_cluster import Cluster, hosts_by_name

pytestmark = pytest.mark.sandbox

HEALTHY_STATUSES = ("pass", "warn")


@pytest.fixture(scope="module")
def cluster(sandbox_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    return Cluster(sandbox_factory(4), tmp_path_factory.mktemp("blame4"), "blame4")


def emit(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return preflight("emit-launch", "--config-dir", str(cluster.folder / "conf"), f"cluster={cluster.name}",
                     f"state_dir={cluster.folder / 'state'}", "--format", "json", *args, cwd=cluster.folder)


def assert_only_failed(report: dict[str, Any], culprit: str) -> None:
    statuses = {name: host["status"] for name, host in hosts_by_name(report).items()}
    failing = [(f["code"], f["host"], f["message"]) for f in report["findings"] if f["status"] == "fail"]
    assert statuses.pop(culprit) == "fail", (statuses, failing)
    assert all(status in HEALTHY_STATUSES for status in statuses.values()), (statuses, failing)


def assert_launch_leaves_out(cluster: Cluster, culprit: str, *overrides: str) -> dict[str, Any]:
    refused = emit(cluster, *overrides)
    assert refused.returncode == 1 and f"{culprit}: " in refused.stderr and "launch.exclude_failed=true" in refused.stderr, \
        refused.stderr
    result = emit(cluster, *overrides, "launch.exclude_failed=true")
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    healthy = [h.name for h in cluster.sandbox.hosts if h.name != culprit]
    assert [h["name"] for h in document["hosts"]] == healthy and document["master"]["host"] == "h1" and not document["forced"]
    assert [e["host"] for e in document["excluded"]] == [culprit]
    return document


@contextlib.contextmanager
def interface_mtu(cluster: Cluster, host: str, mtu: int) -> Iterator[str]:
    """host's job interface at mtu for the block, the bridge's 1500 again after it."""
    ifname = cluster.sandbox.host(host).ifname
    cluster.sandbox.run_in(host, ["ip", "link", "set", ifname, "mtu", str(mtu)]).check_returncode()
    try:
        yield host
    finally:
        cluster.sandbox.run_in(host, ["ip", "link", "set", ifname, "mtu", "1500"]).check_returncode()


def carried_into(finding: dict[str, Any]) -> int:
    """The size a PF611 finding on a destination says its path carries."""
    return int(finding["message"].split(" receives at most ")[1].split(" B")[0])


@pytest.mark.parametrize("mtu", [1200, 1000])
def test_a_host_with_a_smaller_mtu_is_the_one_failed(cluster: Cluster, mtu: int) -> None:
    """h3 at MTU 1200 (below 1280, the smallest common size the ladder tries), or 1000 (the search runs up from the loss
    datagrams' size, through a gap four times the 1200 host's), on a 1500 bridge, the default check: its peers' 1500 B
    datagrams to it are lost, theirs among themselves pass. h3 is failed with the size its path carries, and by the MTU
    drift the three others agree on; the torchrun check runs on the three others, which emit-launch keeps."""
    with interface_mtu(cluster, "h3", mtu):
        report, elapsed, _ = cluster.check(playbook=None, timeout=240)
    print(f"\ndefault check, h3 at MTU {mtu} of 4 hosts: {elapsed:.1f} s")
    assert_only_failed(report, "h3")
    found = [f for f in report["findings"] if f["code"] == "PF611" and f["status"] == "fail"]
    assert [f["host"] for f in found] == ["h3"], found
    # The size found is the one the path carries: Linux's veth takes frames up to its MTU plus a VLAN tag's 4 bytes.
    carried = carried_into(found[0])
    assert mtu <= carried <= mtu + 4, found
    assert found[0]["message"].startswith(f"h3 receives at most {carried} B: do-not-fragment datagrams of 1500 B from h1, h2, h4")
    assert f"its own interface's MTU is {mtu}" in found[0]["message"] and found[0]["remedy"].endswith(f"every host's MTU to {mtu}")
    assert {(p["destination"], p["largest_passed"]) for p in report["connectivity"]["mtu_failed"]} == {("h3", carried)}
    drift = next(f for f in report["findings"] if f["code"] == "PF503")
    assert (drift["status"], drift["host"]) == ("fail", "h3") and f"h3 has {mtu}" in drift["message"]
    collective = report["collective"]
    assert (collective["status"], collective["hosts"]) == ("pass", ["h1", "h2", "h4"]), collective["message"]
    assert_launch_leaves_out(cluster, "h3")
    cluster.assert_nothing_left()


def test_a_host_at_mtu_1400_is_the_one_failed_by_the_connectivity_test(cluster: Cluster) -> None:
    """h2 at MTU 1400, a size inside the ladder's, the connectivity playbook alone (the launch and emit-launch with a
    host failed for its MTU are the test above's)."""
    mtu = 1400
    with interface_mtu(cluster, "h2", mtu):
        report, elapsed, _ = cluster.check(playbook="connectivity", timeout=120)
    print(f"\nconnectivity check, h2 at MTU {mtu} of 4 hosts: {elapsed:.1f} s")
    assert_only_failed(report, "h2")
    failed = [(f["code"], f["host"]) for f in report["findings"] if f["status"] == "fail"]
    assert sorted(failed) == [("PF503", "h2"), ("PF611", "h2")], failed
    (found,) = [f for f in report["findings"] if f["code"] == "PF611" and f["status"] == "fail"]
    carried = carried_into(found)
    assert mtu <= carried <= mtu + 4 and f"its own interface's MTU is {mtu}, below its peers' 1500" in found["message"], found
    assert {(p["source"], p["destination"], p["largest_passed"]) for p in report["connectivity"]["mtu_failed"]} == \
        {(h, "h2", carried) for h in ("h1", "h3", "h4")}
    cluster.assert_nothing_left()


@pytest.fixture(scope="module")
def python_without_torch(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A python with no torch, as a fresh training environment has (a venv without pip: 0.1 s)."""
    folder = tmp_path_factory.mktemp("no-torch")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder / "venv")], check=True, timeout=60)
    return str(Path(folder / "venv" / "bin" / "python"))


def test_a_host_without_torch_is_left_out_by_emit_launch(cluster: Cluster, python_without_torch: str) -> None:
    """h4's python has no torch: the check fails h4 (PF104) and the torch drift it makes (PF501); emit-launch with
    launch.exclude_failed=true leaves h4 out and judges the drift again on the three it keeps, where there is none."""
    no_torch = f"cluster.hosts.3.python={python_without_torch}"
    report, elapsed, _ = cluster.check(no_torch, playbook=None, timeout=240)
    print(f"\ndefault check, h4 without torch of 4 hosts: {elapsed:.1f} s")
    assert_only_failed(report, "h4")
    assert next(f for f in report["findings"] if f["code"] == "PF104" and f["host"] == "h4")["status"] == "fail"
    drift = next(f for f in report["findings"] if f["code"] == "PF501" and f["status"] == "fail")
    assert "h4 has None" in drift["message"]
    assert (report["collective"]["status"], report["collective"]["hosts"]) == ("pass", ["h1", "h2", "h3"])
    assert_launch_leaves_out(cluster, "h4", no_torch)
    cluster.assert_nothing_left()
