"""Every key of every config group, fuzzed with values it must refuse.

Each override must end `preflight check` with exit 2 and one line on stderr naming the key (or saying that Hydra cannot
parse the override), no traceback, and no host contacted. The test cluster has a host of each transport, and both tell
on their callers: the SSH host's port is a listening socket whose every connection is accepted and counted, and the
local host's python is a script that leaves a marker file when it runs.

The keys are read from the dataclasses of preflight/spec.py and the ranges from the schema, so a field is fuzzed as
soon as it is declared. The strategies know the valid values of each kind of key and draw only outside them.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import socket
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
from conftest import FUZZ_SEED_ENV, preflight
from hypothesis import HealthCheck, Phase, given, note, seed, settings
from hypothesis import strategies as st

from preflight.cli import main
from preflight.compose import load_spec
from preflight.resources import load_schema
from preflight.spec import PreflightConfig
from preflight.stage_list import known_names

SCHEMA = load_schema("spec")
ERROR = "preflight: error: "


@dataclass(frozen=True)
class Key:
    """A config key as an override names it (a list's first item as .0.), its declared type and its values' schema."""

    path: str
    hint: Any  # the declared type, None taken out of an Optional
    optional: bool
    schema: dict[str, Any]

    @property
    def reported(self) -> str:
        """The key as error messages spell it: list items as [0]."""
        return re.sub(r"\.(\d+)(?=\.|$)", r"[\1]", self.path)


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    """The schema of a non-null value: references followed, the null branch of a oneOf left out."""
    while True:
        if "$ref" in node:
            node = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[1]]
        elif "oneOf" in node:
            (node,) = [branch for branch in node["oneOf"] if branch.get("type") != "null"]
        else:
            return node


def config_keys(cls: type, prefix: str = "", node: dict[str, Any] = SCHEMA) -> list[Key]:
    """Every key under cls, recursively, list items included; a field the schema lacks is a KeyError."""
    keys: list[Key] = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        hint = hints[field.name]
        optional = type(None) in typing.get_args(hint)
        if optional:
            (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
        schema = _resolve(node["properties"][field.name])
        path = f"{prefix}{field.name}"
        if dataclasses.is_dataclass(hint):
            keys += config_keys(hint, f"{path}.", schema)  # type: ignore[arg-type]
            continue
        keys.append(Key(path, hint, optional, schema))
        item = typing.get_args(hint)[0] if typing.get_origin(hint) is list else None
        if dataclasses.is_dataclass(item):
            keys += config_keys(item, f"{path}.0.", _resolve(schema["items"]))  # type: ignore[arg-type]
    return keys


KEYS = config_keys(PreflightConfig)

# --- values: each strategy draws override values (Hydra's syntax) that its key must refuse ---------------------------

# In no format at all, prose included: what a shell acts on, and control characters.
SHELL = "`$;|&\\"
CONTROL = "\n\t\r\x00\x1b\x7f"
# Besides those, refused by every format but prose (and, for <, > and space, PEP 440 specifiers).
WORDY = "<> '\"(){}#?"
# Letters, a long s, a Kelvin sign, fullwidth and Arabic digits, a zero-width space. Escaped, not typed: the Kelvin
# sign typed here had become an ASCII "K" (NFKC maps it so), which every format accepts, and a random seed that drew
# it alone failed a valid value as invalid (2026-11-29, PREFLIGHT_FUZZ_SEED=3726414683).
NON_ASCII = "\u00e9\u00df\u0416\u4e2d\u017f\u212a\uff10\u0663\u200b"


@dataclass(frozen=True)
class Format:
    """What the test knows of a schema format: characters that make any string invalid, and its length limits."""

    forbidden: str
    max_len: int | None = None  # a longer string of valid characters is invalid
    empty_ok: bool = False
    invalid: tuple[str, ...] = ()  # more values known to be invalid


STRICT = SHELL + CONTROL + WORDY + NON_ASCII
COUNT_INVALID = ("-1", "1.5", "12345", "1e3", "0x10", "٣", "8\n", " 8", "auto\n", "AUTO")
FORMATS = {
    "name": Format(STRICT, 63, invalid=("-a", ".a", "a\n")),
    "host": Format(STRICT, 253, invalid=("fe80::1%$(reboot)", "fe80::1%a b", "256.1.1.1", "1.2.3", "-oProxyCommand=x", "gpu01\n")),
    "user": Format(STRICT, 32, invalid=("1root", "root\n")),
    "path": Format(STRICT, 4096, invalid=("python3\n",)),
    "absolute-path": Format(STRICT, 4096, invalid=("ckpt", "~/ckpt", "./ckpt", "/ckpt/../etc", "/ckpt/.", "/ckpt\n")),
    "jump": Format(STRICT, invalid=("bastion:٢٢", "bastion:0", "bastion:65536", "a@b@", "bastion\n")),
    "interface-or-auto": Format(STRICT, 15, invalid=("eth0\n",)),
    "interface": Format(STRICT, 15, invalid=("auto", "eth1\n")),
    "count-or-auto": Format(STRICT, 4, invalid=COUNT_INVALID),
    "positive-count-or-auto": Format(STRICT, 4, invalid=(*COUNT_INVALID, "0", "00", "0000")),
    "hca": Format(STRICT, invalid=("mlx5_0:1234", "mlx5_0:", "mlx5_0\n")),
    "pep440-specifier": Format(SHELL + CONTROL + "'\"(){}#?" + NON_ASCII, empty_ok=True,
                               invalid=(">>1", "banana", ">=1\n", "==1.0.poſt1", ">=2.4,<3;")),
    # Empty where the schema allows it (a denylist entry's source); a minLength says otherwise.
    "prose": Format(SHELL + CONTROL + "<>", empty_ok=True),
    "argument": Format(STRICT.replace("[", "").replace("]", ""), 4096, empty_ok=True, invalid=("x\n",)),
    "finding-code": Format(STRICT, 5, invalid=("PF1", "PF1234", "pf101", "XX101", "PF101\n")),
}

# The strings a key with a pattern refuses, per pattern. A stage's name: any text that is not a name the stage list
# knows (a well-formed unknown one is refused by the run, before any host, as a malformed one is by the schema).
KNOWN_STAGES = set(known_names())
PATTERNS: dict[str, list[st.SearchStrategy[str]]] = {
    "^[a-z][a-z0-9_]{0,31}$": [
        st.text(max_size=40).filter(lambda t: t not in KNOWN_STAGES and "${" not in t and not t.endswith("$")),
        st.sampled_from(["", "Facts", "1facts", "_facts", "facts\n", "face-ts", "a" * 33, "hostname", "sweep_"])],
}

# Text around a forbidden character: anything, but no interpolation (${...} resolves, maybe to a valid value).
_AROUND = st.text(max_size=12).filter(lambda t: "${" not in t and not t.endswith("$"))


def quote(text: str) -> str:
    """text as one quoted string in Hydra's grammar: quotes escaped, and the backslashes before a quote or the end."""
    body = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    body = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, body)
    return f"'{body}'"


