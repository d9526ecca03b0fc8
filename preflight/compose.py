"""Compose the Spec: Hydra configs + overrides -> validated, typed PreflightConfig.

Bad input stops here, before anything touches a host, as an InputError whose message is one
line naming the key path and what is wrong.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from preflight import config_cache
from preflight.errors import InputError, brief, one_line
from preflight.input_files import check_config_folder
from preflight.records import rail_interfaces, rails_declared
from preflight.resources import load_schema, shipped_dir, user_config_dir
from preflight.spec import HIGHEST_PORT, HostSpec, PreflightConfig, from_plain, highest_derived_port, register_configs

# Hydra and OmegaConf (0.4 s to import) are imported where composition needs them: a cached config needs neither.
if TYPE_CHECKING:
    from hydra.errors import MissingConfigException
    from omegaconf import DictConfig
    from omegaconf.errors import OmegaConfBaseException

CONFIG_DIR_ENV = "PREFLIGHT_CONFIG_DIR"

# Strings that may reach a command line: letters, digits and a few safe separators only.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
_PATH = re.compile(r"^[A-Za-z0-9_./~+@,=:-]{1,4096}$")
# An absolute path of the same safe characters, with no '.' or '..' step: the folder named is the folder checked.
_ABSOLUTE_PATH = re.compile(r"^(?!.*/\.{1,2}(/|$))/[A-Za-z0-9_./+@,=:-]{0,4095}$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.@-]{1,15}$")  # Linux IFNAMSIZ is 16 with the NUL
_HCA = re.compile(r"^[A-Za-z0-9_]{1,64}(:[0-9]{1,3})?$")
_COUNT = re.compile(r"^[0-9]{1,4}$")
_FINDING_CODE = re.compile(r"^PF[0-9]{3}$")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
_POSITIVE_COUNT = re.compile(r"^(?!0+$)[0-9]{1,4}$")
# Prose (denylist reasons) is shown to people, never run; still no shell-active characters.
_PROSE_FORBIDDEN = re.compile(r"[`$;|&<>\\\x00-\x1f\x7f]")
# A training script's argument or an env value: what options and Hydra overrides need, nothing a shell acts on unquoted
# besides brackets (and it is always quoted).
_ARGUMENT = re.compile(r"^[A-Za-z0-9_./~+@,=:%\[\]-]{0,4096}$")


def _full(pattern: re.Pattern[str]) -> Callable[[str], bool]:
    # fullmatch, never match: a pattern's "$" also matches before a final newline, which would let "gpu01\n" through.
    return lambda value: pattern.fullmatch(value) is not None


def _is_host(value: str) -> bool:
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return _full(_HOSTNAME)(value) and not value.replace(".", "").isdigit()
    # An IPv6 zone (fe80::1%eth0) may be any text to ipaddress; it is an interface name.
    zone = address.scope_id if isinstance(address, ipaddress.IPv6Address) else None
    return zone is None or _full(_IFNAME)(zone)


def _is_jump(value: str) -> bool:
    user, _, rest = value.rpartition("@")
    host, _, port = rest.partition(":")
    if user and not _full(_USER)(user):
        return False
    # isdigit() alone also takes other scripts' digits, which int() reads and ssh does not.
    if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        return False
    return _is_host(host)


def _is_specifier(value: str) -> bool:
    # packaging strips surrounding whitespace (newlines too) and matches letters case-insensitively across scripts
    # ("ſ" is "s"): only printable ASCII is a specifier here.
    if not (value.isascii() and value.isprintable()):
        return False
    try:
        SpecifierSet(value)
        return True
    except InvalidSpecifier:
        return False


# format name -> (test, what a valid value is, for the error message)
_FORMATS: dict[str, tuple[Callable[[str], bool], str]] = {
    "name": (_full(_NAME), "a name (letters, digits, '.', '_', '-')"),
    "host": (_is_host, "a host name or IP"),
    "user": (_full(_USER), "a user name"),
    "path": (_full(_PATH), "a path or command without spaces or shell metacharacters"),
    "absolute-path": (_full(_ABSOLUTE_PATH), "an absolute path without spaces, shell metacharacters or '.' and '..' steps"),
    "jump": (_is_jump, "a jump host as [user@]host[:port]"),
    "interface-or-auto": (_full(_IFNAME), "an interface name (at most 15 characters) or auto"),
    "interface": (lambda v: v != "auto" and _full(_IFNAME)(v), "an interface name (at most 15 characters), not auto"),
    "count-or-auto": (lambda v: v == "auto" or _full(_COUNT)(v), "a count or auto"),
    "positive-count-or-auto": (lambda v: v == "auto" or _full(_POSITIVE_COUNT)(v), "a count of at least 1 or auto"),
    "hca": (_full(_HCA), "an HCA name such as mlx5_0 or mlx5_0:1"),
    "pep440-specifier": (_is_specifier, "a PEP 440 version specifier such as >=2.4,<3"),
    "prose": (lambda v: not _PROSE_FORBIDDEN.search(v), "plain text without `$;|&<>\\ or control characters"),
    "argument": (_full(_ARGUMENT), "an argument of letters, digits and _./~+@,=:%[]-"),
    # Formats rather than the schema's "pattern", which Python searches with "$" matching before a final newline.
    "finding-code": (_full(_FINDING_CODE), "a finding code such as PF203"),
    "env-name": (_full(_ENV_NAME), "an environment variable name (A-Z, 0-9, _)"),
}

def _for_strings(test: Callable[[str], bool]) -> Callable[[object], bool]:
    # As in JSON Schema's own formats, a value of another type is the "type" keyword's business.
    return lambda value: not isinstance(value, str) or test(value)


_FORMAT_CHECKER = jsonschema.FormatChecker(formats=())
for _fmt, (_test, _) in _FORMATS.items():
    _FORMAT_CHECKER.checkers[_fmt] = (_for_strings(_test), ())


def _is_finite_number(checker: jsonschema.TypeChecker, instance: object) -> bool:
    # Python's floats have NaN and infinities, JSON's numbers do not. NaN passes every bound (no comparison with it is
    # true): a NaN deadline would pass "exclusiveMinimum: 0". No number of the config may be one of them.
    if isinstance(instance, float) and not math.isfinite(instance):
        return False
    return bool(jsonschema.Draft202012Validator.TYPE_CHECKER.is_type(instance, "number"))


# extend() has no types in jsonschema's stubs; its result is a validator class like the one it extends.
_VALIDATOR: type[jsonschema.protocols.Validator] = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("number", _is_finite_number),
)


@dataclass(frozen=True)
class Spec:
    """A validated configuration: the typed tree, its plain form, and a hash of it."""

    config: PreflightConfig
    plain: dict[str, Any]  # the same config as plain JSON: what the schema validates and the digests hash
    digest: str  # sha256 of the composed config, so a report can be matched to its config

    def group_digests(self) -> dict[str, str]:
        """sha256 of each config group that defines the job (JOB_GROUPS): emit-launch matches a report on these."""
        return {group: _sha256(self.plain[group]) for group in JOB_GROUPS}

    @property
    def master(self) -> HostSpec:
        """The master host, which validation made sure is in the cluster."""
        master = self.config.cluster.host(self.config.cluster.master)
        if master is None:
            raise InputError(f"cluster.master: {self.config.cluster.master!r} is not the name of a host in cluster.hosts")
        return master


# The groups that decide what a job is; the rest (ssh, collective, playbook, launch) decide how it is checked or emitted.
JOB_GROUPS = ("cluster", "pins", "network", "training", "thresholds")


def _sha256(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _key_path(parts: Sequence[Any]) -> str:
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "(root)"


MESSAGE_CHARS = 400  # jsonschema's messages quote the value: a list of 12,000 hosts was 2.4 MB on one "line"


def _schema_message(error: jsonschema.ValidationError) -> str:
    """One line of at most MESSAGE_CHARS: the key (a host by its index in cluster.hosts), what is wrong with its value."""
    path = _key_path(list(error.absolute_path))
    if error.validator == "format":
        text = f"{brief(error.instance)} is not {_FORMATS[str(error.validator_value)][1]}"
    elif error.validator == "type" and isinstance(error.instance, float) and not math.isfinite(error.instance):
        text = f"{error.instance!r} is not a finite number"
    elif error.validator == "oneOf" and any(sub.validator != "type" or sub.validator_value != "null" for sub in error.context or []):
        # The null branch is never the interesting one; report the typed branch's complaint.
        return next(_schema_message(sub) for sub in error.context or []
                    if sub.validator != "type" or sub.validator_value != "null")
    else:
        # jsonschema's messages start with the value's repr, however large; a long one is said briefly instead.
        quoted = repr(error.instance)
        text = error.message if len(quoted) <= 80 else error.message.replace(quoted, brief(error.instance))
    return f"{path}: {text}" if len(path) + len(text) + 2 <= MESSAGE_CHARS else f"{path}: {text}"[:MESSAGE_CHARS - 3] + "..."


def _first_problem(errors: Sequence[jsonschema.ValidationError]) -> str:
    """The first error's line, and how many more there are."""
    more = len(errors) - 1
    return _schema_message(errors[0]) + (f" (and {more:,} more problem{'s' * (more != 1)})" if more else "")


