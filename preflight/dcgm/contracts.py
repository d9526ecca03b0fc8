"""The dcgm stage's part of the report (preflight.report_shape.Report's ``dcgm``), as the exact JSON shapes: each host's
diagnostic, and each result of it."""

from __future__ import annotations

from typing import Annotated, Literal, TypedDict

from preflight.schema_marks import Range


class DcgmTest(TypedDict):
    """One result of `dcgmi diag -j`."""

    category: str
    test: str
    gpus: str  # the GPU ids the result is for, as DCGM gives them ("0,1,2,3" or "3")
    status: str  # PASS, FAIL, WARN, SKIP
    warnings: list[str]


class DcgmHost(TypedDict):
    """What the dcgm stage found on one host."""

    host: str
    status: Literal["pass", "fail", "not run", "timed out", "error"]
    message: str
    version: str | None  # DCGM's version, from the document
    tests: list[DcgmTest]


class DcgmSection(TypedDict):
    """The dcgm stage (schema 5 on): `dcgmi diag -r LEVEL -j` on every host."""

    level: Annotated[int, Range(1, 4)]  # dcgmi diag -r LEVEL
    timeout_s: Annotated[float, Range(0, above=True)]
    hosts: list[DcgmHost]