def _containing(chars: str) -> st.SearchStrategy[str]:
    """Strings holding at least one of chars, anything around it."""
    return st.tuples(_AROUND, st.sampled_from(chars), _AROUND).map("".join).filter(lambda t: "${" not in t)


def string_kinds(schema: dict[str, Any]) -> list[st.SearchStrategy[str]]:
    """Kinds of strings (not yet quoted) a string key with this schema refuses."""
    if "enum" in schema:
        members = {str(m) for m in schema["enum"]}
        # OmegaConf also reads an enum's member as Class.member; ??? is OmegaConf's missing value, refused too.
        other = st.text(max_size=12).filter(lambda t: t not in members and t.rpartition(".")[2] not in members and "${" not in t)
        return [_containing(SHELL + CONTROL + WORDY), other, st.sampled_from(["", "AUTO", "local ", *(f"{m}\n" for m in members)])]
    if "pattern" in schema:
        return PATTERNS[schema["pattern"]]
    rules = FORMATS[schema["format"]]
    kinds = [_containing(rules.forbidden)]
    if rules.invalid:
        kinds.append(st.sampled_from(rules.invalid))
    if rules.max_len is not None:
        kinds.append(st.integers(rules.max_len + 1, rules.max_len + 100).map(lambda n: "a" * n))
    if not rules.empty_ok or schema.get("minLength", 0) > 0:
        kinds.append(st.just(""))
    return kinds


