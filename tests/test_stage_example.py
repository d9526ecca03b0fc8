"""Adding a stage is its package and one entry in stage_list.STAGES: the example stage in tests/hostname_stage, registered
by that one entry, reaches the JSON report, the report schema written with it, the terminal and the HTML page."""

from __future__ import annotations

import dataclasses
import io
import socket
import typing
from typing import cast

import jsonschema
import pytest
from hostname_stage.contracts import HostnameSection
from hostname_stage.stage import NAME

from preflight import report as report_module
from preflight.compose import load_spec
from preflight.pipeline import run_check
from preflight.report import render
from preflight.report_html import report_html
from preflight.report_shape import StageSections
from preflight.resources import validator
from preflight.schemas_gen import report_schema
from preflight.spec import Stage
from preflight.stage_list import STAGES, StageEntry, section_types


def _hostname_stage() -> object:
    from hostname_stage.stage import STAGE
    return STAGE


def test_a_stage_from_outside_is_its_package_and_one_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    # The one line a stage adds to stage_list.STAGES, here after the shipped ones.
    monkeypatch.setitem(STAGES, NAME, StageEntry(_hostname_stage, HostnameSection))  # type: ignore[arg-type]
    schema = report_schema()  # what python3 -m preflight.schemas_gen writes with the stage registered
    assert schema["properties"][NAME] == {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/HostnameSection"}]}
    assert schema["$defs"]["HostnameLength"]["properties"]["length"] == {
        "type": "integer", "minimum": 0, "maximum": 253, "description": "characters in hostname; a DNS name has at most 253"}
    checker = validator("report").format_checker
    # The run validates its report against the schema as that command would write it.
    monkeypatch.setattr(report_module, "validator", lambda name: jsonschema.Draft202012Validator(schema, format_checker=checker))

    spec = load_spec(["cluster=local", "playbook=facts", "training.backend=gloo"])
    # spec.Stage, the playbook's names as its config schema lists them, does not name the new stage: set it in the
    # composed playbook (the one step a stage's package cannot yet take, stated in docs/architecture.md).
    playbook = dataclasses.replace(spec.config.playbook, stages=[Stage.facts, cast(Stage, NAME)])
    spec = dataclasses.replace(spec, config=dataclasses.replace(spec.config, playbook=playbook))
    report = run_check(spec)

    section = cast(dict[str, HostnameSection], report)[NAME]
    hostname = socket.gethostname()
    assert section == {"longest": 63, "hosts": [{"host": spec.config.cluster.hosts[0].name, "hostname": hostname, "length": len(hostname)}]}
    assert [f["code"] for f in report["findings"] if f["code"] == "PF990"] == ["PF990"]
    jsonschema.Draft202012Validator(schema, format_checker=checker).validate(report)
    with pytest.raises(jsonschema.ValidationError):  # the schema judges the section's shape
        jsonschema.Draft202012Validator(schema).validate({**report, NAME: {"longest": 63, "hosts": [{"host": "h"}]}})
    assert list(report)[-1] == NAME and set(section_types()) - set(StageSections.__annotations__) == {NAME}

    from rich.console import Console
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(render(report, show_all=True))
    assert f"hostname PASS  hostname lengths: {spec.config.cluster.hosts[0].name}: {len(hostname)}" in out.getvalue()
    page = report_html(report)
    assert '<h2 id="hostname">Hostname lengths</h2>' in page and f"<td>{len(hostname)}</td>" in page


def test_each_shipped_entry_names_the_section_type_the_report_shape_gives_it() -> None:
    hints = typing.get_type_hints(StageSections)
    assert set(hints) == set(section_types())
    for name, section in section_types().items():
        assert hints[name] == section | None, name
