"""Adding a stage is its package and one entry in stage_list.STAGES: the example stage in tests/hostname_stage, registered
by that one entry, is a name the playbook may give, and reaches the JSON report, the report schema written with it, the
terminal, the HTML page and `preflight explain` (its remedies, from its package)."""

from __future__ import annotations

import io
import socket
import typing
from typing import cast

import hostname_stage.stage
import jsonschema
import pytest
from hostname_stage.contracts import HostnameSection
from hostname_stage.stage import NAME, REMEDIES

from preflight import report as report_module
from preflight.catalogue import explain
from preflight.compose import load_spec
from preflight.errors import InputError
from preflight.pipeline import run_check
from preflight.report import render
from preflight.report_html import report_html
from preflight.report_shape import StageSections
from preflight.resources import validator
from preflight.schemas_gen import report_schema
from preflight.stage_list import STAGES, StageEntry, playbook_stages, section_types
from preflight.stages import Stage

FIX = "Rename the host to at most 63 characters (hostnamectl set-hostname NAME)."  # PF990's fix in its remedies.yaml


def _hostname_stage() -> Stage:
    from hostname_stage.stage import STAGE
    return STAGE


def test_a_stage_from_outside_is_its_package_and_one_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    # The playbook names the stage as it names any; until the stage list has its entry, a run refuses the name.
    spec = load_spec(["cluster=local", "playbook=facts", "training.backend=gloo", f"playbook.stages=[facts,{NAME}]"])
    with pytest.raises(InputError, match=f"unknown stage '{NAME}'"):
        playbook_stages(spec.config)
    # The one line a stage adds to stage_list.STAGES, here after the shipped ones.
    monkeypatch.setitem(STAGES, NAME, StageEntry(_hostname_stage, HostnameSection, remedies=REMEDIES))

    schema = report_schema()  # what python3 -m preflight.schemas_gen writes with the stage registered
    assert schema["properties"][NAME] == {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/HostnameSection"}]}
    assert schema["$defs"]["HostnameLength"]["properties"]["length"] == {
        "type": "integer", "minimum": 0, "maximum": 253, "description": "characters in hostname; a DNS name has at most 253"}
    checker = validator("report").format_checker
    # The run validates its report against the schema as that command would write it.
    monkeypatch.setattr(report_module, "validator", lambda name: jsonschema.Draft202012Validator(schema, format_checker=checker))
    # This machine's hostname is one DNS label: a limit one under its length makes PF990 fail, with its remedy's fix.
    hostname = socket.gethostname()
    assert len(hostname) >= 2, hostname
    monkeypatch.setattr(hostname_stage.stage, "LONGEST", len(hostname) - 1)
    report = run_check(spec)

    section = cast(dict[str, HostnameSection], report)[NAME]
    host = spec.config.cluster.hosts[0].name
    assert section == {"longest": len(hostname) - 1, "hosts": [{"host": host, "hostname": hostname, "length": len(hostname)}]}
    (finding,) = [f for f in report["findings"] if f["code"] == "PF990"]
    assert (finding["status"], finding["remedy"], report["status"]) == ("fail", FIX, "fail")
    jsonschema.Draft202012Validator(schema, format_checker=checker).validate(report)
    with pytest.raises(jsonschema.ValidationError):  # the schema judges the section's shape
        jsonschema.Draft202012Validator(schema).validate({**report, NAME: {"longest": 63, "hosts": [{"host": "h"}]}})
    assert list(report)[-1] == NAME and set(section_types()) - set(StageSections.__annotations__) == {NAME}

    from rich.console import Console
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(render(report, show_all=True))
    assert f"hostname FAIL  hostname lengths: {host}: {len(hostname)}" in out.getvalue()
    assert f"fix: {FIX}" in out.getvalue()
    page = report_html(report)
    assert '<h2 id="hostname">Hostname lengths</h2>' in page and f"<td>{len(hostname)}</td>" in page and FIX in page
    # Its remedies are the catalogue's too, from its package: `preflight explain PF990`.
    assert explain("pf990").splitlines()[0] == "PF990  Hostname longer than one DNS label" and f"fix: {FIX}" in explain("PF990")


def test_each_shipped_entry_names_the_section_type_the_report_shape_gives_it() -> None:
    hints = typing.get_type_hints(StageSections)
    assert set(hints) == set(section_types())
    for name, section in section_types().items():
        assert hints[name] == section | None, name