def _check_overrides(overrides: Sequence[str]) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for override in overrides:
        try:
            (parsed,) = parser.parse_overrides([override])
        except HydraException:
            raise InputError(
                f"override {override!r} is not KEY=VALUE in Hydra's grammar "
                "(quote special characters: key='a b'; list items are key.0.field)"
            ) from None
        except ValueError as e:
            # The grammar takes an integer of any length; Python refuses to read one of more than 4300 digits.
            key = override.partition("=")[0].lstrip("+~")
            raise InputError(f"{key}: {one_line(str(e).split(';')[0])}") from None
        if parsed.is_sweep_override():
            # a,b (or choice(), range()) asks Hydra for one run per value: a list or a string with commas misspelled.
            raise InputError(f"{parsed.key_or_group}: {override.partition('=')[2]!r} is a sweep over several values, and "
                             "preflight makes one run (a list is [a,b]; a string with commas is quoted: 'a,b')")


# OmegaConf appends lines such as "    full_key: ..." and "    object_type=..." to its message.
OMEGACONF_DETAILS = re.compile(r"\n\s*(?:full_key|reference_type|object_type)[:=]")


def _omegaconf_message(e: OmegaConfBaseException) -> str:
    key = getattr(e, "full_key", None) or ""
    msg = getattr(e, "msg", None) or str(e)
    # The message is what comes before OmegaConf's details. It quotes the value as given: a newline or a terminal's
    # escape sequence in it is shown escaped, as repr() shows it, never sent to the terminal.
    text = OMEGACONF_DETAILS.split(msg, maxsplit=1)[0].strip() or type(e).__name__
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return f"{key}: {one_line(text)}" if key else one_line(text)


