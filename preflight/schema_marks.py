"""What a value may be, carried in its type: ``Annotated[int, Range(1, 1024)]``. The JSON Schemas in preflight/schemas are
written from the types (``python3 -m preflight.schemas_gen``), and these marks become their keywords; the type checker,
OmegaConf and spec.from_plain read through them to the plain type.

A mark on ``X | None`` belongs inside: ``Annotated[int, Range(1, 65535)] | None``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated


@dataclass(frozen=True)
class Range:
    """minimum (or exclusiveMinimum, with above) and maximum of a number."""

    minimum: float | None = None
    maximum: float | None = None
    above: bool = False  # the minimum itself is refused (a timeout of 0)


@dataclass(frozen=True)
class Format:
    """A string format checked by name: schema_check.py's formats for a config, resources.py's date-time for documents."""

    name: str


@dataclass(frozen=True)
class Pattern:
    """A regular expression a string matches (searched, as JSON Schema does: anchor it)."""

    regex: str


@dataclass(frozen=True)
class MinLength:
    """The fewest characters of a string."""

    count: int


@dataclass(frozen=True)
class Items:
    """How many items a list holds, and whether they must differ."""

    minimum: int | None = None
    maximum: int | None = None
    unique: bool = False


@dataclass(frozen=True)
class Keys:
    """The format of a mapping's keys."""

    format: str


@dataclass(frozen=True)
class KeyPattern:
    """A regular expression every key of a mapping matches (anchor it)."""

    regex: str


@dataclass(frozen=True)
class Requires:
    """Keys a mapping must hold, beside any others its type allows."""

    keys: tuple[str, ...]


@dataclass(frozen=True)
class OneOf:
    """The values a field may take, where no Literal can say them (OmegaConf takes no Literal; a constant holds them)."""

    values: tuple[object, ...]


# Shapes the report's sections share. A figure measured (GB/s, seconds, bytes, a count) is never negative; a host is
# named by a non-empty name; a link is its two hosts.
Count = Annotated[int, Range(0)]
Amount = Annotated[float, Range(0)]
HostName = Annotated[str, MinLength(1)]
HostPair = Annotated[list[HostName], Items(2, 2)]
Port = Annotated[int, Range(0, 65535)]
Share = Annotated[float, Range(0, 1)]
Percent = Annotated[float, Range(0, 100)]
