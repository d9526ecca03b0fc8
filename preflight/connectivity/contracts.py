"""The connectivity stage's section of the report (schema 3 on), as its exact JSON shapes: what the test before
torchrun found, only the paths that failed listed. Like every stage's shapes, this module sits on floor 0, and
preflight.report_shape composes it into the report."""

from __future__ import annotations

from typing import Literal, TypedDict

ConnectivityStatus = Literal["pass", "fail", "unknown", "skipped"]
PathResult = Literal["ok", "filtered", "refused", "no-route", "error"]  # one TCP connect, as the mesh test saw it


class TcpPath(TypedDict):
    """One TCP connect of the connectivity test that did not succeed."""

    source: str
    destination: str
    address: str
    port: int
    rendezvous: bool  # the master's rendezvous port, rather than the destination's mesh listener
    result: PathResult
    detail: str


class MtuPath(TypedDict):
    """A do-not-fragment datagram at the source interface's MTU that never came back, while a smaller one did."""

    source: str
    destination: str
    mtu: int  # the source interface's MTU, the size that got no answer
    largest_passed: int | None  # the largest size tried that passed; None: no size passed


class LossPath(TypedDict):
    """Packet loss between two hosts: small UDP datagrams sent and echoed."""

    source: str
    destination: str
    sent: int
    echoed: int
    loss_percent: float
    rtt_ms: float | None  # median round trip of the echoed ones


class ConnectivitySection(TypedDict):
    """The report's account of the connectivity test that runs before torchrun: only what failed is listed, so that
    the report stays small at hundreds of hosts; the counts say what was tested."""

    status: ConnectivityStatus
    message: str
    master: str | None
    port: int  # the rendezvous port tested on the master
    hosts: list[str]  # the hosts tested, the master first
    mode: Literal["full", "sampled"]  # every pair, or each host towards a sample of peers
    tcp_tested: int  # TCP connects made, rendezvous ones included
    tcp_failed: list[TcpPath]
    mtu_tested: int  # (source, destination) pairs probed at the source's MTU
    mtu_failed: list[MtuPath]
    loss_tested: int
    loss_failed: list[LossPath]  # paths above connectivity.max_loss_percent
    loss_max_percent: float | None
    rtt_median_ms: float | None
    elapsed_s: float