# Hydra's words for a group option that no folder has ("Could not find 'cluster/nope'"), then the options it has, one a
# line after a tab. Like the other patterns on Hydra's and OmegaConf's messages here, tests/test_config.py holds it to
# the real message of the installed versions.
MISSING_CONFIG = re.compile(r"Could not find '([^']+)'")
AVAILABLE_OPTIONS = re.compile(r"Available options in '([^']+)':\n((?:\t.*\n?)*)")


def _missing_config_message(e: MissingConfigException) -> str:
    text = str(e)
    found = MISSING_CONFIG.search(text)
    options = AVAILABLE_OPTIONS.search(text)
    if found and "/" in found.group(1):
        group, _, name = found.group(1).rpartition("/")
        available = ", ".join(o.strip() for o in options.group(2).splitlines() if o.strip()) if options else ""
        hint = f" (available: {available})" if available else ""
        return f"{group}: no config named {name!r}{hint}"
    return one_line(text.splitlines()[0])


def _shadowed(user: Path, shipped: list[Path]) -> None:
    """Hydra takes a group option from the first folder that has it, and preflight's own come
    first: refuse a user file that would be silently ignored."""
    for path in sorted(user.glob("*/*.yaml")):
        relative = path.relative_to(user)
        if any((folder / relative).exists() for folder in shipped):
            raise InputError(f"{path}: preflight ships {relative.parent}={relative.stem} too; give yours another name")


