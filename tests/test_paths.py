"""Output folders proven writable before any work: the state folder of check and agent, and emit-launch's --out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import free_port
from test_emit import CONF, recorded, saved, spec_of

from preflight.cli import main
from preflight.errors import InputError
from preflight.paths import writable_folder

ERROR = "preflight: error: "


def test_a_folder_is_made_and_left_as_it_was(tmp_path: Path) -> None:
    folder = writable_folder(tmp_path / "a" / "b", "state_dir")
    assert folder == tmp_path / "a" / "b" and folder.is_dir()
    assert list(folder.iterdir()) == []  # the file that proved it writable is gone
    assert writable_folder(folder, "state_dir") == folder


@pytest.mark.parametrize(("path", "why"), [
    ("/proc/x", "No such file or directory"),  # procfs makes no folders
    ("/sys/x", "Operation not permitted"),  # nor does sysfs, even for root
    ("{file}/x", "Not a directory"),
    ("{file}", "File exists"),
])
def test_what_cannot_be_written_is_named_by_its_key(tmp_path: Path, path: str, why: str) -> None:
    file = tmp_path / "file"
    file.write_text("mine\n")
    path = path.format(file=file)
    with pytest.raises(InputError) as caught:
        writable_folder(path, "emit-launch --out")
    assert str(caught.value) == f"emit-launch --out: {path} is not a writable folder: {why}"
    assert file.read_text() == "mine\n"


def test_emit_launch_checks_out_before_reading_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["emit-launch", "--config-dir", str(CONF), "cluster=emit3", "--report", str(tmp_path / "none.json"),
                 "--out", "/proc/x"])
    assert code == 2
    assert capsys.readouterr().err == f"{ERROR}emit-launch --out: /proc/x is not a writable folder: No such file or directory\n"


def test_emit_launch_checks_the_state_folder_before_writing_into_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = saved(tmp_path, recorded("pass", spec_of(), age_h=0))
    base = ["emit-launch", "--config-dir", str(CONF), "cluster=emit3", "--report", str(report)]
    # One host's file goes to stdout: the state folder is neither needed nor made.
    assert main([*base, "--host", "h2", "state_dir=/proc/x"]) == 0
    assert "GLOO_SOCKET_IFNAME=ens5" in capsys.readouterr().out
    # Three hosts' files go under state_dir/launch, which cannot be made.
    blocker = tmp_path / "state"
    blocker.write_text("")
    assert main([*base, f"state_dir={blocker}"]) == 2
    assert capsys.readouterr().err == f"{ERROR}state_dir: {blocker}/launch is not a writable folder: Not a directory\n"
    assert sorted(os.listdir(tmp_path)) == ["report.json", "state"]


def test_agent_rank_0_refuses_a_state_folder_it_cannot_write(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(name, value)
    assert main(["agent", "state_dir=/proc/x"]) == 2
    assert capsys.readouterr().err == f"{ERROR}state_dir: /proc/x is not a writable folder: No such file or directory\n"


def test_an_agent_of_another_rank_saves_nothing_and_does_not_care() -> None:
    from preflight.agent import Place, _accept
    from preflight.compose import load_spec

    spec = load_spec(["playbook=facts", "state_dir=/proc/x"])
    _accept(spec, Place(rank=1, world_size=2, master_addr="127.0.0.1", channel_ports=(1,), run_id="r"))
    with pytest.raises(InputError, match=r"^state_dir: /proc/x is not a writable folder"):
        _accept(spec, Place(rank=0, world_size=2, master_addr="127.0.0.1", channel_ports=(1,), run_id="r"))


def test_the_gate_saves_nothing_and_needs_no_state_folder(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["gate", "state_dir=/proc/x"])
    captured = capsys.readouterr()
    assert code in (0, 1, 3), captured.err
    assert "state_dir" not in captured.err and captured.out.startswith("preflight: ")
