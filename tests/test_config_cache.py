"""The cache of composed configs: the same Spec as composing, never a stale one, never an altered one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from preflight import config_cache
from preflight.compose import load_spec
from preflight.errors import InputError

CLUSTER = """\
name: lab
master: a1
hosts:
  - {name: a1, address: 10.1.0.11, gpus: "8"}
  - {name: a2, address: 10.1.0.12, gpus: "8", interface: ens5}
"""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(config_cache.CACHE_ENV, str(folder))
    return folder


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    folder = tmp_path / "conf"
    (folder / "cluster").mkdir(parents=True)
    (folder / "cluster" / "lab.yaml").write_text(CLUSTER)
    return folder


def _entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.json")) if cache.is_dir() else []


@pytest.mark.parametrize("overrides", [[], ["cluster=lab"], ["cluster=lab", "playbook=burnin", "network.master_port=29600"],
                                       ["cluster=prod", "pins=any"]])
def test_a_cached_spec_is_the_composed_one(cache: Path, conf: Path, overrides: list[str]) -> None:
    composed = load_spec(overrides, str(conf))
    assert len(_entries(cache)) == 1
    cached = load_spec(overrides, str(conf))
    assert (cached.config, cached.plain, cached.digest) == (composed.config, composed.plain, composed.digest)


def test_a_changed_file_or_override_is_composed_again(cache: Path, conf: Path) -> None:
    assert load_spec(["cluster=lab"], str(conf)).config.cluster.hosts[1].interface == "ens5"
    (conf / "cluster" / "lab.yaml").write_text(CLUSTER.replace("ens5", "ens6"))
    assert load_spec(["cluster=lab"], str(conf)).config.cluster.hosts[1].interface == "ens6"
    assert load_spec(["cluster=lab", "network.master_port=29601"], str(conf)).config.network.master_port == 29601
    (conf / "network").mkdir()
    (conf / "network" / "fast.yaml").write_text("mtu: 9000\n")  # a new file on the search path
    assert load_spec(["cluster=lab", "network=fast"], str(conf)).config.network.mtu == 9000
    assert len(_entries(cache)) == 4


def test_interpolations_are_never_cached(cache: Path, conf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (conf / "cluster" / "lab.yaml").write_text(CLUSTER.replace("10.1.0.12", "'${oc.env:LAB_A2}'"))
    monkeypatch.setenv("LAB_A2", "10.1.0.99")
    assert load_spec(["cluster=lab"], str(conf)).config.cluster.hosts[1].address == "10.1.0.99"
    monkeypatch.setenv("LAB_A2", "10.1.0.98")
    assert load_spec(["cluster=lab"], str(conf)).config.cluster.hosts[1].address == "10.1.0.98"
    assert load_spec(["cluster=lab", "state_dir=${oc.env:HOME}/x"], str(conf)).config.state_dir.endswith("/x")
    assert _entries(cache) == []


def test_an_altered_entry_is_not_trusted(cache: Path, conf: Path) -> None:
    load_spec(["cluster=lab"], str(conf))
    (entry,) = _entries(cache)
    plain = json.loads(entry.read_text())
    plain["cluster"]["hosts"][0]["address"] = "10.1.0.11; reboot"
    entry.write_text(json.dumps(plain))
    assert load_spec(["cluster=lab"], str(conf)).config.cluster.hosts[0].address == "10.1.0.11"
    entry.write_text("{not json")
    assert load_spec(["cluster=lab"], str(conf)).config.cluster.hosts[0].address == "10.1.0.11"


def test_bad_input_is_never_cached(cache: Path, conf: Path) -> None:
    with pytest.raises(InputError, match=r"network\.master_port"):
        load_spec(["cluster=lab", "network.master_port=99999"], str(conf))
    assert _entries(cache) == []


def test_off_writes_nothing(cache: Path, conf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(config_cache.CACHE_ENV, "off")
    load_spec(["cluster=lab"], str(conf))
    assert _entries(cache) == []


def test_a_cached_spec_costs_no_hydra_import(cache: Path, conf: Path) -> None:
    script = ("import sys; from preflight.compose import load_spec; load_spec(['cluster=lab'], sys.argv[1]); "
              "print(sorted(m for m in ('hydra', 'omegaconf') if m in sys.modules))")
    runs = [subprocess.run([sys.executable, "-c", script, str(conf)], capture_output=True, text=True, check=True).stdout.strip()
            for _ in range(2)]
    assert runs == ["['hydra', 'omegaconf']", "[]"]
