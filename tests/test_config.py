"""Composition of every config group, and bad input: exit 2, one line naming the key, no traceback."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import pytest

from preflight import compose
from preflight.cli import main
from preflight.compose import load_spec
from preflight.errors import InputError
from preflight.resources import shipped_dir
from preflight.spec import PreflightConfig


def group_options() -> list[tuple[str, str]]:
    options = []
    for folder in (shipped_dir("conf"), shipped_dir("playbooks")):
        for path in sorted(folder.glob("*/*.yaml")):
            options.append((path.parent.name, path.stem))
    return options


@pytest.mark.parametrize(("group", "option"), group_options())
def test_every_group_option_composes(group: str, option: str) -> None:
    spec = load_spec([f"{group}={option}"])
    assert spec.plain[group]


def test_overrides_compose_with_hydra_grammar() -> None:
    spec = load_spec(["cluster=prod", "network.master_port=29600"])
    assert spec.config.cluster.name == "prod" and len(spec.config.cluster.hosts) == 4
    assert spec.config.network.master_port == 29600
    assert spec.master.name == "node01"


def test_digest_follows_the_config() -> None:
    assert load_spec([]).digest == load_spec([]).digest
    assert load_spec([]).digest != load_spec(["network.master_port=29600"]).digest


def test_cfg_job_prints_the_composed_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "cluster=prod", "network.master_port=29600", "--cfg", "job"]) == 0
    out = capsys.readouterr().out
    assert "master_port: 29600" in out and "name: prod" in out


BAD = [
    # (arguments, what the one line must contain)
    (["cluster=nope"], "cluster: no config named 'nope' (available: local, prod"),
    (["playbook=nope"], "playbook: no config named 'nope'"),
    (["pins=nope"], "pins: no config named 'nope'"),
    (["foo=1"], "foo: Key 'foo' not in 'PreflightConfig'"),
    (["cluster.foo=1"], "cluster.foo: Key 'foo' not in 'ClusterConfig'"),
    (["+cluster.foo=1"], "cluster: Additional properties are not allowed ('foo' was unexpected)"),
    (["network.master_port=abc"], "network.master_port: Value 'abc' of type 'str' could not be converted to Integer"),
    (["network.master_port=70000"], "network.master_port: 70000 is greater than the maximum of 65535"),
    (["network.master_port=-1"], "network.master_port: -1 is less than the minimum of 0"),
    (["network.mtu=abc"], "network.mtu: Value 'abc' of type 'str' could not be converted to Integer"),
    (["network.mtu=10"], "network.mtu: 10 is less than the minimum of 68"),
    (["cluster=prod", "cluster.hosts.2.address='n3;rm -rf'"], "cluster.hosts[2].address: 'n3;rm -rf' is not a host name or IP"),
    (["cluster.hosts.0.address='$(reboot)'"], "cluster.hosts[0].address: '$(reboot)' is not a host name or IP"),
    (["cluster.hosts.0.address='`id`'"], "cluster.hosts[0].address: '`id`' is not a host name or IP"),
    (["cluster.hosts.0.address=256.1.1.1"], "cluster.hosts[0].address: '256.1.1.1' is not a host name or IP"),
    (["cluster.hosts.0.address='-oProxyCommand=x'"], "cluster.hosts[0].address: '-oProxyCommand=x' is not a host name or IP"),
    (["cluster.hosts.0.name='a b'"], "cluster.hosts[0].name: 'a b' is not a name"),
    (["cluster.hosts.0.user='root;id'"], "cluster.hosts[0].user: 'root;id' is not a user name"),
    (["cluster.hosts.0.python='python3;id'"], "cluster.hosts[0].python: 'python3;id' is not a path or command"),
    (["cluster.hosts.0.python='python3 -c x'"], "cluster.hosts[0].python: 'python3 -c x' is not a path or command"),
    (["cluster.hosts.0.identity='~/.ssh/$KEY'"], "cluster.hosts[0].identity: '~/.ssh/$KEY' is not a path or command"),
    (["cluster.hosts.0.jump='bastion;id'"], "cluster.hosts[0].jump: 'bastion;id' is not a jump host"),
    (["cluster.hosts.0.jump=bastion:99999"], "cluster.hosts[0].jump: 'bastion:99999' is not a jump host"),
    (["cluster.hosts.0.port=22x"], "cluster.hosts[0].port: Value '22x' of type 'str' could not be converted to Integer"),
    (["cluster.hosts.0.transport=telnet"], "cluster.hosts[0].transport: Invalid value 'telnet'"),
    (["cluster.hosts.0.interface=averyveryverylongname"], "cluster.hosts[0].interface: 'averyveryverylongname' is not an interface name"),
    (["network.socket_ifname='eth0|x'"], "network.socket_ifname: 'eth0|x' is not an interface name"),
    (["cluster.hosts.0.gpus=lots"], "cluster.hosts[0].gpus: 'lots' is not a count or auto"),
    (["cluster.hosts.0.gpus=-1"], "cluster.hosts[0].gpus: '-1' is not a count or auto"),
    (["cluster.master=ghost"], "cluster.master: 'ghost' is not the name of a host in cluster.hosts"),
    (["cluster=prod", "cluster.hosts.1.name=node01"], "cluster.hosts[1].name: 'node01' is already the name of cluster.hosts[0]"),
    # one machine listed twice, in the spellings one address has
    (["cluster=prod", "cluster.hosts.3.address=node02.cluster.internal"],
     "cluster.hosts[3].address: node04's 'node02.cluster.internal' is already the address of cluster.hosts[1] (node02): "
     "one machine listed twice"),
    (["cluster=prod", "cluster.hosts.0.address=Node02.Cluster.Internal"],
     "cluster.hosts[1].address: node02's 'node02.cluster.internal' is already the address of cluster.hosts[0] (node01)"),
    (["cluster=prod", "cluster.hosts.0.address='fe80::1'", "cluster.hosts.2.address='fe80:0:0::1'"],
     "cluster.hosts[2].address: node03's 'fe80:0:0::1' is already the address of cluster.hosts[0] (node01)"),
    (["cluster.hosts=[{name: a}]"], "cluster.hosts[0].address: Missing mandatory value"),
    (["cluster.hosts=5"], "cluster.hosts"),
    (["cluster.hosts=[]"], "cluster.hosts: [] should be non-empty"),
    (["pins.driver='>>1'"], "pins.driver: '>>1' is not a PEP 440 version specifier"),
    (["pins.torch=banana"], "pins.torch: 'banana' is not a PEP 440 version specifier"),
    (["training.backend=mpi"], "training.backend: Invalid value 'mpi', expected one of [auto, nccl, gloo]"),
    (["training.nproc_per_node=x"], "training.nproc_per_node: 'x' is not a count of at least 1 or auto"),
    (["training.init_timeout_s=0"], "training.init_timeout_s: 0 is less than the minimum of 1"),
    (["ssh.host_key_policy=yolo"], "ssh.host_key_policy: 'yolo' is not one of ['strict', 'accept-new']"),
    (["ssh.connect_timeout_s=-1"], "ssh.connect_timeout_s: -1.0 is less than or equal to the minimum of 0"),
    (["ssh.parallelism=0"], "ssh.parallelism: 0 is less than the minimum of 1"),
    (["ssh.known_hosts='/tmp/k h'"], "ssh.known_hosts: '/tmp/k h' is not a path or command"),
    (["thresholds.gpu_memory_used_max_fraction=2"], "thresholds.gpu_memory_used_max_fraction: 2.0 is greater than the maximum of 1"),
    (["thresholds.dev_shm_min_bytes=1GiB"], "thresholds.dev_shm_min_bytes: Value '1GiB' of type 'str' could not be converted to Integer"),
    (["thresholds.gpu_temperature_max_c=500"], "thresholds.gpu_temperature_max_c: 500 is greater than the maximum of 120"),
    (["training.gpu_mig=maybe"], "training.gpu_mig: Value 'maybe' is not a valid bool"),
    (["state_dir='x;rm -rf /'"], "state_dir: 'x;rm -rf /' is not a path or command"),
    (["network.ib_hca=['mlx5 0']"], "network.ib_hca[0]: 'mlx5 0' is not an HCA name"),
    (["playbook.skip_checks=[XX1]"], "playbook.skip_checks[0]: 'XX1' is not a finding code"),
    (["playbook.stages=[nonsense]"], "playbook.stages: unknown stage 'nonsense' in playbook full"),
    (["playbook.stages=[Non-sense]"], "playbook.stages[0]: 'Non-sense' does not match"),
    (["cluster.name=["], "override 'cluster.name=[' is not KEY=VALUE in Hydra's grammar"),
    (["cluster.hosts.0.address=n3;rm"], "override 'cluster.hosts.0.address=n3;rm' is not KEY=VALUE"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--cfg", "hydra"], "argument --cfg: invalid choice: 'hydra'"),
    (["--config-dir", "/nonexistent/preflight"], "--config-dir: '/nonexistent/preflight' is not a folder"),
]


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(("args", "expected"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], args: list[str], expected: str) -> None:
    # A port of its own, should a bad input ever get as far as the collective (the later override of a key wins).
    code, out, err = _run(capsys, ["check", "network.master_port=0", *args])
    assert code == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("preflight: error: ")
    assert expected in lines[0]
    assert "Traceback" not in err


def _user_dir(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


BAD_FILES = [
    ({"cluster/bad.yaml": "name: bad\nhosts: [\n"}, "malformed YAML"),
    ({"cluster/bad.yaml": "name: bad\nmaster: a\nhostz: []\n"}, "Key 'hostz' not in 'ClusterConfig'"),
    ({"cluster/bad.yaml": "name: bad\nmaster: a\nhosts:\n  - {name: a, address: 'a&&b'}\n"},
     "cluster.hosts[0].address: 'a&&b' is not a host name or IP"),
    ({"cluster/bad.yaml": "name: bad\nmaster: a\nhosts:\n  - {name: a, address: a}\n  - {name: b, address: b, port: 'ssh'}\n"},
     "cluster.hosts[1].port: 'ssh' is not of type 'integer'"),
    ({"cluster/bad.yaml": "name: bad\nmaster: a\nhosts:\n  - {name: a, address: a}\n  - {name: b, address: b, colour: red}\n"},
     "cluster.hosts[1]: Additional properties are not allowed ('colour' was unexpected)"),
    ({"cluster/bad.yaml": "# @package _global_\ncluster: {name: bad, master: a, hosts: [{name: a, address: a}]}\n"
                          "pins: {denylist: [{component: driver, specifier: '==1', reason: 'run `id`'}]}\n"},
     "pins.denylist[0].reason: 'run `id`' is not plain text"),
    ({"cluster/bad.yaml": "# @package _global_\ncluster: {name: bad, master: a, hosts: [{name: a, address: a}]}\n"
                          "pins: {denylist: [{component: kernel, specifier: '==1', reason: x}]}\n"},
     "pins.denylist[0].component: 'kernel' is not one of"),
]


@pytest.mark.parametrize(("files", "expected"), BAD_FILES, ids=[e for _, e in BAD_FILES])
def test_bad_config_files_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, files: dict[str, str], expected: str
) -> None:
    folder = _user_dir(tmp_path, files)
    code, _out, err = _run(capsys, ["check", "--config-dir", str(folder), "cluster=bad"])
    assert code == 2
    assert len(err.splitlines()) == 1 and expected in err, err


def test_user_config_dir_adds_clusters_and_keeps_the_shipped_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _user_dir(tmp_path, {"cluster/lab.yaml": "name: lab\nmaster: a\nhosts:\n  - {name: a, address: 198.18.0.11}\n"})
    assert load_spec(["cluster=lab"], str(folder)).config.cluster.name == "lab"
    monkeypatch.setenv("PREFLIGHT_CONFIG_DIR", str(folder))
    assert load_spec(["cluster=lab"]).config.cluster.hosts[0].address == "198.18.0.11"
    assert load_spec(["cluster=prod"]).config.cluster.name == "prod"


def test_explain_unknown_code_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = _run(capsys, ["explain", "PF999"])
    assert code == 2 and err.strip() == "preflight: error: unknown code 'PF999'; `preflight explain` lists them all"


def test_no_subcommand_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = _run(capsys, [])
    assert code == 2 and len(err.splitlines()) == 1


def _string_keys(cls: type, prefix: str = "") -> list[tuple[str, bool]]:
    """Every string-valued key of the config (and whether it is a list of strings), from the dataclasses."""
    keys: list[tuple[str, bool]] = []
    hints = get_type_hints(cls)
    for field in dataclasses.fields(cls):
        kind = hints[field.name]
        args = [a for a in get_args(kind) if a is not type(None)]
        if dataclasses.is_dataclass(kind):
            keys += _string_keys(kind, f"{prefix}{field.name}.")  # type: ignore[arg-type]
        elif get_origin(kind) is list and dataclasses.is_dataclass(args[0]):
            keys += _string_keys(args[0], f"{prefix}{field.name}.0.")
        elif get_origin(kind) is list and issubclass(args[0], str):
            keys.append((f"{prefix}{field.name}", True))
        elif (args and args[0] is str) or (isinstance(kind, type) and issubclass(kind, str)):
            keys.append((f"{prefix}{field.name}", False))
    return keys


STRING_KEYS = _string_keys(PreflightConfig)
INJECTIONS = ["x;touch /tmp/preflight-pwned", "$(touch /tmp/preflight-pwned)", "`touch /tmp/preflight-pwned`",
              "x && touch /tmp/preflight-pwned", "x | tee /tmp/preflight-pwned", "x\ntouch /tmp/preflight-pwned"]


def test_the_walk_finds_the_fields_that_reach_commands() -> None:
    names = {key for key, _ in STRING_KEYS}
    assert {"cluster.hosts.0.address", "cluster.hosts.0.user", "cluster.hosts.0.python", "cluster.hosts.0.identity",
            "cluster.hosts.0.jump", "cluster.hosts.0.interface", "network.socket_ifname", "network.ib_hca", "ssh.known_hosts",
            "state_dir", "pins.denylist.0.reason", "storage.paths.0.path"} <= names
    assert len(names) >= 30


# A list that is empty by default gets an item, so that its item's keys exist to be overridden.
WITH_LIST_ITEMS = ["storage.paths=[{path: /ckpt, shared: true}]"]


@pytest.mark.parametrize("payload", INJECTIONS[:1])
def test_no_string_field_accepts_shell_metacharacters(payload: str) -> None:
    """Every string key, through the whole command-line path (Hydra's grammar, composition, the schema): one payload;
    the next test holds every key to every payload at the schema, where the refusal is made."""
    marker = Path("/tmp/preflight-pwned")
    marker.unlink(missing_ok=True)
    quoted = payload.replace("\\", "\\\\").replace("'", "\\'")
    for key, is_list in STRING_KEYS:
        value = f"['{quoted}']" if is_list else f"'{quoted}'"
        with pytest.raises(InputError) as caught:
            load_spec(["cluster=prod", *WITH_LIST_ITEMS, f"{key}={value}"])
        message = str(caught.value)
        assert "\n" not in message
        assert key.replace(".0.", "[0].") in message or key in message or "Invalid value" in message, (key, message)
    assert not marker.exists()


@pytest.mark.parametrize("payload", INJECTIONS)
def test_every_payload_is_refused_at_the_schema_for_every_string_key(payload: str) -> None:
    from omegaconf import OmegaConf

    from preflight.compose import compose_config
    from preflight.schema_check import schema_errors

    base = OmegaConf.to_container(compose_config(["cluster=prod", *WITH_LIST_ITEMS]), resolve=True)
    assert isinstance(base, dict)
    for key, is_list in STRING_KEYS:
        plain = copy.deepcopy(base)
        parts = key.split(".")
        node: Any = plain
        for part in parts[:-1]:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        node[parts[-1]] = [payload] if is_list else payload
        errors = schema_errors(plain, complete=True)
        assert errors, (key, payload)
        assert any(".".join(str(p) for p in e.absolute_path).startswith(key) for e in errors), (key, [e.message for e in errors])


def _hydra_error(overrides: list[str], config_dir: Path | None = None) -> Exception:
    """The exception the installed Hydra raises for this composition, before preflight words it."""
    with pytest.raises(Exception) as raised:  # any of Hydra's and OmegaConf's, as they come
        compose._compose(overrides, str(config_dir) if config_dir else None)
    return raised.value


def test_hydra_s_words_for_a_missing_option_are_what_compose_reads() -> None:
    text = str(_hydra_error(["cluster=nope"]))
    found, options = compose.MISSING_CONFIG.search(text), compose.AVAILABLE_OPTIONS.search(text)
    assert found is not None and found.group(1) == "cluster/nope", text
    assert options is not None and options.group(1) == "cluster", text
    assert {"local", "prod"} <= {line.strip() for line in options.group(2).splitlines()}, text


def test_hydra_s_and_omegaconf_s_words_for_a_refused_file_are_what_compose_reads(tmp_path: Path) -> None:
    folder = _user_dir(tmp_path, {"cluster/bad.yaml": "name: bad\nmaster: a\nhosts:\n  - {name: b, address: b, port: 'ssh'}\n"})
    error = _hydra_error(["cluster=bad"], folder)
    found = compose.HYDRA_FILE_ERROR.search(str(error))
    assert found is not None, str(error)
    assert found.groups() == ("cluster/bad", "Value 'ssh' of type 'str' could not be converted to Integer", "port")
    cause = error.__cause__ or error.__context__
    message = getattr(cause, "msg", None) or str(cause)
    assert compose.OMEGACONF_DETAILS.split(message, maxsplit=1)[0] == "Value 'ssh' of type 'str' could not be converted to Integer"
    assert len(compose.OMEGACONF_DETAILS.split(message)) > 1, message  # the details it cuts off are there to cut