def _bounds(schema: dict[str, Any]) -> tuple[float, bool, float, bool]:
    lo, lo_open = (schema["exclusiveMinimum"], True) if "exclusiveMinimum" in schema else (schema["minimum"], False)
    hi, hi_open = (schema["exclusiveMaximum"], True) if "exclusiveMaximum" in schema else (schema["maximum"], False)
    return lo, lo_open, hi, hi_open


def number_kinds(schema: dict[str, Any]) -> list[st.SearchStrategy[str]]:
    """Numbers below and above the schema's bounds, and for an integer key any number with a point."""
    lo, lo_open, hi, hi_open = _bounds(schema)
    below = st.integers(max_value=math.floor(lo) if lo_open else math.ceil(lo) - 1)
    above = st.integers(min_value=math.ceil(hi) if hi_open else math.floor(hi) + 1)
    if schema["type"] == "integer":
        # OmegaConf takes no float into an int, not even 2.0.
        return [below.map(str), above.map(str), st.floats(allow_nan=False, allow_infinity=False).map(repr)]
    finite = {"allow_nan": False, "allow_infinity": False}
    return [below.map(str), above.map(str),
            st.floats(max_value=lo, **finite).filter(lambda x: x < lo or (lo_open and x <= lo)).map(repr),
            st.floats(min_value=hi, **finite).filter(lambda x: x > hi or (hi_open and x >= hi)).map(repr)]


# Characters no number has (int() and float() also read text with spaces around it, or in other scripts' digits).
NOT_NUMERIC = SHELL + "<>'\"(){}#?x"
# Wrong types, as Hydra reads them: containers, booleans, the empty string.
CONTAINERS = ("[]", "[1]", "['a', 'b']", "{a: 1}", "{}")
NOT_FINITE = ("nan", "NaN", "inf", "+inf", "-inf", "1e400", "-1e400")
HUGE = (str(2**80), str(-(2**80)), str(10**400), "1" + "0" * 5000)  # the last has more digits than Python reads


def kinds_of_invalid(key: Key) -> list[st.SearchStrategy[str]]:
    """Kinds of override values (Hydra's syntax) key must refuse; an AssertionError for a kind of key the test does not
    know, so that a new one is taught its invalid values here."""
    null = [] if key.optional else ["null"]
    origin = typing.get_origin(key.hint)
    if key.hint in (int, float):
        return [*number_kinds(key.schema), st.sampled_from(NOT_FINITE), st.sampled_from(HUGE), _containing(NOT_NUMERIC).map(quote),
                st.sampled_from([*CONTAINERS, "true", "false", "''", *null])]
    if key.hint is bool:
        # OmegaConf reads any integer (in text too) and yes/no/on/off/y/n as a bool; floats, containers, other text not.
        return [_containing(NOT_NUMERIC).map(quote), st.floats().map(repr), st.sampled_from(["maybe", "''", *CONTAINERS, *null])]
    if origin is list:
        item = typing.get_args(key.hint)[0]
        if dataclasses.is_dataclass(item):
            items = st.sampled_from(["[5]", "['a']", "[[1]]", "[{bogus: 1}]", "[{}]"])
        else:
            items = st.one_of(string_kinds(_resolve(key.schema["items"]))).map(lambda t: f"[{quote(t)}]")
        kinds = [items, st.sampled_from(["5", "'a'", "{a: 1}", *null])]
        if key.schema.get("minItems", 0) > 0:
            kinds.append(st.just("[]"))
        members = _resolve(key.schema["items"]).get("enum") or (sorted(KNOWN_STAGES) if key.path == "playbook.stages" else None)
        if key.schema.get("uniqueItems") and members:
            kinds.append(st.sampled_from(members).map(lambda m: f"[{m}, {m}]"))
        return kinds
    if origin is dict:
        values = st.one_of(string_kinds(_resolve(key.schema["additionalProperties"])))
        return [values.map(lambda t: f"{{NCCL_P2P_DISABLE: {quote(t)}}}"), st.sampled_from(["5", "'a'", "[a]", *null])]
    if isinstance(key.hint, type) and issubclass(key.hint, (str, Enum)):
        return [*(kind.map(quote) for kind in string_kinds(key.schema)), st.sampled_from(["['a']", "{a: b}", *null])]
    raise AssertionError(f"{key.path}: the fuzz has no strategy for {key.hint!r}; teach kinds_of_invalid() its invalid values")


def invalid_values(key: Key) -> st.SearchStrategy[str]:
    """Any value of any kind key must refuse."""
    return st.one_of(kinds_of_invalid(key))


