"""Blame on the namespace cluster, with the default playbook (`preflight check` as users run it): the host at fault is
named, no healthy host is failed, and emit-launch with launch.exclude_failed=true leaves out that host alone.

One 4-host cluster for the module: a host with a smaller MTU than the others, then a host whose python has no torch.
Each test prints its check's wall time (pytest -s shows it).
"""

from __future__ import annotations

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
    assert statuses.pop(culprit) == "fail", statuses
    assert all(status in HEALTHY_STATUSES for status in statuses.values()), statuses


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


@pytest.fixture
def smaller_mtu_on_h3(cluster: Cluster) -> Iterator[str]:
    ifname = cluster.sandbox.host("h3").ifname
    cluster.sandbox.run_in("h3", ["ip", "link", "set", ifname, "mtu", "1400"]).check_returncode()
    try:
        yield "h3"
    finally:
        cluster.sandbox.run_in("h3", ["ip", "link", "set", ifname, "mtu", "1500"]).check_returncode()


def test_a_host_with_a_smaller_mtu_is_the_one_failed(cluster: Cluster, smaller_mtu_on_h3: str) -> None:
    """h3 at MTU 1400 on a 1500 bridge: its peers' 1500 B datagrams to it are lost, theirs among themselves pass. h3 is
    failed with the size its path carries; the torchrun check runs on the three others, which emit-launch keeps."""
    report, elapsed, _ = cluster.check(playbook=None, timeout=240)
    print(f"\ndefault check, h3 at MTU 1400 of 4 hosts: {elapsed:.1f} s")
    assert_only_failed(report, "h3")
    mtu = [f for f in report["findings"] if f["code"] == "PF611" and f["status"] == "fail"]
    assert [f["host"] for f in mtu] == ["h3"], mtu
    # The size found is the one the path carries: Linux's veth takes frames up to its MTU plus a VLAN tag's 4 bytes.
    carried = int(mtu[0]["message"].split(" receives at most ")[1].split(" B")[0])
    assert 1400 <= carried <= 1404, mtu
    assert mtu[0]["message"].startswith(f"h3 receives at most {carried} B: do-not-fragment datagrams of 1500 B from h1, h2, h4")
    assert "its own interface's MTU is 1400" in mtu[0]["message"] and mtu[0]["remedy"].endswith("every host's MTU to 1400")
    assert {(p["destination"], p["largest_passed"]) for p in report["connectivity"]["mtu_failed"]} == {("h3", carried)}
    drift = next(f for f in report["findings"] if f["code"] == "PF503")
    assert drift["status"] == "fail" and "h3 has 1400" in drift["message"]
    collective = report["collective"]
    assert (collective["status"], collective["hosts"]) == ("pass", ["h1", "h2", "h4"]), collective["message"]
    assert_launch_leaves_out(cluster, "h3")
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