def search_path(config_dir: str | None) -> tuple[Path, list[Path]]:
    """The primary config folder (preflight's conf/) and the folders searched after it."""
    shipped = [shipped_dir("conf"), shipped_dir("playbooks")]
    chosen = config_dir or os.environ.get(CONFIG_DIR_ENV)
    users: list[Path] = []
    if chosen:
        folder = Path(chosen).expanduser().resolve()
        if not folder.is_dir():
            source = "--config-dir" if config_dir else CONFIG_DIR_ENV
            raise InputError(f"{source}: {chosen!r} is not a folder")
        users.append(folder)
    default = user_config_dir()
    if default.is_dir() and default.resolve() not in users:
        users.append(default.resolve())
    for folder in users:
        _shadowed(folder, shipped)
    return shipped[0], [*users, shipped[1]]


def _compose(overrides: Sequence[str], config_dir: str | None) -> DictConfig:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    primary, extra = search_path(config_dir)
    searchpath = ",".join(f"file://{p}" for p in extra)
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(primary), version_base=None):
            return compose("config", overrides=[*overrides, f"hydra.searchpath=[{searchpath}]"])
    finally:
        GlobalHydra.instance().clear()


def _schema_errors(plain: dict[str, Any], *, complete: bool) -> list[jsonschema.ValidationError]:  # plain JSON config
    validator = _VALIDATOR(load_schema("spec"), format_checker=_FORMAT_CHECKER)
    # Without the structured config, keys that have defaults are absent: only a complete
    # config can be held to the schema's list of required keys.
    errors = [e for e in validator.iter_errors(plain) if complete or e.validator != "required"]
    return sorted(errors, key=lambda err: [str(p) for p in err.absolute_path])


def _locate(overrides: Sequence[str], config_dir: str | None) -> str | None:
    """The schema's message for the first bad value, composed without the structured config."""
    from omegaconf import OmegaConf

    try:
        raw = OmegaConf.to_container(_compose([*overrides, "~schema"], config_dir), resolve=True)
    except Exception:
        return None
    errors = _schema_errors({str(k): v for k, v in raw.items()}, complete=False) if isinstance(raw, dict) else []
    return _first_problem(errors) if errors else None


# Hydra's account of a config file OmegaConf refused: the file, OmegaConf's message, the key (without the list item's path).
HYDRA_FILE_ERROR = re.compile(r"In '([^']+)': \w+ raised while composing config:\n(.*?)\n\s+full_key: (\S*)", re.S)


def compose_config(overrides: Sequence[str] = (), config_dir: str | None = None) -> DictConfig:
    """Compose conf/ with Hydra's override grammar; no outputs/ folder, no logging set-up."""
    from hydra.errors import HydraException, MissingConfigException
    from omegaconf.errors import OmegaConfBaseException

    _check_overrides(overrides)
    for folder in search_path(config_dir)[1]:
        if folder != shipped_dir("playbooks"):  # preflight's own files are not the user's input
            check_config_folder(folder)
    try:
        return _compose(overrides, config_dir)
    except MissingConfigException as e:
        raise InputError(_missing_config_message(e)) from None
    except HydraException as e:
        cause = e.__cause__ or e.__context__
        if isinstance(cause, OmegaConfBaseException) and "." in str(getattr(cause, "full_key", "") or ""):
            raise InputError(_omegaconf_message(cause)) from None
        if cause is not None and type(cause).__module__.startswith("yaml"):
            raise InputError(f"malformed YAML: {one_line(str(cause))}") from None
        # OmegaConf names a bad key inside a list item without the item's path: find it.
        located = _locate(overrides, config_dir)
        if located:
            raise InputError(located) from None
        if isinstance(cause, OmegaConfBaseException):
            raise InputError(_omegaconf_message(cause)) from None
        found = HYDRA_FILE_ERROR.search(str(e))
        if found:
            source, message, key = found.groups()
            raise InputError(f"{source}.yaml: {key}: {one_line(message)}") from None
        raise InputError(one_line(str(e).strip().splitlines()[0])) from None
    except OmegaConfBaseException as e:
        raise InputError(_omegaconf_message(e)) from None
    except OverflowError as e:
        # An integer too large for a float, given to a float key: out of every range. OmegaConf passes Python's error
        # on with the key's path; the schema's own words for the value replace it where they can be found.
        where = getattr(e, "full_key", None) or "(root)"
        raise InputError(_locate(overrides, config_dir) or f"{where}: {one_line(str(e).splitlines()[0])}") from None
    except Exception as e:
        if type(e).__module__.startswith("yaml"):  # YAML errors surface raw from Hydra's loader
            raise InputError(f"malformed YAML: {one_line(str(e))}") from None
        raise


