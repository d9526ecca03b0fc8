"""Bad files a user may hand preflight (preflight.input_files): a cluster YAML or a saved report that is binary, huge,
holds an integer Python will not read or aliases that expand into millions of values is answered with exit 2 and one
line naming the file, by a guard that reads it within bounds before Hydra, OmegaConf or the report's schema see it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import preflight

from preflight import compose
from preflight.errors import InputError
from preflight.input_files import MAX_ALIAS_VALUES, MAX_CONFIG_BYTES, MAX_INTEGER_DIGITS, check_config_file, read_json_file

CLUSTER = "name: bad\nmaster: a\nhosts:\n  - {name: a, address: 198.18.0.11, port: 22}\n"


def nested_aliases(width: int, depth: int) -> str:
    """The "billion laughs": a list of width strings, then depth lists of width aliases of the list before."""
    lines = [CLUSTER.rstrip("\n"), f"l0: &l0 [{', '.join(['x'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, depth + 1)]
    return "\n".join(lines) + "\n"


# The three files that once ended in a traceback or in minutes of expansion, and what the one line says of each.
BAD_CLUSTERS: dict[str, tuple[Callable[[], bytes], str]] = {
    "huge-integer": (lambda: CLUSTER.replace("port: 22", f"port: {'9' * 4400}").encode(),
                     f"line 4: an integer of 4400 digits; preflight reads at most {MAX_INTEGER_DIGITS}"),
    "nested-aliases": (lambda: nested_aliases(9, 6).encode(),
                       f"more than {MAX_ALIAS_VALUES} values added once its aliases are expanded (nested aliases multiply): "
                       "preflight's limit for one config file"),
    "binary": (lambda: bytes(range(256)) * 4, "not UTF-8 text (byte 128 is 0x80)"),
}


def user_folder(tmp_path: Path, data: bytes) -> Path:
    folder = tmp_path / "conf"
    (folder / "cluster").mkdir(parents=True)
    (folder / "cluster" / "bad.yaml").write_bytes(data)
    return folder


@pytest.mark.parametrize("case", sorted(BAD_CLUSTERS))
def test_a_bad_cluster_file_is_one_line_naming_it_through_the_console_script(tmp_path: Path, case: str) -> None:
    make, expected = BAD_CLUSTERS[case]
    folder = user_folder(tmp_path, make())
    # The guard's promise is "at once": a generous bound, well above its 0.3 s here, well below the minutes it replaced.
    result = preflight("check", "--config-dir", str(folder), "cluster=bad", cwd=tmp_path, timeout=20)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"preflight: error: cannot read the config file {folder / 'cluster' / 'bad.yaml'}: {expected}\n"


@pytest.mark.parametrize("case", sorted(BAD_CLUSTERS))
def test_the_guard_answers_before_hydra_reads_the_file(tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    make, expected = BAD_CLUSTERS[case]
    folder = user_folder(tmp_path, make())

    def hydra_must_not_run(*_args: object) -> None:
        pytest.fail("Hydra was asked to compose a file the guard should have refused")

    monkeypatch.setattr(compose, "_compose", hydra_must_not_run)
    with pytest.raises(InputError, match=r"bad\.yaml: ") as raised:
        compose.compose_config(["cluster=bad"], str(folder))
    assert expected in str(raised.value)


def test_the_limits_are_where_they_say(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    # Just under every limit: read. 9 ** 5 strings in nested lists are 66,430 values; a 4300-digit integer is readable.
    path.write_text(nested_aliases(9, 4) + f"big: {'9' * MAX_INTEGER_DIGITS}\n")
    check_config_file(path)
    path.write_text(CLUSTER + f"big: {'9' * (MAX_INTEGER_DIGITS + 1)}\n")
    with pytest.raises(InputError, match=f"an integer of {MAX_INTEGER_DIGITS + 1} digits"):
        check_config_file(path)
    path.write_text(CLUSTER + f"big: '{'9' * (MAX_INTEGER_DIGITS + 1)}'\n")  # a string of digits is a string
    check_config_file(path)
    path.write_text(CLUSTER + "# " + "x" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(InputError, match=re.escape(f"{path}: larger than {MAX_CONFIG_BYTES >> 10} KiB")):
        check_config_file(path)
    path.write_text("a: &a [*a]\n")  # an alias of itself: a cycle, counted until the limit
    with pytest.raises(InputError, match="aliases are expanded"):
        check_config_file(path)
    path.write_text("name: [\n")
    with pytest.raises(InputError, match=f'malformed YAML: .* in "{re.escape(str(path))}", line 2'):
        check_config_file(path)


@pytest.mark.parametrize(("text", "expected"), [
    (b'{"exit_code": ' + b"9" * 4400 + b"}", "Exceeds the limit (4300 digits) for integer string conversion"),
    (b"[" * 100_000 + b"]" * 100_000, "nested deeper than Python's JSON reader goes"),
    (b"\x9e\x00\xff", "not UTF-8 text (byte 0 is 0x9e)"),
    (b"{not json", "not JSON: Expecting property name enclosed in double quotes"),
], ids=["huge-integer", "deep", "binary", "not-json"])
def test_a_bad_saved_report_is_one_line_naming_it(tmp_path: Path, text: bytes, expected: str) -> None:
    path = tmp_path / "report.json"
    path.write_bytes(text)
    with pytest.raises(InputError, match="cannot read the report ") as raised:
        read_json_file(path, "report")
    assert expected in str(raised.value) and "\n" not in str(raised.value)
    result = preflight("report", str(path), cwd=tmp_path, timeout=20)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(f"preflight: error: cannot read the report {path}: ") and result.stderr.count("\n") == 1


def test_a_saved_report_larger_than_the_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"padding": "x" * 2048}))
    with pytest.raises(InputError, match=re.escape(f"cannot read the report {path}: larger than 1 KiB")):
        read_json_file(path, "report", limit=1024)
