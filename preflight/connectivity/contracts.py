"""The connectivity stage's section of the report (schema 3 on), as its exact JSON shapes: what the test before
torchrun found, only the paths that failed listed. Like every stage's shapes, this module sits on floor 0, and
preflight.report_shape composes it into the report."""

from __future__ import annotations

from typing import Literal, TypedDict

from preflight.schema_marks import Amount, Count, HostName, Percent, Port

ConnectivityStatus = Literal["pass", "fail", "unknown", "skipped"]
PathResult = Literal["ok", "filtered", "refused", "no-route", "error"]  # one TCP connect, as the mesh test saw it


class TcpPath(TypedDict):
    """One TCP connect of the connectivity test that did not succeed."""

    source: HostName
    destination: HostName
    address: str
    port: Port
    rendezvous: bool  # the master's rendezvous port, rather than the destination's mesh listener
    result: PathResult
    detail: str


class MtuPath(TypedDict):
    """A do-not-fragment datagram at the source interface's MTU that never came back, while a smaller one did."""

    source: HostName
    destination: HostName
    mtu: Count  # the source interface's MTU, the size that got no answer
    largest_passed: Count | None  # the largest size tried that passed; None: no size passed


class LossPath(TypedDict):
    """Packet loss between two hosts: small UDP datagrams sent and echoed."""

    source: HostName
    destination: HostName
    sent: Count
    echoed: Count
    loss_percent: Percent
    rtt_ms: Amount | None  # median round trip of the echoed ones


class ConnectivitySection(TypedDict):
    """The report's account of the connectivity test that runs before torchrun: only what failed is listed, so that
    the report stays small at hundreds of hosts; the counts say what was tested."""

    status: ConnectivityStatus
    message: str
    master: HostName | None
    port: Port  # the rendezvous port tested on the master
    hosts: list[HostName]  # the hosts tested, the master first
    mode: Literal["full", "sampled"]  # every pair, or each host towards a sample of peers
    tcp_tested: Count  # TCP connects made, rendezvous ones included
    tcp_failed: list[TcpPath]
    mtu_tested: Count  # (source, destination) pairs probed at the source's MTU
    mtu_failed: list[MtuPath]
    loss_tested: Count
    loss_failed: list[LossPath]  # paths above connectivity.max_loss_percent
    loss_max_percent: Amount | None
    rtt_median_ms: Amount | None
    elapsed_s: Amount
