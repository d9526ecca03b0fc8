"""The connectivity stage's section of the report (schema 3 on), as its exact JSON shapes: what the test before
torchrun found, only the paths that failed listed; with rails (schema 8 on), each rail's paths and each failed path's
rail. Like every stage's shapes, this module sits on floor 0, and preflight.report_shape composes it into the report."""

from __future__ import annotations

from typing import Literal, TypedDict

from preflight.schema_marks import Amount, Count, HostName, Percent, Port

ConnectivityStatus = Literal["pass", "fail", "unknown", "skipped"]
PathResult = Literal["ok", "filtered", "refused", "no-route", "error"]  # one TCP connect, as the mesh test saw it


class _TcpPath(TypedDict):
    source: HostName
    destination: HostName
    address: str
    port: Port
    rendezvous: bool  # the master's rendezvous port, rather than the destination's mesh listener
    result: PathResult
    detail: str


class TcpPath(_TcpPath, total=False):
    """One TCP connect of the connectivity test that did not succeed."""

    rail: Count  # the rail it crossed, rail r to rail r (schema 8 on); absent where hosts have no rails, or at the rendezvous


class _MtuPath(TypedDict):

    source: HostName
    destination: HostName
    mtu: Count  # the source interface's MTU, the size that got no answer
    largest_passed: Count | None  # the largest size tried that passed; None: no size passed


class MtuPath(_MtuPath, total=False):
    """A do-not-fragment datagram at the source interface's MTU that never came back, while a smaller one did."""

    rail: Count  # the rail it crossed (schema 8 on); absent where hosts have no rails


class _LossPath(TypedDict):

    source: HostName
    destination: HostName
    sent: Count
    echoed: Count
    loss_percent: Percent
    rtt_ms: Amount | None  # median round trip of the echoed ones


class LossPath(_LossPath, total=False):
    """Packet loss between two hosts: small UDP datagrams sent and echoed."""

    rail: Count  # the rail it crossed (schema 8 on); absent where hosts have no rails


class RailPaths(TypedDict):
    """One rail's part of the connectivity test: every host's interface on rail r to its peers' on rail r."""

    rail: Count
    interfaces: list[str]  # the hosts' interfaces on it, each name once (hosts may name theirs differently)
    hosts: list[HostName]  # the hosts tested on it: a host whose rail has no address (PF306) is not
    status: Literal["pass", "fail"]
    named: list[HostName]  # the hosts its failed findings name ("*": a path or the whole rail, no one host)
    tcp_tested: Count
    tcp_failed: Count
    mtu_tested: Count
    mtu_failed: Count
    loss_tested: Count
    loss_failed: Count
    loss_max_percent: Amount | None
    rtt_median_ms: Amount | None


class _ConnectivitySection(TypedDict):

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


class ConnectivitySection(_ConnectivitySection, total=False):
    """The report's account of the connectivity test that runs before torchrun: only what failed is listed, so that
    the report stays small at hundreds of hosts; the counts say what was tested (with rails, on every rail)."""

    rails: list[RailPaths]  # with rails, each rail's paths, in rail order (schema 8 on); absent where hosts have no rails
