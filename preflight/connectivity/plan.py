"""Who tests whom: every ordered pair of hosts up to connectivity.full_mesh_max_hosts, a documented sample beyond.

The sample gives each host its ring neighbours 1, 2, 4, 8, ... hosts ahead (so every host is a source and a
destination, and any two hosts are joined by a short chain of tested paths), then peers drawn at random from a
generator seeded by collective.seed, up to connectivity.sample_peers. Loss datagrams go to the next
connectivity.loss_peers hosts of the ring, so each host sends and receives that many loss paths.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from preflight.spec import ConnectivityConfig


@dataclass(frozen=True)
class MeshPlan:
    """The hosts of one connectivity test, the master first, and the peers each one tests."""

    hosts: list[str]
    mode: Literal["full", "sampled"]
    tcp_peers: dict[str, list[str]]
    loss_peers: dict[str, list[str]]

    def testers_of(self, host: str) -> list[str]:
        """The hosts that connect to host."""
        return [source for source, peers in self.tcp_peers.items() if host in peers]


def ring_offsets(count: int) -> list[int]:
    """1, 2, 4, ... below count."""
    offsets, step = [], 1
    while step < count:
        offsets.append(step)
        step *= 2
    return offsets


def plan_mesh(hosts: Sequence[str], config: ConnectivityConfig, seed: int) -> MeshPlan:
    """The plan for these hosts (the master first)."""
    names = list(hosts)
    count = len(names)
    loss = {name: [names[(i + k) % count] for k in range(1, min(config.loss_peers, count - 1) + 1)] for i, name in enumerate(names)}
    if count <= config.full_mesh_max_hosts:
        tcp = {name: [peer for peer in names if peer != name] for name in names}
        return MeshPlan(hosts=names, mode="full", tcp_peers=tcp, loss_peers=loss)
    generator = random.Random(seed)  # noqa: S311 - a reproducible sample, not a secret
    want = min(config.sample_peers, count - 1)
    tcp = {}
    for i, name in enumerate(names):
        chosen = [names[(i + offset) % count] for offset in ring_offsets(count)][:want]
        others = [peer for peer in names if peer != name and peer not in chosen]
        chosen += generator.sample(others, want - len(chosen)) if want > len(chosen) else []
        tcp[name] = chosen
    return MeshPlan(hosts=names, mode="sampled", tcp_peers=tcp, loss_peers=loss)
