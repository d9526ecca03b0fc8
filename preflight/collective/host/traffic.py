"""A rank's traffic between hosts: the neighbour test and the sweep, timed on the job's own process group."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from preflight.collective.host.config import WorkerConfig
from preflight.collective.host.events import algbw_gbps, busbw_gbps
from preflight.collective.host.plans import (
    LONGEST_STEP_BUDGETS,
    lay_out,
    neighbour_phases,
    next_chunk,
    pair_round_phases,
    plateaued,
    rails_plan,
    settled,
    sweep_bytes,
    unresolved,
)
from preflight.collective.host.tensors import all_gather_json, all_gather_single
from preflight.hostlib.files import thread_run_delays_ns, waited_ns

if TYPE_CHECKING:
    import torch

    from preflight.collective.wire import (
        Identity,
        LinkResult,
        SweepResult,
    )


class Traffic:
    """The phases that time links between hosts (the neighbour test and the sweep), on the state Worker sets up."""

    config: WorkerConfig
    rank: int
    local_rank: int
    world_size: int
    rail: int
    identity: list[Identity]
    links: list[LinkResult]
    pair_links: list[LinkResult]
    sweep: list[SweepResult]

    def _device(self) -> torch.device:
        import torch

        return torch.device("cuda", self.local_rank) if self.config.backend == "nccl" else torch.device("cpu")

    def _sync(self) -> None:
        import torch

        # gloo's collectives return when they are done; NCCL's return when they are queued on the GPU.
        if self.config.backend == "nccl":
            torch.cuda.synchronize(self.local_rank)


    def _neighbours(self) -> None:
        """Each rank sends to its counterpart (the same local rank) on its neighbour hosts, the links of a phase at once,
        each phase for about neighbour_s (see neighbour_phases): point-to-point over the job's own process group, so on
        NCCL its real transport and on gloo its sockets. Every rank times the links it sends on. Then the pairwise stage's
        rounds, if any, in the same way (pair_round_phases); then every suspect of either, measured again (repeat_plan),
        until a repeat leaves none slow (settled), repeats times, and then up to starved_repeats more while a suspect was
        never at speed and fewer than repeats of its figures count, the rest starved (unresolved)."""
        if self.config.neighbour_s <= 0:
            return
        import torch

        hosts = list(dict.fromkeys(who["host"] for who in self.identity))
        ranks = {(who["host"], who["local_rank"]): who["rank"] for who in self.identity}
        buffer = torch.zeros(self.config.neighbour_bytes // 4, dtype=torch.float32, device=self._device())
        index = {host: i for i, host in enumerate(hosts)}
        phases = neighbour_phases(len(hosts)) if self.config.neighbour_ring else []
        self._send_phases([[(a, b, ()) for a, b in links] for links in phases], hosts, ranks, buffer, first=1, repeat=0, into=self.links)
        rounds = [[(index[a], index[b]) for a, b in pairs if a in index and b in index] for pairs in self.config.pair_rounds]
        self._send_phases([[(a, b, ()) for a, b in links] for links in pair_round_phases(rounds)], hosts, ranks, buffer, first=1,
                          repeat=0, into=self.pair_links)
        if self.config.repeats < 1:
            return
        # Every rank's figures, so that every rank plans the same repeats (each link at its slowest rank).
        # Each link of the ring and of each round at its slowest rank, as the judge takes them (a link in both is two).
        # On rails, each rail's figures apart: rail r's links are judged against rail r's (rails_plan).
        gathered: list[Any] = all_gather_json([[link["src"], link["dst"], kind, link["phase"], link["GBps"], link["rail"]]
                                               for kind, rows in (("ring", self.links), ("pair", self.pair_links)) for link in rows],
                                              self.world_size, self._device())
        slowest: dict[tuple[int, int, str, int, int], float] = {}
        for src, dst, kind, phase, rate, rail in (row for rows in gathered for row in rows):
            key = (index[src], index[dst], kind, int(phase), int(rail))
            slowest[key] = min(float(rate), slowest.get(key, float("inf")))
        measured: dict[int, list[tuple[int, int, float]]] = {}
        for (a, b, _, _, rail), rate in slowest.items():
            measured.setdefault(rail, []).append((a, b, rate))
        plan = rails_plan(len(hosts), measured, self.config.suspect_fraction, self.config.repeats + self.config.starved_repeats)
        number = len(phases) + 1
        done: dict[int, list[list[tuple[int, int, int, str, float, float | None]]]] = {rail: [] for rail in measured}
        for repeat, links in enumerate(plan, start=1):
            # A round's ring in its own phases, then the suspect links: a link timed beside the round is no yardstick.
            laid: list[list[tuple[int, int, tuple[str, ...]]]] = [[(a, b, (of,)) for a, b in phase] for of in ("round", "link")
                                                                  for phase in lay_out([(a, b) for a, b, tag in links if tag == of])]
            self._send_phases(laid, hosts, ranks, buffer, first=number, repeat=repeat, into=self.links)
            number += len(laid)
            # Every rank's figures of this repeat, so that every rank stops at the same one (settled).
            # Each with the share of it its ranks waited for a CPU (the larger end's), as the judge takes it (speed.samples).
            rows: list[Any] = all_gather_json([[link["src"], link["dst"], link["phase"], link["of"][0], link["GBps"], link["rail"],
                                                max((w for w in (link["send_wait"], link["recv_wait"]) if w is not None), default=None)]
                                               for link in self.links if link["repeat"] == repeat], self.world_size, self._device())
            figures: dict[tuple[int, int, int, str, int], tuple[float, float | None]] = {}
            for sender, receiver, at, tag, rate, rail, wait in (row for rank_rows in rows for row in rank_rows):
                figure = (index[sender], index[receiver], int(at), str(tag), int(rail))
                if float(rate) < figures.get(figure, (float("inf"), None))[0]:
                    figures[figure] = (float(rate), None if wait is None else float(wait))
            for rail in measured:
                done[rail].append([(a, b, at, tag, rate, wait) for (a, b, at, tag, r), (rate, wait) in figures.items() if r == rail])
            suspect, starved = self.config.suspect_fraction, self.config.starved_fraction
            if all(settled(mine, [figure[:5] for figure in done[rail][-1]], suspect,
                           [[figure[:5] for figure in figures] for figures in done[rail][:-1]]) for rail, mine in measured.items()):
                break
            # Past the repeats, only a suspect with fewer figures that count than repeats (the rest starved) is measured again.
            if repeat >= self.config.repeats and not any(unresolved(mine, done[rail], suspect, starved, self.config.repeats)
                                                         for rail, mine in measured.items()):
                break

    def _send_phases(self, phases: list[list[tuple[int, int, tuple[str, ...]]]], hosts: list[str], ranks: dict[tuple[str, int], int],
                     buffer: torch.Tensor, first: int, repeat: int, into: list[LinkResult]) -> None:
        """Run the phases (numbered from first), the links of each at once, each link (src, dst, in a repeat its tag:
        repeat_plan's "round" or "link"); this rank times the links it sends on and keeps them in into."""
        import torch.distributed as dist

        me = hosts.index(self.config.host)
        for number, links in enumerate(phases, start=first):
            dist.barrier()  # phases never overlap: a link shares its hosts with no other at a time
            for src, dst, of in links:
                peer = ranks.get((hosts[dst if src == me else src], self.local_rank))
                if me not in (src, dst) or peer is None:
                    continue
                messages, seconds, send_wait, recv_wait = self._exchange(peer, src == me, buffer)
                if src == me:
                    into.append({"src": hosts[src], "dst": hosts[dst], "local_rank": self.local_rank, "rail": self.rail, "phase": number,
                                 "bytes": buffer.numel() * 4, "messages": messages, "seconds": round(seconds, 6),
                                 "GBps": round(buffer.numel() * 4 * messages / seconds / 1e9, 6), "repeat": repeat, "of": list(of),
                                 "send_wait": send_wait, "recv_wait": recv_wait})

    def _exchange(self, peer: int, sending: bool, buffer: torch.Tensor) -> tuple[int, float, float | None, float | None]:
        """One link of the neighbour test, both ends alike: the sender sends messages in chunks, each chunk announced by
        its count (0: the end) and sized by next_chunk from the rate so far, so that the link sends for about neighbour_s
        however wrong its first message's time was; then an acknowledgement back, so that the time is the receiver's, not
        the sender's buffer's. The messages sent and their seconds (the receiver's count and seconds at its end), and the
        share of those seconds the sender's and the receiver's rank waited for a CPU (None: unknown; the sender's figure
        only at the sender): the acknowledgement carries the receiver's, in millionths (-1: unknown)."""
        import torch
        import torch.distributed as dist

        device = self._device()
        ack = torch.zeros(1, dtype=torch.int64, device=device)
        count = torch.zeros(1, dtype=torch.int64, device=device)
        forth, back = (dist.send, dist.recv) if sending else (dist.recv, dist.send)  # this end's part, the way the bytes go
        # The pair's first message sets up its connection: a small one, untimed, so that a slow link costs no extra message.
        forth(ack, peer)
        back(ack, peer)
        self._sync()
        delays = thread_run_delays_ns()
        begun = time.perf_counter()
        messages = 0
        while True:
            if sending:
                count.fill_(next_chunk(self.config.neighbour_s, time.perf_counter() - begun, messages))
            forth(count, peer)
            chunk = int(count.item())
            if chunk == 0:
                break
            for _ in range(chunk):
                forth(buffer, peer)
            self._sync()
            messages += chunk
        waited = waited_ns(delays, thread_run_delays_ns())
        mine = None if waited is None else round(waited / 1e9 / max(time.perf_counter() - begun, 1e-9), 6)
        ack.fill_(-1 if sending or mine is None else round(mine * 1e6))
        back(ack, peer)
        self._sync()
        seconds = time.perf_counter() - begun
        theirs = int(ack.item()) if sending else -1
        return messages, seconds, mine, None if theirs < 0 else theirs / 1e6

    def _sweep(self) -> None:
        for op in self.config.sweep_ops:
            slowest: list[float] = []  # busbw of the slowest rank per size, the same on every rank
            for size in self.config.sweep_sizes:
                moved = sweep_bytes(op, size, self.world_size)
                if moved == 0:
                    continue
                seconds = self._time_op(op, moved)
                # "bytes" is the size asked for (the key every rank and the report share); the rates use the bytes moved.
                self.sweep.append({"op": op, "bytes": size, "time_us": round(seconds * 1e6, 3),
                                   "algbw_GBps": round(algbw_gbps(moved, seconds), 6),
                                   "busbw_GBps": round(busbw_gbps(op, moved, seconds, self.world_size), 6)})
                if self.config.time_per_size_s is None:
                    continue
                # Every rank must stop at the same size: the decision uses the slowest rank's time, agreed on by all.
                agreed = self._agreed_max(seconds)
                slowest.append(busbw_gbps(op, moved, agreed, self.world_size))
                if plateaued(slowest) or agreed >= LONGEST_STEP_BUDGETS * self.config.time_per_size_s:
                    break

    def _agreed_max(self, value: float) -> float:
        """The largest of every rank's value, known to every rank (one tiny all_reduce)."""
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([value], dtype=torch.float64, device=self._device())
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return float(tensor.item())

    def _warm_up(self, step: Callable[[], None]) -> tuple[int, float]:
        """Warm up one size: the timed iterations still to run, and this rank's seconds for an iteration already timed (0.0
        when none was). Fixed: warmup untimed iterations, then iters. With a time budget: one untimed iteration (the first
        of a size sets up buffers and connections), then one timed on every rank and agreed on as the slowest's (so every
        rank runs the same counts). When at most one iteration fits the budget, that timed one is the measurement: at the
        largest sizes a third iteration would cost a third more for no better figure. Otherwise warm-ups filling half the
        budget and timed iterations filling the budget, at most warmup and iters."""
        budget = self.config.time_per_size_s
        if budget is None:
            for _ in range(self.config.warmup):
                step()
            return self.config.iters, 0.0
        import torch.distributed as dist

        step()
        self._sync()
        dist.barrier()
        begun = time.perf_counter()
        step()
        self._sync()
        mine = time.perf_counter() - begun
        one = max(self._agreed_max(mine), 1e-9)
        timed = min(self.config.iters, int(budget / one))
        if timed <= 1:
            return 0, mine
        for _ in range(max(0, min(self.config.warmup - 2, int(budget / 2 / one)))):
            step()
        return timed, 0.0

    def _time_op(self, op: str, total_bytes: int) -> float:
        """Seconds per iteration of op over total_bytes, timed as nccl-tests does: warm up, line up, time the loop."""
        import torch
        import torch.distributed as dist

        device = self._device()
        # Zeros stay zeros under a sum, so no iteration slows down on denormals or overflows.
        if op == "all_gather":
            all_gather = all_gather_single()
            output = torch.zeros(total_bytes // 4, dtype=torch.float32, device=device)
            shard = torch.zeros(total_bytes // 4 // self.world_size, dtype=torch.float32, device=device)

            def step() -> None:
                all_gather(output, shard)
        else:
            buffer = torch.zeros(total_bytes // 4, dtype=torch.float32, device=device)

            def step() -> None:
                dist.all_reduce(buffer)

        iters, already = self._warm_up(step)
        if iters == 0:
            return already
        self._sync()
        dist.barrier()
        self._sync()
        begun = time.perf_counter()
        for _ in range(iters):
            step()
        self._sync()
        return (time.perf_counter() - begun) / iters
