"""The launch: torchrun's arguments and environment for every host, derived from spec and facts.

The collective stage runs exactly this launch, so what passed is what will be emitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from preflight.facts import HostFacts
from preflight.rail_env import PREFIX as RAIL_PREFIX
from preflight.records import HostRecord, Rail, configured_interface_name, find_interface, host_rails, rails_declared
from preflight.spec import Backend, PreflightConfig

# Ranks of a one-host gloo cluster (cluster=local on a machine without GPUs), the fewest that talk to each other.
SINGLE_HOST_GLOO_RANKS = 2


@dataclass(frozen=True)
class HostLaunch:
    """How one host starts its ranks."""

    name: str
    local_addr: str  # this host's IPv4 for the job: torchrun --local-addr, never a hostname
    ifname: str | None  # socket interface for NCCL/gloo
    env: dict[str, str]
    torchrun_args: list[str]


@dataclass(frozen=True)
class Launch:
    """One torchrun launch across a set of hosts."""

    master: str  # the host serving the c10d store
    master_addr: str
    master_port: int
    nnodes: int
    nproc_per_node: int
    backend: Backend
    rdzv_id: str
    hosts: list[HostLaunch]
    # Rails per host (rail-optimized hosts: each local rank bound to its rail by preflight/rail_env.py); 0: one interface.
    rails: int = 0


def _ipv4(entry: str) -> str:
    return entry.split("/")[0]


def host_address(facts: HostFacts, config_address: str, ifname: str | None) -> tuple[str | None, str | None]:
    """The host's IPv4 for the job and its interface: the named interface's, else the configured
    address when the host owns it, else its first interface that is up with IPv4 (loopback last)."""
    interfaces = facts["net"]["interfaces"]
    named = find_interface(facts, ifname) if ifname else None
    if named is not None and named["ipv4"]:
        return _ipv4(named["ipv4"][0]), ifname
    for iface in interfaces:
        if any(_ipv4(a) == config_address for a in iface["ipv4"]):
            return config_address, ifname or iface["name"]
    ordered = sorted(interfaces, key=lambda i: i["loopback"])
    for iface in ordered:
        if iface["ipv4"] and iface["operstate"] in ("up", "unknown"):
            return _ipv4(iface["ipv4"][0]), ifname or iface["name"]
    return None, ifname


def nproc_per_node(config: PreflightConfig, backend: Backend, records: Sequence[HostRecord]) -> int:
    """Ranks per host: the configured count, else the GPUs found (nccl), or 1 (gloo); 2 for gloo on a cluster of
    one host, where a single rank would send nothing to anyone: two ranks exercise the rendezvous, the verified
    all_gather and the sweep between processes (a demonstration of the path, not a measurement of a network)."""
    if config.training.nproc_per_node != "auto":
        return int(config.training.nproc_per_node)
    if backend == Backend.nccl:
        return max(1, min(len(r.facts["gpu"]["devices"]) for r in records))
    if rails_declared(config):
        # One rank per rail, as a rail-optimized host runs one GPU per NIC: every rail is measured by its own rank.
        return max(1, min(len(host_rails(r.host, r.facts, config)) for r in records))
    return SINGLE_HOST_GLOO_RANKS if len(config.cluster.hosts) == 1 else 1


def active_hcas(facts: HostFacts, wanted: Sequence[str]) -> list[str]:
    """The host's InfiniBand ports that are ACTIVE, as device:port: of the configured HCAs, or all when none is."""
    found = []
    for port in facts["net"]["infiniband"]:
        if port["state"] != "ACTIVE":
            continue
        name = f"{port['device']}:{port['port']}"
        if not wanted or any(w in (port["device"], name) for w in wanted):
            found.append(name)
    return found


