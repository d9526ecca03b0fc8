"""One rank's run through the phases: init, identity, verify, compute, neighbours, sweep, finish."""

from __future__ import annotations

import os
import socket
import threading
import time
import traceback
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from preflight.collective.host.config import WorkerConfig
from preflight.collective.host.events import COMPUTE_POINTS, EXIT_ERROR, EXIT_OK, PHASES, one_line
from preflight.collective.host.output import Output, PeerWatch, Watchdog
from preflight.collective.host.plans import identity_problems
from preflight.collective.host.tensors import all_gather_json, all_gather_single, count_wrong, destroy_if_initialized, payload
from preflight.collective.host.traffic import Traffic
from preflight.hostlib.cgroup import cgroup_throttled_s
from preflight.hostlib.files import run_delay_ns

if TYPE_CHECKING:
    from preflight.collective.wire import (
        ComputeResult,
        ErrorEvent,
        Identity,
        LinkResult,
        PeerFailure,
        ResultEvent,
        SweepResult,
        TimeoutEvent,
        VerifyResult,
    )


class Worker(Traffic):
    """One rank's run through the phases."""

    def __init__(self, config: WorkerConfig, rank: int, local_rank: int, world_size: int, *, started: float, parent_pid: int,
                 output: Output) -> None:
        self.config = config
        self.rank = rank
        self.local_rank = local_rank
        self.world_size = world_size
        self.started = started
        self.output = output
        self.watchdog = Watchdog(parent_pid, self._timed_out)
        # The launch cannot outlast every phase's deadline; posting must leave the finish deadline time to spare.
        self.peers = PeerWatch(config.run_id, wait_s=sum(config.deadlines_s.values()), post_s=min(10.0, config.deadlines_s["finish"] / 2))
        self._end_lock = threading.Lock()
        self._ended = False
        self.phase: str = PHASES[0]
        self.phases_s: dict[str, float] = {}
        self.hostname = socket.gethostname()
        self.gpu_uuid: str | None = None
        self.torch_version = ""
        self.nccl_version: str | None = None
        self.identity: list[Identity] = []
        self.problems: list[str] = []
        # Replaced by the verify phase, which every result comes after.
        self.verify: VerifyResult = {"bytes": 0, "elements": 0, "wrong": 0, "wrong_by_source_rank": {}}
        self.sweep: list[SweepResult] = []
        self.import_s = 0.0
        self.compute: ComputeResult | None = None
        self._matmul: tuple[Any, Any, Any] = (None, None, None)  # the compute probe's operands and output, kept for its slices
        self.links: list[LinkResult] = []
        self.pair_links: list[LinkResult] = []
        # The rail this rank's wrapper bound it to (preflight/rail_env.py's rail_of, the same rule).
        ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE") or local_rank + 1)
        self.rail = local_rank * config.rails // max(ranks_here, 1) if config.rails else 0

    def _t(self) -> float:
        return round(time.monotonic() - self.started, 3)

    def _conclude(self, event: ResultEvent | ErrorEvent | TimeoutEvent) -> bool:
        """Emit this rank's one final event (result, error or timeout), unless another thread already has."""
        with self._end_lock:
            if self._ended:
                return False
            self._ended = True
        self.output.emit(event)
        return True

    def _timed_out(self, phase: str, deadline_s: float) -> None:
        self._conclude({"event": "timeout", "phase": phase, "rank": self.rank, "local_rank": self.local_rank, "host": self.config.host,
                        "pid": os.getpid(), "deadline_s": deadline_s, "t": self._t()})

    def _peer_failed(self, failed: PeerFailure) -> None:
        stopped: ErrorEvent = {"event": "error", "phase": self.phase, "rank": self.rank, "local_rank": self.local_rank,
                               "host": self.config.host, "pid": os.getpid(), "t": self._t(), "after": failed,
                               "error": f"stopped: rank {failed['rank']} on {failed['host']} failed in {failed['phase']}"}
        if self._conclude(stopped):
            os._exit(EXIT_ERROR)

    def _enter(self, phase: str) -> None:
        self.phase = phase
        self.output.emit({"event": "phase", "phase": phase, "rank": self.rank, "local_rank": self.local_rank, "host": self.config.host,
                          "pid": os.getpid(), "t": self._t()})
        self.watchdog.arm(phase, self.config.deadlines_s[phase])

    def run(self) -> int:
        """All phases; the exit code."""
        self.watchdog.start()
        steps = {"init": self._init, "identity": self._identity, "verify": self._verify, "compute": self._compute,
                 "neighbours": self._neighbours, "sweep": self._sweep, "finish": self._finish}
        try:
            # Importing torch takes seconds: torchrun's start-up allowance covers it, no phase deadline does.
            import torch.distributed  # noqa: F401

            self.import_s = self._t()
            self.peers.start(self._peer_failed)
            for phase in PHASES:
                begun = time.monotonic()
                self._enter(phase)
                steps[phase]()
                if phase in COMPUTE_POINTS[1:]:
                    self._compute_slices(phase)
                self.phases_s[phase] = round(time.monotonic() - begun, 3)
        except Exception as e:
            # Cleanup after an error gets the finish deadline; its overrun adds nothing to the error already reported.
            self.watchdog.arm(None, self.config.deadlines_s["finish"], exit_code=EXIT_ERROR)
            traceback.print_exc()
            error: ErrorEvent = {"event": "error", "phase": self.phase, "rank": self.rank, "local_rank": self.local_rank,
                                 "host": self.config.host, "pid": os.getpid(), "error": one_line(e), "t": self._t(),
                                 "unix_s": time.time()}
            if self._conclude(error):
                self.peers.post({"rank": self.rank, "host": self.config.host, "phase": self.phase, "error": error["error"]})
            return EXIT_ERROR
        finally:
            destroy_if_initialized()
        if not self._conclude(self._result()):
            return EXIT_ERROR  # a peer failed first; this rank is stopping with that error
        # The way out can still hang (a flush into a pipe nobody reads any more); the result already stands.
        self.watchdog.arm(None, self.config.deadlines_s["finish"], exit_code=EXIT_OK)
        return EXIT_OK

    def _init(self) -> None:
        import torch
        import torch.distributed as dist

        # The process group's timeout also bounds every later collective, so it must not cut a phase with a longer
        # deadline short: the watchdog enforces each phase's own deadline.
        timeout = timedelta(seconds=max(self.config.deadlines_s.values()))
        if self.config.backend == "nccl":
            # A rank on another rank's GPU is the classic ncclInvalidUsage: bind the device before NCCL sees it.
            torch.cuda.set_device(self.local_rank)
            dist.init_process_group("nccl", timeout=timeout, device_id=self._device())
        else:
            dist.init_process_group("gloo", timeout=timeout)
        if dist.get_world_size() != self.world_size or dist.get_rank() != self.rank:
            raise RuntimeError(f"the process group has rank {dist.get_rank()} of {dist.get_world_size()}, "
                               f"torchrun said {self.rank} of {self.world_size}")

    def _identity(self) -> None:
        import torch

        self.torch_version = torch.__version__
        if self.config.backend == "nccl":
            self.gpu_uuid = str(torch.cuda.get_device_properties(self.local_rank).uuid)
            version = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
            self.nccl_version = ".".join(str(part) for part in version) if isinstance(version, tuple) else str(version)
        mine: Identity = {"host": self.config.host, "hostname": self.hostname, "rank": self.rank, "local_rank": self.local_rank,
                          "gpu_uuid": self.gpu_uuid, "torch": self.torch_version, "nccl": self.nccl_version}
        gathered: list[Any] = all_gather_json(mine, self.world_size, self._device())
        self.identity = sorted(gathered, key=lambda who: who["rank"])
        self.problems = identity_problems(self.identity)

    def _verify(self) -> None:
        import torch

        elements = self.config.verify_bytes // 4
        mine = payload(self.config.seed, self.rank, elements, self._device())
        received = torch.empty(elements * self.world_size, dtype=torch.int32, device=self._device())
        all_gather_single()(received, mine)
        wrong, by_source = count_wrong(received, self.config.seed, self.world_size)
        self.verify = {"bytes": elements * 4, "elements": elements * self.world_size, "wrong": wrong,
                       "wrong_by_source_rank": {str(src): n for src, n in by_source.items()}}

    def _compute(self) -> None:
        """A fixed square matmul on every rank at once, each on its own (mamf-finder's measure, one shape): a host whose
        CPU is throttled or whose GPU clocks are held down stands out against the others' figures. Set up here, and timed
        in one slice per repeat of the speed judge, spread over the launch (COMPUTE_POINTS): the first here, the next at
        the end of the neighbour test, the rest at the end of the sweep."""
        if self.config.compute_s <= 0:
            return
        import torch

        on_gpu = self.config.backend == "nccl"
        n, dtype = (8192, torch.bfloat16) if on_gpu else (256, torch.float32)
        # Made where they are used: 8192^2 random floats made on the CPU and copied would cost more than the probe.
        a = torch.rand(n, n, dtype=dtype, device=self._device())
        b = torch.rand(n, n, dtype=dtype, device=self._device())
        out = torch.matmul(a, b)  # the first call picks its kernel and allocates: untimed
        self._sync()
        self._matmul = (a, b, out)
        self.compute = {"n": n, "dtype": str(dtype).replace("torch.", ""), "iters": 0, "seconds": 0.0, "tflops": 0.0,
                        "throttled_s": 0.0, "slices_tflops": [], "slices_waited": []}
        self._compute_slices("compute")

    def _compute_slices(self, point: str) -> None:
        """The compute probe's slices due at this point of the launch. A slice is one repeat's evidence: slices timed back to
        back share one moment of the host's load (another process's burst covered all three on a shared 2-core machine),
        so a host was named for a moment; spread over the launch, a host is slow at compute when it is slow at three
        moments, as a throttled CPU or a GPU held at low clocks is."""
        if self.compute is None:
            return
        import torch
        import torch.distributed as dist

        slices = max(1, self.config.repeats)
        due = sum(1 for i in range(slices) if COMPUTE_POINTS[min(i, len(COMPUTE_POINTS) - 1)] == point)
        if due == 0:
            return
        a, b, out = self._matmul
        n = self.compute["n"]
        # Every rank's timed loop at once, as a training step's compute is: ranks of one host then share its CPU alike, and
        # a rank still busy with the phase before (or already done) does not make another's window lighter or heavier.
        dist.barrier()
        # One thread on CPU: a core's pace, the same on every host whatever its count of cores, and a quota shows in it.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        throttled_before = cgroup_throttled_s()
        begun = time.perf_counter()
        for part in range(1, due + 1):
            # The matmuls run on this thread, with one intra-op thread: its own wait is the slice's.
            slice_iters, slice_begun, delay_before = 0, time.perf_counter(), run_delay_ns()
            while True:
                torch.matmul(a, b, out=out)
                self._sync()
                slice_iters += 1
                if time.perf_counter() - begun >= self.config.compute_s / slices * part:
                    break
            slice_s = time.perf_counter() - slice_begun
            self.compute["slices_tflops"].append(round(2 * n ** 3 * slice_iters / slice_s / 1e12, 6))
            # The share of the slice the matmul's thread waited for a CPU, for the reader of a slow slice: waiting is other
            # work on the host's CPUs or a quota's hold (both leave the thread runnable), running slowly is the chip's pace.
            delay_after = run_delay_ns()
            self.compute["slices_waited"].append(None if delay_before is None or delay_after is None
                                                 else round(min(1.0, (delay_after - delay_before) / 1e9 / slice_s), 6))
            self.compute["iters"] += slice_iters
        throttled_after = cgroup_throttled_s()
        torch.set_num_threads(threads)
        self.compute["seconds"] = round(self.compute["seconds"] + time.perf_counter() - begun, 6)
        self.compute["tflops"] = round(2 * n ** 3 * self.compute["iters"] / self.compute["seconds"] / 1e12, 6)
        known = self.compute["throttled_s"]
        self.compute["throttled_s"] = None if known is None or throttled_before is None or throttled_after is None \
            else round(known + throttled_after - throttled_before, 6)
    def _finish(self) -> None:
        import torch.distributed as dist

        # The host of the c10d store must not leave before the others: their torchrun would then log
        # "RendezvousConnectionError ... failed to shutdown the rendezvous", which reads like a failure and is none.
        dist.barrier()
        dist.destroy_process_group()

    def _result(self) -> ResultEvent:
        return {"event": "result", "rank": self.rank, "local_rank": self.local_rank, "world_size": self.world_size,
                "host": self.config.host, "hostname": self.hostname, "gpu_uuid": self.gpu_uuid, "torch": self.torch_version,
                "nccl": self.nccl_version, "identity": self.identity if self.rank == 0 else None, "problems": self.problems,
                "verify": self.verify, "sweep": self.sweep, "phases_s": self.phases_s, "import_s": self.import_s,
                "compute": self.compute, "links": self.links, "pair_links": self.pair_links}
