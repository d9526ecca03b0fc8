"""A cluster file's host list read beside Hydra (preflight.host_list) gives what Hydra's composition gives: the same
plain config, typed tree and digest, or the same one-line error; and the schema's shortcut over many hosts
(preflight.schema_check) finds exactly the problems jsonschema finds over every host."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_config_fuzz import KEYS, invalid_values

from preflight import compose, host_list
from preflight.errors import InputError
from preflight.resources import load_schema, shipped_dir
from preflight.schema_check import _FORMAT_CHECKER, _VALIDATOR, schema_errors

HOST = ("{{name: n{i:03d}, address: '10.0.{a}.{b}', user: train, port: {port}, gpus: '8', python: /opt/venv/bin/python,"
        " identity: ~/.ssh/id_{i}, jump: 'ops@bastion:2222', interface: ens{i}, interfaces: [ib0, ib1], transport: ssh}}")


def varied(hosts: int) -> str:
    """A cluster of every HostSpec key in use: given, left to its default, null, in block and flow style, anchors."""
    lines = ["# lab cluster", "name: lab", "master: n000", "hosts:"]
    for i in range(hosts):
        if i % 3 == 0:
            lines.append("  - " + HOST.format(i=i, a=i // 250, b=i % 250 + 1, port=22 + i % 5))
        elif i % 3 == 1:
            lines += [f"  - name: n{i:03d}", f"    address: gpu{i}.lab.internal", "    user: null", "    transport: local",
                      f"    interfaces: {'&rails [eth1, eth2]' if i == 1 else '*rails'}"]
        else:
            lines += [f"  - {{name: 'n{i:03d}', address: \"fe80::{i:x}\", interfaces: *rails}}", "    # a comment inside the list"]
    return "\n".join(lines) + "\n"


GLOBAL = """# @package _global_
ssh:
  parallelism: 8
cluster:
  name: lab
  hosts:
    - {name: a, address: 10.0.0.1}
    - {name: b, address: 10.0.0.2, gpus: '0'}

  master: b
network:
  mtu: 9000
"""
HOSTS_FIRST = "hosts:\n- name: a\n  address: 10.0.0.1\n- {name: b, address: 10.0.0.2}\n# master next\nmaster: a\nname: lab\n"

# name -> (the cluster file, whether its hosts are read beside Hydra)
FILES: dict[str, tuple[str, bool]] = {
    "shipped local": ((shipped_dir("conf") / "cluster" / "local.yaml").read_text(), True),
    "shipped prod": ((shipped_dir("conf") / "cluster" / "prod.yaml").read_text(), True),
    "varied": (varied(60), True),
    "package global": (GLOBAL, True),
    "hosts first": (HOSTS_FIRST, True),
    # Problems the schema or the semantic checks name, on the same plain config either way.
    "bad address": (varied(6).replace("gpu4.lab.internal", "'gpu4;reboot'"), True),
    "same name twice": (varied(6).replace("n004", "n001"), True),
    "no such master": (varied(6).replace("master: n000", "master: n999"), True),
    "a rail twice": (varied(6).replace("[eth1, eth2]", "[eth1, eth1]"), True),
    # Values OmegaConf converts or refuses, and files that are not plain: composed through Hydra.
    "gpus a number": (varied(6).replace("gpus: '8'", "gpus: 8"), False),
    "port a string": (varied(6).replace("port: 22,", "port: '22',"), False),
    "name a number": (HOSTS_FIRST.replace("name: a\n", "name: 17\n"), False),
    "unknown key": (varied(6).replace("transport: local", "transport: local\n    rack: 4"), False),
    "no address": (HOSTS_FIRST.replace("  address: 10.0.0.1\n", ""), False),
    "transport misspelt": (varied(6).replace("transport: local", "transport: LOCAL"), False),
    "key twice": (HOSTS_FIRST.replace("  address: 10.0.0.1\n", "  address: 10.0.0.1\n  address: 10.0.0.9\n"), False),
    "interpolation": (HOSTS_FIRST.replace("10.0.0.1", "${cluster.hosts.1.name}.lab"), False),
    "defaults list": ("defaults:\n  - _self_\n" + HOSTS_FIRST, False),
    "flow mapping": ("{name: lab, master: a, hosts: [{name: a, address: 10.0.0.1}]}\n", False),
}

REFUSED = {"bad address", "same name twice", "no such master", "a rail twice", "name a number", "unknown key", "no address",
           "transport misspelt", "key twice"}


def outcome(overrides: list[str], folder: Path) -> tuple[Any, ...]:
    """What composing gives: the plain config (its key order too), typed tree and digest; or the error's line."""
    try:
        spec = compose._compose_spec(overrides, str(folder))
    except InputError as e:
        return ("error", str(e))
    return ("spec", json.dumps(spec.plain), spec.config, spec.digest)