def job_env(config: PreflightConfig, backend: Backend, ifname: str | None, facts: HostFacts) -> dict[str, str]:
    """The environment every rank of the job gets on one host."""
    env: dict[str, str] = {}
    if ifname:
        # gloo takes one concrete name (not NCCL's ^ syntax); without it gloo binds to whatever
        # the hostname resolves to, 127.0.0.1 on many hosts.
        env["GLOO_SOCKET_IFNAME"] = ifname
    if backend == Backend.nccl:
        if ifname:
            env["NCCL_SOCKET_IFNAME"] = ifname
        hcas = active_hcas(facts, config.network.ib_hca)
        if hcas:
            # "=" makes NCCL match whole names: a bare mlx5_1 would also select mlx5_10 and up.
            env["NCCL_IB_HCA"] = "=" + ",".join(hcas)
        env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "3"  # tear the job down on a collective error
        env["NCCL_DEBUG"] = config.launch.nccl_debug
    return env


def rail_env(backend: Backend, rails: Sequence[Rail]) -> dict[str, str]:
    """The per-rail lists preflight/rail_env.py binds each local rank by: its rail's interface for gloo (and NCCL's
    sockets), and on nccl its rail's RDMA port where every rail has one."""
    if not rails:
        return {}
    names = ",".join(r.interface for r in rails)
    env = {f"{RAIL_PREFIX}GLOO_SOCKET_IFNAME": names}
    if backend == Backend.nccl:
        env[f"{RAIL_PREFIX}NCCL_SOCKET_IFNAME"] = names
        if all(r.hca for r in rails):
            # One port per rank, "=" so that mlx5_1 does not also select mlx5_10.
            env[f"{RAIL_PREFIX}NCCL_IB_HCA"] = ",".join(f"={r.hca}" for r in rails)
    return env


class LaunchError(Exception):
    """A host for which no launch can be derived (no IPv4 address at all)."""

    def __init__(self, host: str, message: str) -> None:
        super().__init__(message)
        self.host = host


def derive_launch(
    config: PreflightConfig, backend: Backend, records: Sequence[HostRecord], master_port: int, rdzv_id: str,
    join_timeout_s: float, read_timeout_s: float,
) -> Launch:
    """The launch for these hosts; the first record is the master (it serves the c10d store).
    The timeouts are the c10d rendezvous': every host joins within join_timeout_s; one store read waits read_timeout_s."""
    nproc = nproc_per_node(config, backend, records)
    addresses = []
    for record in records:
        ifname = configured_interface_name(record.host, config)
        address, chosen = host_address(record.facts, record.host.address, ifname)
        if address is None:
            raise LaunchError(record.host.name, f"{record.host.name} has no IPv4 address to launch on")
        addresses.append((record, address, chosen))
    master_addr = addresses[0][1]
    # Every host has as many rails (compose refuses a config where one differs).
    rail_count = len(host_rails(records[0].host, records[0].facts, config)) if rails_declared(config) else 0
    hosts = []
    for index, (record, address, ifname) in enumerate(addresses):
        args = [
            "--nnodes", str(len(records)), "--nproc-per-node", str(nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{master_addr}:{master_port}", "--rdzv-id", rdzv_id,
            # is_host and --local-addr make the launch immune to hostnames that do not resolve
            # (torchrun otherwise calls getaddrinfo(gethostname()) and dies).
            "--rdzv-conf", f"join_timeout={int(join_timeout_s)},read_timeout={int(read_timeout_s)},is_host={1 if index == 0 else 0}",
            "--local-addr", address, "--max-restarts", "0",
        ]
        rails = host_rails(record.host, record.facts, config) if rails_declared(config) else []
        hosts.append(HostLaunch(name=record.host.name, local_addr=address, ifname=ifname,
                                env={**job_env(config, backend, ifname, record.facts), **rail_env(backend, rails)}, torchrun_args=args))
    return Launch(master=records[0].host.name, master_addr=master_addr, master_port=master_port, nnodes=len(records),
                  nproc_per_node=nproc, backend=backend, rdzv_id=rdzv_id, hosts=hosts,
                  rails=rail_count)
