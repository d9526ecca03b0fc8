"""The JSON Schemas are written from the types (preflight.schemas_gen): the checked-in ones must be what the types give
today, and every config field must say what it is."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypedDict

import jsonschema
import pytest

from preflight import schemas_gen
from preflight.contracts import HOST_ENV
from preflight.emit import LAUNCH_SCHEMA_VERSION
from preflight.schema_marks import Range


def test_the_checked_in_schemas_are_what_the_types_give() -> None:
    stale = schemas_gen.stale()
    assert stale == [], f"{', '.join(stale)}: stale; run `python3 -m preflight.schemas_gen` and commit the result"


def test_check_names_a_stale_schema_and_the_command_that_writes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "schemas"
    shutil.copytree(schemas_gen.SCHEMAS, folder)
    monkeypatch.setattr(schemas_gen, "SCHEMAS", folder)
    assert schemas_gen.main(["--check"]) == 0
    spec = json.loads((folder / "spec.schema.json").read_text(encoding="utf-8"))
    spec["$defs"]["SshConfig"]["properties"]["parallelism"]["maximum"] = 4096  # a range widened by hand
    (folder / "spec.schema.json").write_text(json.dumps(spec), encoding="utf-8")
    assert schemas_gen.main(["--check"]) == 1
    assert capsys.readouterr().err == ("preflight/schemas/spec.schema.json is stale: run python3 -m preflight.schemas_gen\n")
    assert schemas_gen.main([]) == 0
    assert schemas_gen.main(["--check"]) == 0


def _leaves(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:  # a JSON Schema document
    return [(f"{name}.{key}", prop) for name, node in schema["$defs"].items() for key, prop in node.get("properties", {}).items()
            if "$ref" not in json.dumps(prop)]


def test_every_config_field_says_what_it_is() -> None:
    # The comment beside a field in spec.py is its description: a field without one is a field nobody documented.
    undocumented = [name for name, prop in _leaves(schemas_gen.spec_schema()) if not prop.get("description")]
    assert undocumented == []


def test_the_config_schema_keeps_its_ranges_formats_and_keys() -> None:
    schema = schemas_gen.spec_schema()
    ssh = schema["$defs"]["SshConfig"]
    assert ssh["additionalProperties"] is False and "parallelism" in ssh["required"]
    assert ssh["properties"]["parallelism"] == {"type": "integer", "minimum": 1, "maximum": 1024,
                                                "description": "hosts contacted at once, as pdsh's default fan-out; 1 to 1024"}
    assert ssh["properties"]["connect_timeout_s"]["exclusiveMinimum"] == 0
    assert ssh["properties"]["host_key_policy"]["enum"] == ["strict", "accept-new"]
    port = schema["$defs"]["HostSpec"]["properties"]["port"]
    assert port["oneOf"] == [{"type": "null"}, {"type": "integer", "minimum": 1, "maximum": 65535}]
    assert schema["$defs"]["DenyEntry"]["properties"]["workaround_env"]["propertyNames"] == {"format": "env-name"}
    # Every number has a range: a count from 1, a timeout above 0 and at most a day.
    numbers = [(name, prop.get("oneOf", [{}, prop])[-1]) for name, prop in _leaves(schema)]
    unbounded = [name for name, p in numbers if p.get("type") in ("integer", "number") and "maximum" not in p]
    assert unbounded == []


def test_a_report_schema_reads_its_bounds_and_requirements_from_the_types() -> None:
    report = schemas_gen.report_schema()
    assert report["required"][:2] == ["schema", "preflight_version"] and "collective" in report["required"]
    assert "connectivity" not in report["required"]  # a schema 2 report has none
    assert report["properties"]["schema"]["enum"] == [2, 3, 4, 5, 6, 7, 8]
    assert report["properties"]["created_at"]["format"] == "date-time"
    transport = report["$defs"]["TransportSection"]
    assert transport["required"] == ["expected", "message", "ranks"] and "diagnostics" in transport["properties"]


@dataclass
class _Marked:
    late: Annotated[int, Range(1, 9)] | None = None  # a mark inside the optional, as it belongs


class _Misplaced(TypedDict):
    early: Annotated[int | None, Range(1, 9)]


def test_a_mark_on_an_optional_type_is_refused_and_one_inside_it_is_kept() -> None:
    schema = schemas_gen.document(_Marked, "x", "x")
    assert schema["properties"]["late"]["oneOf"][1] == {"type": "integer", "minimum": 1, "maximum": 9}
    assert schema["properties"]["late"]["description"] == "a mark inside the optional, as it belongs"
    with pytest.raises(TypeError, match="put it inside"):
        schemas_gen.document(_Misplaced, "x", "x")


def _launch(nnodes: int, addr: str) -> dict[str, Any]:
    env = dict.fromkeys(HOST_ENV, "1")
    host = {"name": "h1", "node_rank": 0, "is_host": True, "local_addr": addr, "ifname": None, "env": env, "torchrun_args": [],
            "workarounds": [{"host": "h1", "code": "PF203", "env": {"NCCL_SHM_DISABLE": "1"}, "why": "small /dev/shm"}]}
    return {"schema": LAUNCH_SCHEMA_VERSION, "preflight_version": "0", "cluster": "c", "forced": False, "forced_over": [],
            "report": {"path": "/r.json", "created_at": "2026-11-27T06:01:00+00:00", "status": "pass", "spec_digest": "0" * 64},
            "backend": "gloo", "master": {"host": "h1", "addr": addr, "port": 29500}, "nnodes": nnodes, "nproc_per_node": 1,
            "world_size": nnodes, "rendezvous": {"backend": "c10d", "endpoint": f"{addr}:29500", "id": "x", "join_timeout_s": 1,
                                                  "read_timeout_s": 1},
            "init_timeout_s": 1, "excluded": [], "torchrun": "torchrun", "script": ["train.py"], "hosts": [host]}


def test_the_launch_schema_keeps_its_patterns_required_variables_and_the_loopback_rule() -> None:
    valid = jsonschema.Draft202012Validator(schemas_gen.launch_schema()).is_valid
    assert valid(_launch(1, "127.0.0.1")) and valid(_launch(2, "198.18.0.2"))
    assert not valid(_launch(2, "127.0.0.1"))  # a loopback rendezvous across hosts: the rule no type carries
    for broken in ({"schema": LAUNCH_SCHEMA_VERSION + 1}, {"cluster": "-c"}, {"nnodes": 0}, {"script": []}, {"torchrun": ""},
                   {"master": {"host": "h1", "addr": "198.18.0.256", "port": 29500}}):
        assert not valid({**_launch(1, "198.18.0.2"), **broken}), broken
    document = _launch(1, "198.18.0.2")
    del document["hosts"][0]["env"]["PET_RDZV_ID"]
    assert not valid(document)
    document = _launch(1, "198.18.0.2")
    document["hosts"][0]["env"]["bad-name"] = "1"
    assert not valid(document)
    document = _launch(1, "198.18.0.2")
    document["hosts"][0]["workarounds"][0]["env"]["NCCL_X"] = "a\nb"
    assert not valid(document)