# --- the cluster whose hosts tell on their callers -------------------------------------------------------------------

class Listener:
    """A listening TCP socket on 127.0.0.1 standing in for an SSH server: the kernel completes every connection into
    its backlog, and contacts() accepts and counts them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.sock.setblocking(False)
        self.port = int(self.sock.getsockname()[1])
        self.accepted: list[Any] = []

    def contacts(self) -> int:
        """Connections made so far, each accepted and closed."""
        while True:
            try:
                connection, peer = self.sock.accept()
            except BlockingIOError:
                return len(self.accepted)
            connection.close()
            self.accepted.append(peer)


@dataclass
class Hosts:
    """The fuzz's cluster: its config folder, the SSH host's listener, and the marker the local host's python leaves."""

    folder: Path
    work: Path  # the working folder of the console script's runs
    listener: Listener
    marker: Path

    def argv(self, *overrides: str) -> list[str]:
        """`preflight check` on this cluster with these overrides."""
        return ["check", "--config-dir", str(self.folder), "cluster=fuzz", *overrides]

    def assert_untouched(self) -> None:
        """No host was contacted: nothing connected to the SSH port and the local python never ran."""
        assert self.listener.contacts() == 0, f"the SSH host was contacted from {self.listener.accepted}"
        assert not self.marker.exists(), f"the local host's python ran: {self.marker.read_text()}"


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    root = tmp_path_factory.mktemp("fuzz")
    marker = root / "python-ran"
    python = root / "python"
    python.write_text(f'#!/bin/sh\necho "$0 $*" >> {marker}\nexit 1\n')
    python.chmod(0o755)
    listener = Listener()
    (root / "conf" / "cluster").mkdir(parents=True)
    (root / "conf" / "cluster" / "fuzz.yaml").write_text(
        "# @package _global_\n"
        "cluster:\n"
        "  name: fuzz\n"
        "  master: here\n"
        "  hosts:\n"
        f"    - {{name: here, address: 127.0.0.2, transport: local, python: {python}, gpus: '0'}}\n"
        f"    - {{name: there, address: 127.0.0.1, transport: ssh, port: {listener.port}, user: root, gpus: '0'}}\n"
        # A storage path, so that the keys of storage.paths' items exist to be overridden.
        "storage: {paths: [{path: /tmp/preflight-fuzz}]}\n"
        # Should a value get through, the run it starts ends soon.
        "ssh: {connect_timeout_s: 2, command_timeout_s: 5, run_timeout_s: 10}\n"
        f"state_dir: {root / 'state'}\n")
    (root / "work").mkdir()
    try:
        yield Hosts(root / "conf", root / "work", listener, marker)
    finally:
        listener.sock.close()


def assert_refused(code: int, out: str, err: str, key: Key, override: str) -> None:
    """Exit 2, nothing on stdout, one line on stderr naming the key (or Hydra's parse error), no traceback."""
    assert code == 2, (override, code, out[-2000:], err[-2000:])
    assert out == "", (override, out[-2000:])
    assert "Traceback" not in err, (override, err[-3000:])
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(ERROR), (override, err[-3000:])
    assert lines[0].isprintable(), (override, lines[0][:500])  # a value's control characters are shown escaped
    message = lines[0].removeprefix(ERROR)
    names_key = any(re.match(rf"{re.escape(name)}(?=[:.\[])", message) for name in (key.reported, key.path))
    assert names_key or message.startswith(f"override {override!r} is not KEY=VALUE"), (override, message[:500])


def _check_in_process(hosts: Hosts, capsys: pytest.CaptureFixture[str], key: Key, value: str) -> None:
    override = f"{key.path}={value}"
    code = main(hosts.argv(override))
    captured = capsys.readouterr()
    assert_refused(code, captured.out, captured.err, key, override)
    hosts.assert_untouched()


QUICK = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
# No shrinking: an example is one key and one value, small as drawn, and each costs a composition (a quarter of a second,
# seconds under the suite's load): a failure shrunk for five minutes in one suite run of 2026-11-26, and the example it
# ended on (cluster.name='K') did not fail again when replayed. The example as drawn is the one to read, with its seed.
AS_DRAWN = (Phase.explicit, Phase.reuse, Phase.generate)


