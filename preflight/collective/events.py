"""The ranks' events, typed: the one place where the lines a launch printed become records.

Each line is JSON from a host (preflight.collective.wire's event types), so every field is checked as it is read: one
of the wrong type, or missing, is None, and a line whose kind it cannot be (a phase event without its phase, a result
that is not a whole ResultEvent) is kind "unknown". Nothing a host prints can make judging a launch fail.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from types import UnionType
from typing import Any, Literal, Union, cast, get_args, get_origin, get_type_hints, is_typeddict

from preflight.collective.host.events import parse_lines
from preflight.collective.wire import ResultEvent

EventKind = Literal["phase", "result", "error", "timeout", "cut", "unknown"]
_KINDS: tuple[EventKind, ...] = ("phase", "result", "error", "timeout", "cut")


@dataclass(frozen=True)
class Failure:
    """A rank's failure: as the rank said it, or as its peers heard of it through torchrun's store."""

    rank: int | None
    host: str | None
    phase: str | None
    error: str | None


@dataclass(frozen=True)
class RankEvent:
    """One event a rank, or its host's supervisor, printed."""

    kind: EventKind
    rank: int | None = None  # None: the rank failed before it could read torchrun's RANK
    local_rank: int | None = None
    host: str | None = None  # the cluster's name for the host the rank runs on
    phase: str | None = None  # the phase entered, or the one it failed or timed out in
    error: str | None = None
    after: Failure | None = None  # an error's: the peer whose failure stopped this rank
    t: float | None = None  # seconds since the rank started
    unix_s: float | None = None  # an error's time by its host's clock
    deadline_s: float | None = None  # a timeout's
    pid: int | None = None
    stuck: bool = False  # a timeout written by the host's supervisor: the rank could not end itself
    result: ResultEvent | None = None  # kind "result": the whole result, every field checked

    @property
    def failure(self) -> Failure:
        """This event's own failure, as its peers would hear of it."""
        return Failure(self.rank, self.host, self.phase, self.error)


def parse_events(text: str) -> list[RankEvent]:
    """Every event in one host's output, typed."""
    return [_typed(raw) for raw in parse_lines(text)]


def _typed(raw: Mapping[str, object]) -> RankEvent:
    said = raw.get("event")
    kind: EventKind = next((k for k in _KINDS if k == said), "unknown")
    phase = _str(raw.get("phase"))
    result = cast(ResultEvent, raw) if kind == "result" and _fits(raw, ResultEvent) else None
    if (kind == "phase" and phase is None) or (kind == "result" and result is None):
        kind = "unknown"
    return RankEvent(kind=kind, rank=_int(raw.get("rank")), local_rank=_int(raw.get("local_rank")), host=_str(raw.get("host")),
                     phase=phase, error=_str(raw.get("error")), after=_failure(raw.get("after")), t=_number(raw.get("t")),
                     unix_s=_number(raw.get("unix_s")),
                     deadline_s=_number(raw.get("deadline_s")), pid=_int(raw.get("pid")), stuck=raw.get("stuck") is True,
                     result=result)


def _failure(after: object) -> Failure | None:
    if not isinstance(after, dict):
        return None
    return Failure(_int(after.get("rank")), _str(after.get("host")), _str(after.get("phase")), _str(after.get("error")))


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: object) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


# A type hint is a class, a generic alias or a TypedDict: they share no static type.
def _fits(value: object, hint: Any) -> bool:
    """Whether a JSON value has the shape of a type hint of preflight.collective.wire's events: TypedDicts, lists, dicts
    with string keys, unions, literals and scalars (bool is no int, an int is a float, as JSON has it)."""
    if hint is type(None):
        return value is None
    if hint is float:
        return type(value) in (int, float)
    if hint in (int, str, bool):
        return type(value) is hint
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        return any(type(value) is type(arg) and value == arg for arg in args)
    if origin in (Union, UnionType):
        return any(_fits(value, arg) for arg in args)
    if origin is list:
        return isinstance(value, list) and all(_fits(item, args[0]) for item in value)
    if origin is dict:
        return isinstance(value, dict) and all(_fits(k, args[0]) and _fits(v, args[1]) for k, v in value.items())
    if is_typeddict(hint):
        fields = _fields(hint)
        return isinstance(value, dict) and hint.__required_keys__ <= value.keys() and \
            all(_fits(value[key], field) for key, field in fields.items() if key in value)
    raise TypeError(f"no JSON check for the type hint {hint!r}")


@cache
def _fields(typed_dict: type) -> Mapping[str, object]:
    return get_type_hints(typed_dict)