def both(overrides: list[str], folder: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The outcome with the host list read beside Hydra where it can be, and through Hydra alone."""
    aside = outcome(overrides, folder)
    with monkeypatch.context() as m:
        m.setattr(compose, "_compose_aside", lambda *_: None)
        return aside, outcome(overrides, folder)


def set_aside(overrides: list[str], folder: Path) -> bool:
    primary, extra = compose.search_path(str(folder))
    with host_list.set_aside(overrides, [primary, *extra], [folder]) as aside:
        return aside is not None


@pytest.mark.parametrize("name", list(FILES))
def test_a_cluster_file_composes_as_hydra_composes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    text, aside = FILES[name]
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "lab.yaml").write_text(text)
    overrides = ["cluster=lab", "network.master_port=0"]
    assert set_aside(overrides, tmp_path) is aside
    new, old = both(overrides, tmp_path, monkeypatch)
    assert new == old
    assert new[0] == ("error" if name in REFUSED else "spec")


@pytest.mark.parametrize(("overrides", "aside"), [
    (["cluster.hosts.1.gpus=1"], False),
    (["cluster.hosts.2.address=other.lab"], False),
    (["cluster.hosts=[{name: z, address: 10.9.9.9}]", "cluster.master=z"], False),
    (["+cluster.hosts.0.rack=4"], False),
    (["cluster.master=${cluster.hosts.1.name}"], False),
    (["cluster.master=n002"], True),
    (["network.mtu=abc"], True),  # Hydra refuses it composing the stand-in: composed again through Hydra, which says so
    (["collective.isolate=false", "ssh.parallelism=4"], True),
], ids=lambda v: " ".join(v) if isinstance(v, list) else str(v))
def test_overrides_compose_as_hydra_composes_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: list[str],
                                                  aside: bool) -> None:
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "lab.yaml").write_text(varied(12))
    overrides = ["cluster=lab", "network.master_port=0", *overrides]
    assert set_aside(overrides, tmp_path) is aside
    new, old = both(overrides, tmp_path, monkeypatch)
    assert new == old


def test_a_large_cluster_is_read_beside_hydra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "lab.yaml").write_text(varied(900))
    new, old = both(["cluster=lab", "network.master_port=0"], tmp_path, monkeypatch)
    assert new == old and new[0] == "spec"


# --- the schema's shortcut over the host list ------------------------------------------------------------------------

SCHEMA = load_schema("spec")
HOST_KEYS = [key for key in KEYS if key.path.startswith("cluster.hosts.0.")]


@pytest.fixture(scope="module")
def plain() -> dict[str, Any]:  # a valid plain config of four hosts
    return compose.load_spec(["cluster=prod"]).plain


def every_error(config: dict[str, Any]) -> list[tuple[str, str]]:
    """jsonschema over every host, as the check was before the shortcut."""
    errors = _VALIDATOR(SCHEMA, format_checker=_FORMAT_CHECKER).iter_errors(config)
    return sorted((json.dumps([str(p) for p in e.absolute_path]), e.message) for e in errors)


def hydra_value(path: str, text: str) -> Any:  # a value as an override gives it
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        (parsed,) = OverridesParser.create().parse_overrides([f"{path}={text}"])
    except Exception:  # not an override at all: Hydra refuses it before any schema
        return None
    return None if parsed.is_sweep_override() else parsed.value()


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
                       max_leaves=6)


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_schema_shortcut_finds_what_jsonschema_finds(plain: dict[str, Any], data: st.DataObject) -> None:
    config = copy.deepcopy(plain)
    hosts = config["cluster"]["hosts"]
    for _ in range(data.draw(st.integers(0, 2), label="changes")):
        index = data.draw(st.integers(0, len(hosts) - 1), label="host")
        key = data.draw(st.sampled_from(HOST_KEYS), label="key")
        field = key.path.removeprefix("cluster.hosts.0.").split(".")[0]
        kind = data.draw(st.sampled_from(["fuzz", "any", "missing", "extra"]), label="kind")
        if kind == "fuzz":
            hosts[index][field] = hydra_value(key.path, data.draw(invalid_values(key), label="value"))
        elif kind == "any":
            hosts[index][field] = data.draw(JSONISH, label="value")
        elif kind == "missing":
            hosts[index].pop(field, None)
        else:
            hosts[index]["rack"] = 4
    found = sorted((json.dumps([str(p) for p in e.absolute_path]), e.message) for e in schema_errors(config, complete=True))
    assert found == every_error(config)