# Every key, with a fixed seed: the same values every run. One composition costs Hydra a quarter of a second, so each key
# gets one value, the simplest of one kind; the kind taken first turns from key to key, which spreads the kinds over
# the keys (a boundary here, NaN there, a list for a number, a newline in a name).
@pytest.mark.parametrize("index", range(len(KEYS)), ids=[k.path for k in KEYS])
@settings(max_examples=1, deadline=None, derandomize=True, database=None, suppress_health_check=QUICK)
@given(data=st.data())
def test_every_key_refuses_invalid_values(hosts: Hosts, capsys: pytest.CaptureFixture[str], index: int, data: st.DataObject) -> None:
    key = KEYS[index]
    kinds = kinds_of_invalid(key)
    turn = index % len(kinds)
    _check_in_process(hosts, capsys, key, data.draw(st.one_of(kinds[turn:] + kinds[:turn]), label="value"))


# Any key, any kind, any value, with a new seed each run unless PREFLIGHT_FUZZ_SEED gives one (conftest.py picks it and
# pytest's header says it): a failure prints the key, the value drawn and the seed that replays the run.
FUZZ_SEED = int(os.environ[FUZZ_SEED_ENV])


@settings(max_examples=20, deadline=None, database=None, suppress_health_check=QUICK, phases=AS_DRAWN)
@seed(FUZZ_SEED)
@given(data=st.data())
def test_any_key_refuses_invalid_values_random_seed(hosts: Hosts, capsys: pytest.CaptureFixture[str], data: st.DataObject) -> None:
    note(f"replay with {FUZZ_SEED_ENV}={FUZZ_SEED} python3 -m pytest tests/test_config_fuzz.py")
    key = data.draw(st.sampled_from(KEYS), label="key")
    _check_in_process(hosts, capsys, key, data.draw(invalid_values(key), label="value"))


@settings(max_examples=2, deadline=None, database=None, suppress_health_check=QUICK, phases=AS_DRAWN)
@seed(20240611)
@given(data=st.data())
def test_the_console_script_refuses_invalid_values(hosts: Hosts, data: st.DataObject) -> None:
    """As users run it: a warning or a log line on stderr, which the in-process runs cannot see, would show here."""
    key = data.draw(st.sampled_from(KEYS), label="key")
    override = f"{key.path}={data.draw(invalid_values(key), label='value')}"
    result = preflight(*hosts.argv(override), cwd=hosts.work, timeout=60)
    assert_refused(result.returncode, result.stdout, result.stderr, key, override)
    hosts.assert_untouched()


# --- the key list, the strategies and the hosts' telltales themselves -------------------------------------------------

def test_every_key_is_found_and_has_a_strategy() -> None:
    paths = {key.path for key in KEYS}
    assert {"cluster.hosts", "cluster.hosts.0.name", "cluster.hosts.0.port", "pins.denylist.0.workaround_env",
            "collective.profiles.0.gpu_name", "collective.profiles.0.all_gather_busbw_gbps", "training.nproc_per_node",
            "playbook.stages", "launch.script_args", "state_dir", "storage.paths.0.path", "storage.paths.0.write_bytes",
            "storage.timeout_s"} <= paths
    assert len(paths) == len(KEYS) >= 75
    for key in KEYS:
        invalid_values(key)  # raises for a kind of key without a strategy, or a format the fuzz does not know


def test_every_number_has_a_lower_and_an_upper_bound() -> None:
    for key in KEYS:
        if key.hint in (int, float):
            assert {"minimum", "exclusiveMinimum"} & set(key.schema), key.path
            assert {"maximum", "exclusiveMaximum"} & set(key.schema), key.path


RANGES = [
    # (key, the lowest valid value and the lowest invalid one below it, the same above); None: no such bound
    ("ssh.parallelism", 1, 0, 1024, 1025),
    ("collective.iters", 1, 0, 10000, 10001),
    ("playbook.repeats", 1, 0, 1000, 1001),
    ("collective.verify_bytes", 4, 3, 16 << 30, (16 << 30) + 1),
    ("collective.sweep_min_bytes", 1, 0, 1 << 40, (1 << 40) + 1),
    ("collective.sweep_max_bytes", 1, 0, 1 << 40, (1 << 40) + 1),
    ("thresholds.gpu_memory_used_max_fraction", 0, -0.001, 1, 1.001),
    ("network.master_port", 0, -1, 65535, 65536),
    ("cluster.hosts.0.port", 1, 0, 65535, 65536),
    ("network.mtu", 68, 67, 65536, 65537),
    ("ssh.connect_timeout_s", 0.001, 0, 86400, 86400.5),
    ("thresholds.clock_skew_max_s", 0.001, 0, 86400, 86400.5),
    ("playbook.deadline_s", 0.001, 0, 86400, 86400.5),
    ("storage.paths.0.write_bytes", 4096, 4095, 16 << 30, (16 << 30) + 1),
    ("storage.paths.0.min_free_bytes", 0, -1, 1 << 50, (1 << 50) + 1),
]


