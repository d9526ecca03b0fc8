"""The remedy catalogue in playbooks/remedies.yaml, behind ``preflight explain``."""

from __future__ import annotations

from functools import cache

import yaml

from preflight.errors import EnvironmentProblem, InputError, one_line
from preflight.resources import shipped_dir

FIELDS = ("cause", "confirm", "fix", "workaround")


@cache
def load_catalogue() -> dict[str, dict[str, str]]:
    """Every code's entry: title, cause, confirm, fix and maybe workaround."""
    path = shipped_dir("playbooks") / "remedies.yaml"
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict):
        raise EnvironmentProblem(f"{path} is not a mapping of codes")
    return {str(code): {str(k): str(v) for k, v in entry.items()} for code, entry in data.items()}


def explain(code: str) -> str:
    """One code's entry as text for a terminal."""
    catalogue = load_catalogue()
    entry = catalogue.get(code.upper())
    if entry is None:
        raise InputError(f"unknown code {code!r}; `preflight explain` lists them all")
    lines = [f"{code.upper()}  {entry['title']}"]
    for name in FIELDS:
        if name in entry:
            lines.append(f"  {name}: {one_line(entry[name])}")
    return "\n".join(lines)


def listing() -> str:
    """One line per code."""
    return "\n".join(f"{code}  {entry['title']}" for code, entry in sorted(load_catalogue().items()))
