"""What the mesh test (preflight/connectivity/mesh) reads and prints, typed: its config (written by
preflight.connectivity.stage) and its one JSON object of output (read by preflight.connectivity.judge). The mesh test is
shipped to hosts as one file: it imports these for the type checker only, so that a host needs nothing but the script."""

from __future__ import annotations

from typing import TypedDict


class MasterAddress(TypedDict):
    host: str
    address: str
    port: int  # the rendezvous port


class Network(TypedDict):
    """One network this host tests its peers on: its job interface, or one of its rails."""

    rail: int | None  # the rail's index, from 0; None: the job's interface (a cluster without rails)
    address: str  # this host's IPv4 on it
    mtu: int | None  # its interface's MTU; None: no MTU probe


class MeshConfig(TypedDict):
    host: str
    address: str  # this host's IPv4 on the job's interface, where it registers at the master's rendezvous port
    networks: list[Network]  # the job's interface; with rails, each rail instead (rail r meets its peers' rail r)
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
    """A host's listeners on one of its networks."""

    rail: int | None
    address: str
    tcp: int
    udp: int


class Registered(TypedDict):
    """What a host registers at the master, and the master's table holds for it."""

    host: str
    networks: list[Endpoint]


class Outcome(TypedDict):
    result: str  # ok, filtered, refused, no-route, error (in-use: the rendezvous port is taken)
    detail: str


class Registration(Outcome):
    ms: float | None
    waited_s: float


class TcpRow(Outcome):
    peer: str
    rail: int | None  # the network it crossed (Network.rail)
    address: str
    port: int
    ms: float | None


class LossRow(TypedDict):
    peer: str
    rail: int | None
    sent: int
    echoed: int
    rtt_ms: float | None


class MtuRow(TypedDict):
    peer: str
    rail: int | None
    sizes: list[int]  # tried: the interface's MTU first, the common MTUs below it and the floor, then the search's sizes
    passed: list[int]
    local_refusals: dict[str, str]  # size -> why this host's kernel refused to send it


class MeshOutput(TypedDict):
    host: str
    address: str
    serving: Outcome | None  # the master's registry on the rendezvous port; None on other hosts
    registry: Registration | None  # this host's registration there; None when it never tried
    joined: list[str]  # the hosts in the table the master sent
    listening: list[Endpoint]  # this host's listeners, one pair per network
    tcp: list[TcpRow]
    loss: list[LossRow]
    mtu: list[MtuRow]
    error: str | None
    elapsed_s: float
