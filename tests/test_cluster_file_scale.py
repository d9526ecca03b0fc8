"""Cluster files at real scale: thousands of hosts composed, validated and fanned out to, in bounded time.

The hosts' addresses (198.18.0.0/15) lead nowhere: `preflight check` runs in a network namespace of its own with no
route (`unshare --net`: only loopback, and that down), so no packet leaves this machine and every connect fails at
once with "Network is unreachable". Every host must then be `unknown` and the run incomplete (exit 3).

HOSTS is smaller than the 12,000 of a real large cluster for the check: its fan-out to 12,000 hosts with no route took
23.5 s of CPU on the 2-core development machine (all unknown, exit 3); bench/cluster_file_scale.py --check measures it.
Composing and validating 12,000 hosts takes about 2.3 s of CPU there (the host list read beside Hydra,
preflight.host_list; 25 s through Hydra and OmegaConf), and is tested here at that size.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import preflight, preflight_exe, skip_or_fail

from preflight.compose import load_spec
from preflight.errors import InputError
from preflight.spec import HIGHEST_PORT, alone_port, highest_derived_port, split_port

HOSTS = 1_000
FIRST_ADDRESS = ipaddress.ip_address("198.18.0.1")
# The whole run's bound: composing 2,000 hosts and their failed connects took 8.6 s of CPU on the 2-core machine, 34 s
# of wall time beside other work (100 s at a load of 17); the rest is room for the suite's load.
DEADLINE_S = 240.0


def write_cluster(folder: Path, hosts: int, bad: dict[int, str] | None = None) -> Path:
    """cluster/big.yaml under folder: hosts h00000... at consecutive addresses from 198.18.0.1; bad replaces an entry's
    address, by index."""
    lines = ["name: big", "master: h00000", "hosts:"]
    for i in range(hosts):
        address = (bad or {}).get(i, str(FIRST_ADDRESS + i))
        lines.append(f"  - {{name: h{i:05d}, address: '{address}', user: root}}")
    (folder / "cluster").mkdir(parents=True, exist_ok=True)
    (folder / "cluster" / "big.yaml").write_text("\n".join(lines) + "\n")
    return folder


def test_every_host_of_a_large_cluster_with_no_route_is_unknown(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        skip_or_fail("a network namespace of its own needs root and unshare")
    folder = write_cluster(tmp_path / "conf", HOSTS)
    started = time.monotonic()
    result = subprocess.run(["unshare", "--net", "--", preflight_exe(), "check", "--json", "--config-dir", str(folder), "cluster=big",
                             f"state_dir={tmp_path / 'state'}"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=DEADLINE_S, env={**os.environ, "PREFLIGHT_CONFIG_CACHE": "off"}, check=False)
    elapsed = time.monotonic() - started
    report = json.loads(result.stdout) if result.stdout.startswith("{") else {}
    statuses = Counter(host["status"] for host in report.get("hosts", []))
    assert (result.returncode, statuses) == (3, {"unknown": HOSTS}), result.stderr[-2000:]
    reasons = {host["reason"] for host in report["hosts"][:50]}
    assert all(reason.endswith("Network is unreachable") for reason in reasons), reasons
    assert elapsed < DEADLINE_S


def test_one_bad_entry_in_a_large_cluster_is_one_short_line(tmp_path: Path) -> None:
    folder = write_cluster(tmp_path / "conf", HOSTS, bad={HOSTS * 7 // 12: "bad host!"})
    result = preflight("check", "--config-dir", str(folder), "cluster=big", cwd=tmp_path, timeout=DEADLINE_S,
                       env={**os.environ, "PREFLIGHT_CONFIG_CACHE": "off"})
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    index = HOSTS * 7 // 12
    assert lines[0] == f"preflight: error: cluster.hosts[{index}].address: 'bad host!' is not a host name or IP"
    assert len(lines[0]) < 300


@pytest.mark.parametrize(("value", "shown"), [
    ("x" * 10_000, "'" + "x" * 79 + "... (10,002 characters)"),
    ("[" + ", ".join(["a"] * 5_000) + "]", "a list of 5,000 items"),
], ids=["a long string", "a long list"])
def test_a_huge_bad_value_is_quoted_briefly(tmp_path: Path, value: str, shown: str) -> None:
    folder = write_cluster(tmp_path / "conf", 3)
    path = folder / "cluster" / "big.yaml"
    path.write_text(path.read_text().replace("user: root}", f"user: root, python: {value}}}", 1))
    result = preflight("check", "--config-dir", str(folder), "cluster=big", cwd=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith(f"preflight: error: cluster.hosts[0].python: {shown}") and len(lines[0]) < 300, lines[0]


# CPU seconds, not wall time, so that the shared machine's load does not count: 2.3 s measured for 12,000 hosts on the
# 2-core machine, 24 s through Hydra and OmegaConf alone. A composition that fell back to Hydra would fail this.
COMPOSE_CPU_S = 10.0


def test_twelve_thousand_hosts_compose_in_seconds_with_room_for_the_collective(tmp_path: Path) -> None:
    folder = write_cluster(tmp_path / "conf", 12_000)
    started = time.process_time()
    with pytest.MonkeyPatch.context() as m:
        m.setenv("PREFLIGHT_CONFIG_CACHE", "off")
        spec = load_spec(["cluster=big", "playbook=full"], str(folder))  # the default master_port, 29500, and the collective
    spent = time.process_time() - started
    assert len(spec.config.cluster.hosts) == 12_000 and spec.config.network.master_port == 29500
    assert spent < COMPOSE_CPU_S, f"{spent:.1f} s of CPU to compose 12,000 hosts"


def test_the_collective_s_derived_ports_stay_ports_at_any_size(tmp_path: Path) -> None:
    # Each round's groups have distinct ports up to DERIVED_PORTS of them, then reuse them: 100,000 hosts fit above 29500.
    for hosts in (1, 4, 999, 1000, 1001, 12_000, 100_000, 1_000_000):
        highest = highest_derived_port(29500, hosts)
        assert highest <= 29500 + 3099 and max(split_port(29500, hosts - 1), alone_port(29500, hosts - 1, 2)) <= highest
    assert len({split_port(29500, k) for k in range(1000)}) == 1000 and 29500 not in {alone_port(29500, k, 2) for k in range(5000)}
    folder = write_cluster(tmp_path / "conf", 3)
    with pytest.raises(InputError, match=r"network\.master_port: 65500 leaves no room"):
        load_spec(["cluster=big", "network.master_port=65500"], str(folder))
    assert highest_derived_port(HIGHEST_PORT - 3099, 100_000) == HIGHEST_PORT
