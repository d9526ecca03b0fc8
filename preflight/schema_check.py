"""The JSON Schema check of a composed config's plain form (schemas/spec.schema.json, written from preflight.spec's
types): the strict formats of every string that may reach a command line, numbers that are finite, and one line per
problem that names the key and quotes the value briefly."""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import jsonschema
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from preflight.errors import brief
from preflight.resources import load_schema

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

def _key_path(parts: Sequence[Any]) -> str:
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "(root)"


MESSAGE_CHARS = 400  # jsonschema's messages quote the value: a list of 12,000 hosts was 2.4 MB on one "line"


def schema_message(error: jsonschema.ValidationError) -> str:
    """One line of at most MESSAGE_CHARS: the key (a host by its index in cluster.hosts), what is wrong with its value."""
    path = _key_path(list(error.absolute_path))
    if error.validator == "format":
        text = f"{brief(error.instance)} is not {_FORMATS[str(error.validator_value)][1]}"
    elif error.validator == "type" and isinstance(error.instance, float) and not math.isfinite(error.instance):
        text = f"{error.instance!r} is not a finite number"
    elif error.validator == "oneOf" and any(sub.validator != "type" or sub.validator_value != "null" for sub in error.context or []):
        # The null branch is never the interesting one; report the typed branch's complaint.
        return next(schema_message(sub) for sub in error.context or []
                    if sub.validator != "type" or sub.validator_value != "null")
    else:
        # jsonschema's messages start with the value's repr, however large; a long one is said briefly instead.
        quoted = repr(error.instance)
        text = error.message if len(quoted) <= 80 else error.message.replace(quoted, brief(error.instance))
    return f"{path}: {text}" if len(path) + len(text) + 2 <= MESSAGE_CHARS else f"{path}: {text}"[:MESSAGE_CHARS - 3] + "..."


def first_problem(errors: Sequence[jsonschema.ValidationError]) -> str:
    """The first error's line, and how many more there are."""
    more = len(errors) - 1
    return schema_message(errors[0]) + (f" (and {more:,} more problem{'s' * (more != 1)})" if more else "")

def schema_errors(plain: dict[str, Any], *, complete: bool) -> list[jsonschema.ValidationError]:  # plain JSON config
    """Every way plain breaks the spec schema, in key order. complete: plain has every key (the structured config's
    defaults filled in), so it is also held to the schema's lists of required keys."""
    validator = _VALIDATOR(load_schema("spec"), format_checker=_FORMAT_CHECKER)
    errors = [e for e in validator.iter_errors(_hosts_set_aside(validator, plain)) if complete or e.validator != "required"]
    return sorted(errors, key=lambda err: [str(p) for p in err.absolute_path])


# A host schema with only these keywords is an object whose keys are exactly its properties (every one required, no
# other allowed): a host is valid then exactly when each of its values is valid against its property's schema.
_PLAIN_OBJECT = {"type", "description", "additionalProperties", "required", "properties"}
# The host list's own keywords that a list of its first host alone meets exactly when the whole list does.
_PLAIN_LIST = {"type", "description", "items", "minItems"}


def _hosts_set_aside(validator: jsonschema.protocols.Validator, plain: dict[str, Any]) -> dict[str, Any]:  # a plain config
    """plain with cluster.hosts cut to its first host when every host is valid, which the cut list then is exactly;
    else plain. jsonschema took 2.4 s of CPU over 12,000 hosts; each distinct value of a key is checked once here, and
    hosts share all but their names and addresses."""
    cluster = plain.get("cluster")
    hosts = cluster.get("hosts") if isinstance(cluster, dict) else None
    listed = _spec_schema_at(("properties", "cluster", "properties", "hosts"))
    host = _spec_schema_at(("properties", "cluster", "properties", "hosts", "items"))
    if not (isinstance(cluster, dict) and isinstance(hosts, list) and len(hosts) > 1 and listed is not None and host is not None
            and set(listed) <= _PLAIN_LIST and listed.get("minItems", 0) <= 1 and set(host) <= _PLAIN_OBJECT
            and host.get("type") == "object" and host.get("additionalProperties") is False
            and set(host.get("required", ())) == set(host.get("properties", {}))):
        return plain
    keys = set(host["properties"])
    checks = {key: validator.evolve(schema=schema) for key, schema in host["properties"].items()}
    verdicts: dict[tuple[str, object], bool] = {}
    for entry in hosts:
        if not (isinstance(entry, dict) and entry.keys() == keys):
            return plain
        for key, value in entry.items():
            memo = _memo_key(value)
            verdict = verdicts.get((key, memo)) if memo is not None else None
            if verdict is None:
                verdict = checks[key].is_valid(value)
                if memo is not None:
                    verdicts[(key, memo)] = verdict
            if not verdict:
                return plain
    return {**plain, "cluster": {**cluster, "hosts": hosts[:1]}}


def _spec_schema_at(path: Sequence[str]) -> dict[str, Any] | None:  # a JSON Schema, as JSON
    """The spec schema's subschema at path, following its $refs (#/$defs/NAME) on the way; None when there is none."""
    schema = load_schema("spec")
    node: Any = schema
    for step in (*path, ""):
        while isinstance(node, dict) and isinstance(node.get("$ref"), str):
            ref = node["$ref"]
            if set(node) - {"$ref", "description"} or not ref.startswith("#/$defs/"):
                return None
            node = schema.get("$defs", {}).get(ref.removeprefix("#/$defs/"))
        if step:
            node = node.get(step) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else None


def _memo_key(value: object) -> object:
    """What value is to a memo of verdicts, its type kept (True, 1 and 1.0 are equal to Python and not to the schema);
    None for a value not kept (a mapping)."""
    if isinstance(value, list):
        items = tuple(_memo_key(item) for item in value)
        return None if None in items else (list, items)
    return (type(value), value) if value is None or isinstance(value, str | int | float) else None
