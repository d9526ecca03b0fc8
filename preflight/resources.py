"""Where the files shipped with preflight live: in the installed package, or in a checkout."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

from preflight.errors import EnvironmentProblem

_PACKAGE = Path(__file__).resolve().parent


def shipped_dir(name: str) -> Path:
    """The folder ``conf`` or ``playbooks``: packaged into the wheel, or at a checkout's top."""
    for candidate in (_PACKAGE / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise EnvironmentProblem(f"preflight is installed without its {name}/ folder; reinstall it")


@cache
def load_schema(name: str) -> dict[str, Any]:  # a JSON Schema document, as JSON
    """A JSON Schema shipped in preflight/schemas, e.g. ``report``."""
    with open(_PACKAGE / "schemas" / f"{name}.schema.json", encoding="utf-8") as f:
        schema: dict[str, Any] = json.load(f)  # a JSON Schema document, as JSON
    return schema


# RFC 3339's date-time with its offset required (a time without one cannot be compared with now). jsonschema checks
# "date-time" only when the optional rfc3339-validator is installed, and only when given a FormatChecker: this one is
# always checked, and is what datetime.fromisoformat reads on python 3.10 too (Z spelled +00:00).
_DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{3}|\.\d{6})?(Z|[+-]\d{2}:\d{2})")


def is_date_time(value: object) -> bool:
    """Whether a string is a date-time the reports and launches may hold (other types are the "type" keyword's)."""
    if not isinstance(value, str):
        return True
    if not _DATE_TIME.fullmatch(value):
        return False
    try:
        dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:  # a month 13, a 25th hour
        return False
    return True


_FORMATS = jsonschema.FormatChecker(formats=())
_FORMATS.checkers["date-time"] = (is_date_time, ())


@cache
def validator(name: str) -> jsonschema.Draft202012Validator:
    """A reusable validator for a shipped schema, its formats checked (jsonschema.validate re-checks the schema on every
    call: 0.9 s for 32 hosts' facts against 0.04 s with one validator)."""
    return jsonschema.Draft202012Validator(load_schema(name), format_checker=_FORMATS)


def schema_problem(name: str, document: Any) -> str | None:
    """The most telling way document breaks the shipped schema `name`, as one line naming where; None if valid."""
    error = jsonschema.exceptions.best_match(validator(name).iter_errors(document))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "(root)"
    return f"{where}: {' '.join(error.message.split())[:200]}"


def user_config_dir() -> Path:
    """The user's own config folder, always on the search path (the sandbox writes here)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "preflight"
