"""The remedy catalogue behind ``preflight explain``: each stage's own entries, from the remedies file its entry in
stage_list.STAGES names (in its package), and playbooks/remedies.yaml's, which belong to no stage (the internal error,
and the failures `preflight diagnose` recognizes in a job's log). A code has one entry in all of them."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml

from preflight.errors import EnvironmentProblem, InputError, one_line
from preflight.resources import shipped_dir
from preflight.stage_list import remedy_files

FIELDS = ("cause", "confirm", "fix", "workaround")


@cache
def read_remedies(path: Path) -> dict[str, dict[str, str]]:
    """One remedies file's entries: title, cause, confirm, fix and maybe workaround, by code."""
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict):
        raise EnvironmentProblem(f"{path} is not a mapping of codes")
    return {str(code): {str(k): str(v) for k, v in entry.items()} for code, entry in data.items()}


def load_catalogue() -> dict[str, dict[str, str]]:
    """Every code's entry: the shared file's, then each stage's in the stage list's order. Merged on each call (each
    file read once), so a stage registered since is in it."""
    catalogue: dict[str, dict[str, str]] = {}
    for path in [shipped_dir("playbooks") / "remedies.yaml", *remedy_files()]:
        entries = read_remedies(path)
        if clash := sorted(set(entries) & set(catalogue)):
            # Two packages that explain one code differently: a bug in one of them, whichever was added last.
            raise RuntimeError(f"{path}: {', '.join(clash)} already explained by another stage's remedies or playbooks/remedies.yaml")
        catalogue.update(entries)
    return catalogue


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