def _check_semantics(config: PreflightConfig) -> None:
    hosts = config.cluster.hosts
    seen: dict[str, int] = {}
    for i, host in enumerate(hosts):
        if host.name in seen:
            raise InputError(f"cluster.hosts[{i}].name: {host.name!r} is already the name of cluster.hosts[{seen[host.name]}]")
        seen[host.name] = i
    if config.cluster.master not in seen:
        raise InputError(f"cluster.master: {config.cluster.master!r} is not the name of a host in cluster.hosts")
    if rails_declared(config):
        # Rail r of every host meets the others on one switch: a host with another count of rails has no rail r peer.
        counts = [len(rail_interfaces(host, config)) for host in hosts]
        for i, count in enumerate(counts):
            if count != counts[0]:
                raise InputError(f"cluster.hosts[{i}].interfaces: {hosts[i].name} has {count} rail{'s' * (count != 1)} where "
                                 f"{hosts[0].name} has {counts[0]}: every host has one interface per rail, in rail order")
    paths: dict[str, int] = {}
    for i, entry in enumerate(config.storage.paths):
        folder = entry.path.rstrip("/") or "/"
        if folder in paths:
            raise InputError(f"storage.paths[{i}].path: {entry.path!r} is already storage.paths[{paths[folder]}]")
        paths[folder] = i
    low, high = config.collective.sweep_min_bytes, config.collective.sweep_max_bytes
    if low is not None and high is not None and low > high:
        raise InputError(f"collective.sweep_min_bytes: {low} is more than collective.sweep_max_bytes ({high})")
    for backend in ("nccl", "gloo"):
        verdicts = getattr(config.collective.speed, backend)
        if verdicts.fail_fraction > verdicts.suspect_fraction:
            raise InputError(f"collective.speed.{backend}.fail_fraction: {verdicts.fail_fraction:g} is more than "
                             f"collective.speed.{backend}.suspect_fraction ({verdicts.suspect_fraction:g}); a failure is a suspect first")
    port = config.network.master_port
    if port and "collective" in config.playbook.stages and (highest := highest_derived_port(port, len(hosts))) > HIGHEST_PORT:
        room = HIGHEST_PORT - (highest - port)
        raise InputError(f"network.master_port: {port} leaves no room for the collective's ports above it (up to {highest} with "
                         f"{len(hosts)} host{'s' * (len(hosts) != 1)}, to split a failing set); give one of at most {room}, or 0")


def load_spec(overrides: Sequence[str] = (), config_dir: str | None = None) -> Spec:
    """Compose and validate: the only way a Spec is made. A config composed before from the same files and overrides
    comes from the cache (preflight.config_cache), validated again."""
    primary, extra = search_path(config_dir)
    key = config_cache.cache_key([primary, *extra], overrides)
    cached = config_cache.read_cached(key) if key else None
    if cached is not None and not _schema_errors(cached, complete=True):
        try:
            config = from_plain(cached)
            _check_semantics(config)
            return Spec(config=config, plain=cached, digest=_sha256(cached))
        except (InputError, LookupError, TypeError, ValueError):
            pass  # an entry damaged or altered since it was written: compose afresh, which names any real problem
    spec = _compose_spec(overrides, config_dir)
    if key:
        config_cache.write_cached(key, spec.plain)
    return spec


def _compose_spec(overrides: Sequence[str], config_dir: str | None) -> Spec:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    composed = compose_config(overrides, config_dir)
    try:
        container = OmegaConf.to_container(composed, resolve=True, throw_on_missing=True, enum_to_str=True)
    except OmegaConfBaseException as e:
        raise InputError(_omegaconf_message(e)) from None
    if not isinstance(container, dict):
        raise InputError("the composed config is not a mapping")
    plain = {str(k): v for k, v in container.items()}
    errors = _schema_errors(plain, complete=True)
    if errors:
        raise InputError(_first_problem(errors))
    # The plain form, validated, makes the same typed tree as OmegaConf.to_object, in a tenth of its time (5 s of CPU for
    # 12,000 hosts); a cached config is built the same way.
    config = from_plain(plain)
    _check_semantics(config)
    return Spec(config=config, plain=plain, digest=_sha256(plain))