@pytest.mark.parametrize(("path", "low", "too_low", "high", "too_high"), RANGES, ids=[r[0] for r in RANGES])
def test_ranges_are_what_a_user_expects(path: str, low: float, too_low: float, high: float, too_high: float) -> None:
    import jsonschema

    (key,) = [k for k in KEYS if k.path == path]
    for valid in (low, high):
        jsonschema.validate(valid, key.schema)
    for invalid in (too_low, too_high):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(invalid, key.schema)


def test_quote_round_trips_through_hydra() -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for text in ["", "a b", "it's", "a\\", "a\\'b", "\\\\'", "$(reboot)", "x\ny", "'", "\\"]:
        (override,) = parser.parse_overrides([f"a.b={quote(text)}"])
        assert override.value() == text


def test_the_hosts_do_tell_when_contacted(hosts: Hosts, capsys: pytest.CaptureFixture[str]) -> None:
    """The telltales are not vacuous: a valid check contacts both hosts, and both notice."""
    code = main(hosts.argv("playbook=facts", "ssh.connect_timeout_s=0.5"))
    capsys.readouterr()
    assert code == 3  # neither host can be checked: the python fails, the SSH server never answers
    assert hosts.listener.contacts() >= 1
    assert hosts.marker.exists()
    hosts.marker.unlink()
    hosts.listener.accepted.clear()


# --- the cases users reported -----------------------------------------------------------------------------------------

REPORTED = [
    ("state_dir=/proc/x", "state_dir: /proc/x is not a writable folder: No such file or directory"),
    ("training.nproc_per_node=0", "training.nproc_per_node: '0' is not a count of at least 1 or auto"),
    ("thresholds.clock_skew_max_s=nan", "thresholds.clock_skew_max_s: nan is not a finite number"),
]


@pytest.mark.parametrize(("override", "expected"), REPORTED, ids=[o for o, _ in REPORTED])
def test_reported_cases_are_refused_before_any_host(hosts: Hosts, override: str, expected: str) -> None:
    before = sorted(hosts.work.rglob("*"))
    result = preflight(*hosts.argv(override), cwd=hosts.work, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"{ERROR}{expected}\n")
    hosts.assert_untouched()
    assert sorted(hosts.work.rglob("*")) == before  # nothing written, the report least of all
    assert not Path("/proc/x").exists()


def test_a_cpu_host_still_declares_zero_gpus(hosts: Hosts) -> None:
    spec = load_spec(["cluster=fuzz", "cluster.hosts.0.gpus=0", "training.nproc_per_node=1"], str(hosts.folder))
    assert spec.config.cluster.hosts[0].gpus == "0" and spec.config.training.nproc_per_node == "1"


def test_sweep_bounds_in_order(hosts: Hosts, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(hosts.argv("collective.sweep_min_bytes=8192", "collective.sweep_max_bytes=4096"))
    err = capsys.readouterr().err
    assert code == 2 and err == f"{ERROR}collective.sweep_min_bytes: 8192 is more than collective.sweep_max_bytes (4096)\n"
    hosts.assert_untouched()
    assert load_spec(["collective.sweep_min_bytes=4096", "collective.sweep_max_bytes=4096"]).config.collective.sweep_max_bytes == 4096


def test_the_check_saves_nothing_where_it_cannot(hosts: Hosts, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file where the state folder should be: refused before the run, the file untouched."""
    blocker = tmp_path / "file"
    blocker.write_text("mine\n")
    code = main(hosts.argv(f"state_dir={blocker}/state"))
    assert code == 2
    assert capsys.readouterr().err == f"{ERROR}state_dir: {blocker}/state is not a writable folder: Not a directory\n"
    assert blocker.read_text() == "mine\n" and os.listdir(tmp_path) == ["file"]
    hosts.assert_untouched()
