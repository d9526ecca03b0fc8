"""What preflight/connectivity/mesh.py reads and prints, typed: its config (written by preflight.connectivity.stage) and
its one JSON object of output (read by preflight.connectivity.judge). mesh.py is shipped to hosts as one file: it
imports these for the type checker only, so that a host needs nothing but the script."""

from __future__ import annotations

from typing import TypedDict


class MasterAddress(TypedDict):
    host: str
    address: str
    port: int  # the rendezvous port


class MeshConfig(TypedDict):
    host: str
    address: str  # this host's IPv4 on the job's interface
    mtu: int | None  # that interface's MTU; None: no MTU probe
    is_master: bool
    master: MasterAddress
    expected: int  # hosts that will register
    nonce: str  # the registry's greeting: what answers on the port is this run's registry, not another service
    tcp_peers: list[str]  # the hosts this one connects to (and probes at its MTU)
    loss_peers: list[str]  # the hosts this one sends loss datagrams to
    join_s: float
    connect_s: float
    total_s: float
    loss_probes: int
    loss_window_s: float
    echo_grace_s: float


class Endpoint(TypedDict):
    host: str
    address: str
    tcp: int
    udp: int


class Outcome(TypedDict):
    result: str  # ok, filtered, refused, no-route, error (in-use: the rendezvous port is taken)
    detail: str


class Registration(Outcome):
    ms: float | None
    waited_s: float


class TcpRow(Outcome):
    peer: str
    address: str
    port: int
    ms: float | None


class LossRow(TypedDict):
    peer: str
    sent: int
    echoed: int
    rtt_ms: float | None


class MtuRow(TypedDict):
    peer: str
    sizes: list[int]  # tried: the interface's MTU first, the common MTUs below it and the floor, then the search's sizes
    passed: list[int]
    local_refusals: dict[str, str]  # size -> why this host's kernel refused to send it


class MeshOutput(TypedDict):
    host: str
    address: str
    serving: Outcome | None  # the master's registry on the rendezvous port; None on other hosts
    registry: Registration | None  # this host's registration there; None when it never tried
    joined: list[str]  # the hosts in the table the master sent
    ports: dict[str, int]  # tcp, udp: this host's listeners
    tcp: list[TcpRow]
    loss: list[LossRow]
    mtu: list[MtuRow]
    error: str | None
    elapsed_s: float
