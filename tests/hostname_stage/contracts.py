"""The example stage's report section: each reached host's hostname and its length."""

from __future__ import annotations

from typing import Annotated, TypedDict

from preflight.schema_marks import Range


class HostnameLength(TypedDict):
    """One host's hostname as its probe reported it."""

    host: str  # the host's name in the cluster config
    hostname: str  # what the host calls itself
    length: Annotated[int, Range(0, 253)]  # characters in hostname; a DNS name has at most 253


class HostnameSection(TypedDict):
    """The hostname stage: each reached host's hostname length, and the longest allowed."""

    longest: Annotated[int, Range(1, 253)]  # a hostname longer than this fails PF990
    hosts: list[HostnameLength]  # one per reached host, in the cluster's order
