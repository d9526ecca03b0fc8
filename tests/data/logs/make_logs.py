#!/usr/bin/env python3
"""Regenerate the logs in this folder that come from real runs on this machine (README.md lists which).

Each case runs a small job that fails the way real jobs do - torchrun with 2 gloo ranks on 127.0.0.1,
a DataLoader under a 64 MiB /dev/shm, torchrun across namespace hosts whose names resolve badly (to
loopback, nowhere, or an address no host has) - and keeps what the job printed (stdout and stderr,
interleaved as a terminal or a log collector gets them).

    python3 tests/data/logs/make_logs.py                     # every case
    python3 tests/data/logs/make_logs.py port-in-use         # some of them; --list names them all
    python3 tests/data/logs/make_logs.py --python VENV/bin/python old-spawn   # a case that needs another python
    python3 tests/data/logs/make_logs.py --torch VENV/bin/python --out DIR    # every job under another torch, into DIR

Needs torch (a CPU build is enough) and root: the /dev/shm case mounts a tmpfs in a private mount
namespace, the multi-host cases build a preflight.sandbox cluster (prefix pflogs, 198.18.190.0/24),
always torn down. Every process runs under a hard deadline, and its whole process group is killed
past it. A run takes about 5 minutes, most of it the two gloo cases waiting out gloo's own timeout.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent.parent
JOB_TIMEOUT_S = 120
SANDBOX_PREFIX = "pflogs"
SANDBOX_INDEX = 190  # 198.18.190.0/24: clear of `preflight sandbox up` (index 0), the tests (198.19/16) and the benches (200+)
# --python: another python, for the cases that record what this machine's torch does not print: an older torch's words
# (a virtual environment with one of PyPI's older wheels, a CUDA build run on the CPU), DeepSpeed's launcher. Each case
# says what it needs; without it, or with a python that lacks it, the case writes nothing.
OTHER_PYTHON: str | None = None
# --torch: the python every job runs under instead of this one (bench/version_sweep.py's other torch wheels); make_logs
# itself, the sandbox and the line stamper stay on this python. Its torchrun is the one beside it in bin/, or its
# torch.distributed.run.
TORCH_PYTHON: str = sys.executable


def other_python_says(case: str, need: str, code: str,
                      fits: Callable[[str], bool] = lambda version: True) -> tuple[str, str] | None:
    """--python and the version code prints there, when it runs and fits; None, the case skipped and said so, otherwise."""
    if OTHER_PYTHON is not None:
        result = subprocess.run([OTHER_PYTHON, "-c", code], capture_output=True, text=True, timeout=120)
        if result.returncode == 0 and fits(version := result.stdout.strip().splitlines()[-1]):  # DeepSpeed prints more first
            return OTHER_PYTHON, version
    print(f"{case}: skipped, it needs --python, a python with {need}")
    return None

UNUSED_PARAMETER = """
import datetime
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.used = torch.nn.Linear(8, 8)
        self.unused = torch.nn.Linear(8, 8)  # never called in forward: DDP waits for its gradient forever

    def forward(self, x):
        return self.used(x)


dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
model = DistributedDataParallel(TwoHeads())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    optimizer.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    print(f"step {step} done", flush=True)
dist.destroy_process_group()
"""

INPLACE = """
import datetime
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


class Gated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        gate = torch.sigmoid(self.linear(x))
        gate += 1  # sigmoid saved its output for backward
        return gate


dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
model = DistributedDataParallel(Gated())
model(torch.randn(4, 8)).sum().backward()
dist.destroy_process_group()
"""

ALL_REDUCE = """
import datetime
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
values = torch.ones(4) * dist.get_rank()
dist.all_reduce(values)
print("all_reduce", values.tolist(), flush=True)
dist.destroy_process_group()
"""

# Rank 0 posts 1024 floats for the all_reduce and rank 1 sends 4096: a collective whose sizes differ between ranks.
SIZE_MISMATCH = """
import datetime
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
values = torch.ones(1024 if dist.get_rank() == 0 else 4096)
dist.all_reduce(values)
print("all_reduce", values[:2].tolist(), flush=True)
dist.destroy_process_group()
"""

# An all_reduce of 8 MB, three times: TCP segments up to the interface's MTU, where ALL_REDUCE's 16 bytes fit in any.
LARGE_ALL_REDUCE = """
import datetime
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
for step in range(3):
    values = torch.ones(2_000_000) * dist.get_rank()
    dist.all_reduce(values)
    print("step", step, float(values[0]), flush=True)
dist.destroy_process_group()
"""

# Small all_reduces twice a second for up to 100 s; rank 0 writes MARK once step 5 is done (the hosts share /tmp).
STEPS_THEN_MARK = """
import datetime
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
for step in range(200):
    values = torch.ones(200_000) * dist.get_rank()
    dist.all_reduce(values)
    print("step", step, float(values[0]), flush=True)
    if step == 5 and dist.get_rank() == 0:
        open("MARK", "w").close()
    time.sleep(0.5)
dist.destroy_process_group()
"""

# torch.multiprocessing.spawn of 3 gloo ranks that meet at a monitored barrier (torch.distributed.monitored_barrier, 3 s):
# rank 2 is 8 s late, as a rank stuck in its data loading is. argv[1] "one" reports the first rank that did not arrive,
# "all" (wait_all_ranks=True) every one, rank 1 late as well.
MONITORED_BARRIER = """
import datetime, sys, time
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, port, wait_all):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=3,
                            timeout=datetime.timedelta(seconds=30))
    if rank == 2 or (wait_all and rank == 1):
        time.sleep(8)
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=3), wait_all_ranks=wait_all)


if __name__ == "__main__":
    mp.spawn(run, args=(int(sys.argv[2]), sys.argv[1] == "all"), nprocs=3)
"""

# A DataLoader of 4 workers per rank feeding all_reduces: each worker a process with its own threads.
LOADER_WORKERS = """
import datetime
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
data = TensorDataset(torch.arange(4096, dtype=torch.float32))
for step, (batch,) in enumerate(DataLoader(data, batch_size=64, num_workers=4)):
    total = batch.sum()
    dist.all_reduce(total)
    if step % 20 == 0:
        print("step", step, float(total), flush=True)
dist.destroy_process_group()
"""

SKIPPED_COLLECTIVE = """
import datetime
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
if dist.get_rank() == 0:
    dist.all_reduce(torch.ones(1024))  # rank 1 never joins this all_reduce
else:
    time.sleep(15)
dist.destroy_process_group()
"""

# Three gloo ranks; at step 2 rank 2's loader stalls (a read that never returns) while ranks 0 and 1 wait in the step's
# all_reduce. JOB_STALL_DUMP_S arms faulthandler's stall watchdog every step, as trainers do: a step that takes longer
# dumps every thread's stack. JOB_STALL=0: no stall, and each step computes for a while before its all_reduce.
STALLED_LOADER = """
import datetime
import faulthandler
import os
import sys
import time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.elastic.multiprocessing.errors import record


def next_batch(step):
    if os.environ.get("JOB_STALL", "1") == "1" and dist.get_rank() == 2 and step == 2:
        for _ in range(120):  # 60 s at most: the stall ends by itself, and so does the job (the others' gloo timeout)
            time.sleep(0.5)
    x = torch.randn(200, 200)
    for _ in range(int(os.environ.get("JOB_COMPUTE", "0"))):
        x = torch.tanh(x @ x)
    return x.sum(0) * step


def train():
    for step in range(4):
        if os.environ.get("JOB_STALL_DUMP_S"):
            faulthandler.dump_traceback_later(int(os.environ["JOB_STALL_DUMP_S"]))
        batch = next_batch(step)
        if os.environ.get("JOB_DIVERGE") == "1" and dist.get_rank() == 2 and step == 2:
            dist.broadcast(batch, src=0)  # rank 2 alone takes another path: the others all_reduce
        else:
            dist.all_reduce(batch)
        print(f"rank {dist.get_rank()} step {step}", flush=True)
    faulthandler.cancel_dump_traceback_later()
    dist.destroy_process_group()


def load_checkpoint():
    if os.environ.get("JOB_LATE_JOIN") == "1" and os.environ["RANK"] == "2":
        for _ in range(120):  # its shard from a slow filesystem: 60 s at most
            time.sleep(0.5)


@record
def main():  # under torchrun, which gives each rank its RANK, WORLD_SIZE and MASTER_ADDR
    load_checkpoint()
    print(f"rank {os.environ['RANK']} joining", flush=True)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=50))
    train()


def spawned(rank, port):  # under torch.multiprocessing.spawn
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=3,
                            timeout=datetime.timedelta(seconds=50))
    train()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        mp.spawn(spawned, args=(int(sys.argv[1]),), nprocs=3)
    else:
        main()
"""

SAMPLER_WITH_SHUFFLE = """
import datetime
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
data = TensorDataset(torch.randn(64, 8))
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data), shuffle=True)
dist.destroy_process_group()
"""

LARGE_SAMPLES = """
import torch
from torch.utils.data import DataLoader, Dataset


class Frames(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        return torch.zeros(32, 1024, 1024)  # 128 MiB per sample, moved to the main process through /dev/shm


for batch in DataLoader(Frames(), batch_size=1, num_workers=2):
    print(batch.shape, flush=True)
"""

# The same loader staging each 128 MiB frame in a POSIX shared-memory segment of its own (Python's
# multiprocessing.shared_memory, as datasets that decode into shared memory do): the segment is sized with ftruncate, which
# reserves none of /dev/shm's pages, so the worker's first write past what the tmpfs holds is a SIGBUS, not an ENOSPC.
# torch's handler in the worker prints its "Unexpected bus error" line, with the string's terminating NUL.
SHARED_MEMORY_FRAMES = """
import torch
from multiprocessing import shared_memory
from torch.utils.data import DataLoader, Dataset


class Frames(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        segment = shared_memory.SharedMemory(create=True, size=128 << 20)
        try:
            segment.buf[:] = bytes(len(segment.buf))
            return torch.frombuffer(bytearray(segment.buf[:16]), dtype=torch.uint8)
        finally:
            segment.close()
            segment.unlink()


for batch in DataLoader(Frames(), batch_size=1, num_workers=2):
    print(batch.shape, flush=True)
"""


# A loader of small samples with two workers: its iterator makes multiprocessing queues, whose locks are POSIX
# semaphores, files glibc's sem_open writes under /dev/shm.
SMALL_SAMPLES = """
import torch
from torch.utils.data import DataLoader, TensorDataset

for batch in DataLoader(TensorDataset(torch.zeros(64, 8)), batch_size=8, num_workers=2):
    print(batch[0].shape, flush=True)
"""

# Rank 1 stops making progress after step 2 (stuck in its own code, as a hung data loader or a deadlocked thread leaves
# it); rank 0 goes on to step 3's all_reduce and waits there. The collective timeout is longer than the job's deadline,
# so no error is ever printed: the job is killed as a user kills a hung job, and its per-rank logs just stop.
HANG_RANK_1 = """
import datetime
import logging
import time
import torch
import torch.distributed as dist

logging.basicConfig(format="%(asctime)s %(levelname)s rank%(rank)s %(message)s", level=logging.INFO)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
rank = dist.get_rank()
log = logging.LoggerAdapter(logging.getLogger("train"), {"rank": rank})
log.info("process group initialized, world size %d", dist.get_world_size())
for step in range(1, 6):
    if rank == 1 and step == 3:
        time.sleep(600)
    log.info("epoch 0 step %d", step)
    tensor = torch.ones(4)
    dist.all_reduce(tensor)
    time.sleep(1)
dist.destroy_process_group()
"""


# A DataLoader whose loop keeps every batch it received: the case runs it under a low soft open-file limit.
# A few steps of training, then a checkpoint too large for its folder (the case mounts a 1 MiB filesystem there).
CHECKPOINT = """
import torch

model = torch.nn.Linear(512, 512)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(3):
    loss = model(torch.randn(8, 512)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}", flush=True)
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "checkpoints/step-3.pt")
"""

# A DDP script written for torchrun, started as a plain process (the case removes torchrun's variables): the first
# without a launcher's RANK at init_process_group, the second reading LOCAL_RANK itself before it.
PLAIN_START = """
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
local_rank = int(os.environ["LOCAL_RANK"])
print(f"rank {dist.get_rank()} of {dist.get_world_size()}, local rank {local_rank}", flush=True)
"""

LOCAL_RANK_FIRST = """
import os
import torch
import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} of {dist.get_world_size()}, local rank {local_rank}", flush=True)
"""

HELD_BATCHES = """
import torch
from torch.utils.data import DataLoader, Dataset


class Fragments(Dataset):
    # A sample of many small tensors: a worker hands each to the rank as a file descriptor of shared memory.
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        return [torch.full((4,), float(i)) for _ in range(64)]


if __name__ == "__main__":
    kept = []
    for step, sample in enumerate(DataLoader(Fragments(), batch_size=None, num_workers=4, prefetch_factor=8)):
        kept.append(sample)  # the loop keeps what it received (a replay buffer): their descriptors stay open
        if step % 50 == 0:
            print(f"step {step}", flush=True)
"""

# Both ranks train, one step a second, until something outside stops them: the case sends SIGTERM to torchrun, as
# Slurm's scancel, a time limit or a pod's deletion does.
TRAIN_STEPS = """
import datetime
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
print(f"rank {rank}: process group initialized", flush=True)
for step in range(1, 61):
    dist.all_reduce(torch.ones(4))
    print(f"rank {rank}: epoch 0 step {step}", flush=True)
    time.sleep(1)
dist.destroy_process_group()
"""

# Rank 1 exits at step 3 without a word (os._exit, as a process killed from outside or dying in native code does);
# rank 0 is in the next all_reduce and learns of it from its connection to rank 1.
ON_THE_GPU = """
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))  # a CPU build of torch has no CUDA to give it
model = torch.nn.Linear(8, 8).to(device)
"""

PEER_EXITS = """
import datetime
import os
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
for step in range(1, 11):
    if rank == 1 and step == 3:
        os._exit(3)
    dist.all_reduce(torch.ones(1 << 20))
    print(f"rank {rank}: epoch 0 step {step}", flush=True)
    time.sleep(0.5)
dist.destroy_process_group()
"""

# Under an MPI launcher (Debian's mpich and openmpi-bin): rank 1 is ended by a signal at step 3, SIGKILL as the OOM
# killer sends it or SIGSEGV as a crash does; the others go on until the launcher cleans them up.
SIGNALLED_RANK = """
import os, signal, sys, time
rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
for step in range(1, 11):
    print(f"rank {rank}: epoch 0 step {step}", flush=True)
    if rank == 1 and step == 3:
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))
    time.sleep(0.5)
"""

# The same under torch.distributed.launch --use_env, which puts each rank's number in RANK; argv[1] "none" for no signal.
LAUNCHED_RANK = """
import os, signal, sys, time
rank = int(os.environ["RANK"])
for step in range(1, 31):
    print(f"rank {rank}: epoch 0 step {step}", flush=True)
    if rank == 1 and step == 3 and sys.argv[1] != "none":
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))
    time.sleep(0.5)
"""

# torch.multiprocessing.spawn of 2 gloo ranks, rank 1 ended by the signal argv[1] names at step 3.
SPAWNED_RANKS = """
import datetime, os, signal, sys, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def train(rank, signal_name, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=30))
    for step in range(1, 11):
        dist.all_reduce(torch.ones(4))
        print(f"rank {rank}: epoch 0 step {step}", flush=True)
        if rank == 1 and step == 3:
            os.kill(os.getpid(), getattr(signal, signal_name))
        time.sleep(0.5)


if __name__ == "__main__":
    mp.spawn(train, args=(sys.argv[1], int(sys.argv[2])), nprocs=2)
"""

# A gloo job started by an MPI launcher (its rank and size from Open MPI's or MPICH's environment): rank 1 raises
# ValueError at step 3 (argv[1] "raise") or leaves with os._exit(3) ("exit"); rank 0's next all_reduce is reset.
MPI_STARTED_RANKS = """
import datetime, os, sys, time
import torch
import torch.distributed as dist

rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", "1")))
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[2]}", rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=30))
for step in range(1, 11):
    dist.all_reduce(torch.ones(4))
    print(f"rank {rank}: epoch 0 step {step}", flush=True)
    if rank == 1 and step == 3:
        if sys.argv[1] == "raise":
            raise ValueError("bad batch at step 3")
        os._exit(3)
    time.sleep(0.5)
"""

# torchrun of 2 ranks: rank 0 traps SIGTERM (as a framework saving a checkpoint on it does), rank 1 ends by SIGSEGV at
# step 3. The agent's SIGTERM does not stop rank 0, so after its grace period the agent kills it with SIGKILL.
TRAPS_SIGTERM = """
import os, signal, time
rank = int(os.environ["RANK"])
signal.signal(signal.SIGTERM, lambda *_: print(f"rank {rank}: SIGTERM, saving a checkpoint first", flush=True))
for step in range(1, 200):
    print(f"rank {rank}: epoch 0 step {step}", flush=True)
    if rank == 1 and step == 3:
        os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(0.5)
"""

# Rank 1 reaches init_process_group 60 s late (a slow data download, a rank that was stuck first); rank 0 waits 15 s.
LATE_RANK = """
import datetime
import os
import time
import torch
import torch.distributed as dist

if os.environ["RANK"] == "1":
    time.sleep(60)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=15))
dist.all_reduce(torch.ones(4))
"""

# Rank 1 raises at step 3 of torchrun's first attempt; the restarted attempt would run to the end.
RAISES_ONCE = """
import datetime
import os
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
rank = dist.get_rank()
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
for step in range(1, 8):
    dist.all_reduce(torch.ones(4))
    print(f"rank {rank}: attempt {attempt} step {step}", flush=True)
    if rank == 1 and step == 3 and attempt == 0:
        raise ValueError("bad batch at step 3")
    time.sleep(0.3)
dist.destroy_process_group()
"""

# Rank 1 keeps 256 MiB more every step from step 3 (memory that grows every step): in a memory cgroup too small for it
# the kernel's OOM killer ends it.
GROWING_MEMORY = """
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
kept = []
for step in range(1, 40):
    dist.all_reduce(torch.ones(4))
    print(f"rank {rank}: epoch 0 step {step}", flush=True)
    if rank == 1 and step >= 3:
        kept.append(torch.ones(64 << 20))
    time.sleep(0.3)
dist.destroy_process_group()
"""

def run_bounded(argv: Sequence[str], *, timeout: float = JOB_TIMEOUT_S, env: Mapping[str, str] | None = None,
                cwd: Path | None = None) -> str:
    """What argv printed (stdout and stderr interleaved); past the deadline its whole process group is killed."""
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
                            env={**os.environ, **(env or {})}, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        output += f"\n[make_logs: killed after {timeout:g} s]\n"
    return output


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_argv() -> list[str]:
    if sys.executable != TORCH_PYTHON:
        beside = Path(TORCH_PYTHON).parent / "torchrun"
        return [str(beside)] if beside.is_file() else [TORCH_PYTHON, "-m", "torch.distributed.run"]
    found = shutil.which("torchrun")
    return [found] if found else [sys.executable, "-m", "torch.distributed.run"]


def single_host_torchrun(python: str | None = None, port: int | None = None) -> list[str]:
    """torchrun of 2 ranks on this host with a static rendezvous on 127.0.0.1: this machine's, or python's (an older
    torch: the underscore spellings, which every torchrun reads)."""
    launcher = [python, "-m", "torch.distributed.run"] if python else torchrun_argv()
    return [*launcher, "--nnodes", "1", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(port or free_port())]


def torchrun(work: Path, script: str, *options: str, env: Mapping[str, str] | None = None, port: int | None = None,
             timeout: float = JOB_TIMEOUT_S, python: str | None = None) -> str:
    """What single_host_torchrun printed running script, options before it."""
    return run_bounded([*single_host_torchrun(python, port), *options, script], env=env, cwd=work, timeout=timeout)


def write_job(work: Path, name: str, source: str) -> str:
    (work / name).write_text(source.lstrip(), encoding="utf-8")
    return name


def case_unused_parameters(work: Path) -> dict[str, str]:
    return {"ddp-unused-parameters.log": torchrun(work, write_job(work, "train_two_heads.py", UNUSED_PARAMETER))}


def case_inplace(work: Path) -> dict[str, str]:
    return {"ddp-inplace.log": torchrun(work, write_job(work, "train_gated.py", INPLACE))}


def case_port_in_use(work: Path) -> dict[str, str]:
    script = write_job(work, "all_reduce.py", ALL_REDUCE)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)  # an earlier job's store, still running
        return {"port-in-use.log": torchrun(work, script, port=int(holder.getsockname()[1]))}


def case_sampler_with_shuffle(work: Path) -> dict[str, str]:
    return {"sampler-with-shuffle.log": torchrun(work, write_job(work, "train_loader.py", SAMPLER_WITH_SHUFFLE))}


def case_collective_timeout(work: Path) -> dict[str, str]:
    return {"gloo-collective-timeout.log": torchrun(work, write_job(work, "skipped_all_reduce.py", SKIPPED_COLLECTIVE))}


def case_collective_size_mismatch(work: Path) -> dict[str, str]:
    return {"gloo-size-mismatch.log": torchrun(work, write_job(work, "uneven_all_reduce.py", SIZE_MISMATCH))}


def case_interface_missing(work: Path) -> dict[str, str]:
    script = write_job(work, "all_reduce.py", ALL_REDUCE)
    return {"gloo-interface-missing.log": torchrun(work, script, env={"GLOO_SOCKET_IFNAME": "ens9"})}


def case_rendezvous_timeout(work: Path) -> dict[str, str]:
    # Node 0 of 2 alone: the other host never starts. Once with the static rendezvous, once with c10d (underscore
    # spellings, which every torchrun reads; --local_addr from torch 2.0).
    script = write_job(work, "all_reduce.py", ALL_REDUCE)
    static = [*torchrun_argv(), "--nnodes", "2", "--node_rank", "0", "--nproc_per_node", "1", "--master_addr", "127.0.0.1",
              "--master_port", str(free_port()), "--rdzv_conf", "timeout=10", script]
    c10d = [*torchrun_argv(), "--nnodes", "2", "--node_rank", "0", "--nproc_per_node", "1", "--rdzv_backend", "c10d",
            "--rdzv_endpoint", f"127.0.0.1:{free_port()}", "--rdzv_conf", "join_timeout=10,is_host=1", "--local_addr", "127.0.0.1",
            script]
    return {"rendezvous-timeout.log": run_bounded(static, cwd=work), "rendezvous-timeout-c10d.log": run_bounded(c10d, cwd=work)}


def case_rendezvous_refused(work: Path) -> dict[str, str]:
    """Node 1 of 2 alone, its rendezvous endpoint a loopback port no one listens on (node 0 never started, or another
    port): every connect is refused until the rendezvous gives up. Both rendezvous (node_one_alone)."""
    script = write_job(work, "all_reduce.py", ALL_REDUCE)
    static, c10d = node_one_alone(torchrun_argv(), "127.0.0.1", free_port(), script)
    return {"rendezvous-refused.log": run_bounded(static, cwd=work),
            "rendezvous-refused-c10d.log": run_bounded(c10d, cwd=work)}


def node_one_alone(launcher: Sequence[str], host: str, port: int, script: str) -> tuple[list[str], list[str]]:
    """torchrun as node 1 of 2 whose node 0 never comes, its endpoint host:port, each giving up after 10 s: the static
    rendezvous, then c10d told it is not the store's host (is_host=0: a loopback endpoint is taken for its own
    otherwise). Underscore spellings, which every torchrun reads."""
    common = [*launcher, "--nnodes", "2", "--nproc_per_node", "1"]
    static = [*common, "--node_rank", "1", "--master_addr", host, "--master_port", str(port), "--rdzv_conf", "timeout=10",
              script]
    c10d = [*common, "--rdzv_backend", "c10d", "--rdzv_endpoint", f"{host}:{port}", "--rdzv_conf",
            "join_timeout=10,read_timeout=10,is_host=0", script]
    return static, c10d


def case_clean(work: Path) -> dict[str, str]:
    shutil.copy(REPO / "tests" / "data" / "ddp_train.py", work / "ddp_train.py")
    return {"clean-ddp-train.log": torchrun(work, "ddp_train.py", env={"PREFLIGHT_BACKEND": "gloo"})}


def case_cpu_build(work: Path) -> dict[str, str]:
    """The CPU build of torch this machine has, given a job that puts its model on its rank's GPU."""
    return {"torch-cpu-build.log": torchrun(work, write_job(work, "on_the_gpu.py", ON_THE_GPU))}


def _on_small_dev_shm(work: Path, script: str, leftover_mib: int = 0, python: str | None = None) -> str:
    """script's output, run by python with Docker's default /dev/shm: a 64 MiB tmpfs, in a mount namespace of its own, of
    which a file (a killed job's NCCL segment, never unlinked) holds leftover_mib MiB."""
    fill = f"dd if=/dev/zero of=/dev/shm/nccl-Xk3v9Q bs=1M count={leftover_mib} status=none && " if leftover_mib else ""
    shell = f"mount -t tmpfs -o size=64m,mode=1777,nosuid,nodev shm /dev/shm && {fill}exec {python or TORCH_PYTHON} {script}"
    return run_bounded(["unshare", "--mount", "--propagation", "private", "sh", "-c", shell], cwd=work)


def case_dev_shm_full(work: Path) -> dict[str, str]:
    return {"dev-shm-full.log": _on_small_dev_shm(work, write_job(work, "load_frames.py", LARGE_SAMPLES))}


def case_dev_shm_semaphore(work: Path) -> dict[str, str]:
    """A loader's first iteration on a /dev/shm that a killed job's leftovers fill: its queues' semaphores cannot be made."""
    return {"dev-shm-semaphore.log": _on_small_dev_shm(work, write_job(work, "load_samples.py", SMALL_SAMPLES), leftover_mib=64)}


def case_dev_shm_bus_error(work: Path) -> dict[str, str]:
    return {"dev-shm-bus-error.log": _on_small_dev_shm(work, write_job(work, "stage_frames.py", SHARED_MEMORY_FRAMES))}


def case_open_file_limit(work: Path) -> dict[str, str]:
    # A soft open-file limit of 256 (systemd's default is 1024: the job here holds fewer descriptors than a real one).
    script = write_job(work, "held_batches.py", HELD_BATCHES)
    return {"dataloader-open-file-limit.log": run_bounded(["sh", "-c", f"ulimit -Sn 256 && exec {TORCH_PYTHON} {script}"], cwd=work)}


def case_filesystem_full(work: Path) -> dict[str, str]:
    # The checkpoint folder a 1 MiB tmpfs, in a mount namespace of its own: the 2 MiB checkpoint does not fit.
    script = write_job(work, "save_checkpoint.py", CHECKPOINT)
    (work / "checkpoints").mkdir(exist_ok=True)
    shell = f"mount -t tmpfs -o size=1m tmpfs checkpoints && exec {TORCH_PYTHON} {script}"
    return {"checkpoint-filesystem-full.log": run_bounded(["unshare", "--mount", "--propagation", "private", "sh", "-c", shell],
                                                          cwd=work)}


def case_launch_environment(work: Path) -> dict[str, str]:
    # Each script as `python script.py` with none of the variables torchrun gives its workers.
    unset = [arg for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
             for arg in ("-u", name)]
    return {log: run_bounded(["env", *unset, TORCH_PYTHON, write_job(work, name, source)], cwd=work)
            for log, name, source in (("launch-without-torchrun.log", "train_plain.py", PLAIN_START),
                                      ("launch-local-rank-unset.log", "train_local_rank.py", LOCAL_RANK_FIRST))}


@contextlib.contextmanager
def bounded_launcher(argv: Sequence[str], work: Path, env: Mapping[str, str] | None = None,
                     seconds: float = 90) -> Iterator[tuple[subprocess.Popen[str], list[bool]]]:
    """A launcher (torchrun, spawn, torch.distributed.launch, DeepSpeed's) in a session of its own, its output piped,
    and whether its deadline passed: then SIGTERM, which it passes on to its ranks (torchrun's run in sessions of their
    own, which a signal to its process group misses), and 15 s later SIGKILL to its process group."""
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=work,
                            env={**os.environ, **(env or {})}, start_new_session=True)
    killed: list[bool] = []

    def past_deadline() -> None:
        killed.append(True)
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    timer = threading.Timer(seconds, past_deadline)
    timer.start()
    try:
        yield proc, killed
    finally:
        timer.cancel()


def read_until(proc: subprocess.Popen[str], text: str, count: int) -> list[str]:
    """proc's lines up to the one where text has been printed count times (or its end). Counted in the text, not by
    line: ranks' prints without --tee can share a line of the launcher's output."""
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if sum(seen.count(text) for seen in lines) >= count:
            break
    return lines


def rest_of(proc: subprocess.Popen[str]) -> list[str]:
    """What proc prints from here to its end."""
    lines = proc.stdout.readlines() if proc.stdout else []
    proc.wait()
    return lines


def sigterm_at_step_3(argv: Sequence[str], work: Path) -> str:
    """What a launcher of 2 ranks printed when SIGTERM reached it (it alone, as a scheduler signals a job's launcher) once
    both ranks logged step 3; bounded: 60 s at most (bounded_launcher)."""
    with bounded_launcher(argv, work, seconds=60) as (proc, _):
        lines = read_until(proc, "epoch 0 step 3", 2)
        proc.send_signal(signal.SIGTERM)
        return "".join(lines + rest_of(proc))


def case_sigterm(work: Path) -> dict[str, str]:
    """torchrun of 2 training ranks; SIGTERM to torchrun once both have logged step 3 (bounded: 60 s at most)."""
    script = write_job(work, "train_steps.py", TRAIN_STEPS)
    return {"torchrun-sigterm.log": sigterm_at_step_3([*single_host_torchrun(), script], work)}


def stacks_of_three_ranks(work: Path, env: Mapping[str, str], py_spy: str | None, until: str, count: int,
                          stop: bool = True, native: bool = False, spawn: bool = False) -> str:
    """3 ranks of STALLED_LOADER under torchrun (without py_spy, with --tee 3: each line behind its rank's prefix) or,
    with spawn, under its own torch.multiprocessing.spawn. Once `until` was printed `count` times, and 3 s more, py-spy
    dumps the launcher and its ranks (when py_spy is given; native: with --native's C++ frames); then SIGTERM reaches
    torchrun, or spawn's whole process group (stop), or the job runs to its end. The job's output, then the dumps as
    py-spy printed them. Bounded: 90 s (bounded_launcher); the stall itself ends after 60 s."""
    script = write_job(work, "stalled_loader.py", STALLED_LOADER)
    argv = ([TORCH_PYTHON, script, str(free_port())] if spawn else
            [*torchrun_argv(), "--nnodes", "1", "--nproc_per_node", "3", "--master_addr", "127.0.0.1", "--master_port",
             str(free_port()), *([] if py_spy else ["--tee", "3"]), script])
    dumps = ""
    with bounded_launcher(argv, work, env) as (proc, killed):
        lines = read_until(proc, until, count)
        time.sleep(3)
        if py_spy:  # torchrun's agent and, below it, its ranks
            dumps = subprocess.run([py_spy, "dump", "--subprocesses", *(["--native"] if native else []), "--pid", str(proc.pid)],
                                   capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "120"}).stdout
        if stop and spawn:  # spawn's ranks share its process group: SIGTERM to the group, as a terminal's ^C or a scheduler
            os.killpg(proc.pid, signal.SIGTERM)
        elif stop:
            proc.send_signal(signal.SIGTERM)
        lines += rest_of(proc)
    return "".join(lines) + dumps + ("\n[make_logs: killed after 90 s]\n" if killed else "")


def case_stack_dumps(work: Path) -> dict[str, str]:
    """Stack dumps of a stalled job, as people take them: faulthandler's stall watchdog, and py-spy's of torchrun and its
    ranks (plain, --native, under spawn instead, of ranks waiting to join a late one, and of ranks in different
    collectives); and py-spy's of a healthy job
    that then finishes. py-spy (PyPI's) must be on PATH for all but the first."""
    py_spy = shutil.which("py-spy")
    logs = {"hang-faulthandler-timeout.log": stacks_of_three_ranks(work, {"JOB_STALL_DUMP_S": "6"}, None, "Timeout (", 3)}
    if py_spy is None:
        print("stack-dumps: py-spy dumps skipped, py-spy is not on PATH (pip install py-spy)")
        return logs
    logs["hang-py-spy-dump.log"] = stacks_of_three_ranks(work, {}, py_spy, "step 1", 3)
    logs["hang-py-spy-native-dump.log"] = stacks_of_three_ranks(work, {}, py_spy, "step 1", 3, native=True)  # C++ frames too
    logs["hang-py-spy-spawn-dump.log"] = stacks_of_three_ranks(work, {}, py_spy, "step 1", 3, spawn=True)
    # rank 2 still loading its checkpoint when ranks 0 and 1 wait in init_process_group for it
    logs["hang-py-spy-late-join-dump.log"] = stacks_of_three_ranks(work, {"JOB_LATE_JOIN": "1"}, py_spy, "joining", 2)
    # rank 2 in a broadcast while ranks 0 and 1 all_reduce: each waits in a collective the others never enter
    logs["hang-py-spy-diverged-dump.log"] = stacks_of_three_ranks(work, {"JOB_STALL": "0", "JOB_DIVERGE": "1"}, py_spy,
                                                                  "step 1", 3)
    logs["healthy-py-spy-dump.log"] = stacks_of_three_ranks(work, {"JOB_STALL": "0", "JOB_COMPUTE": "12000"}, py_spy,
                                                            "step 1", 3, stop=False)
    return logs


def case_peer_exits(work: Path) -> dict[str, str]:
    return {"gloo-peer-exits.log": torchrun(work, write_job(work, "peer_exits.py", PEER_EXITS))}


def _signalled_rank(work: Path, prefix: str, launch: Sequence[str]) -> dict[str, str]:
    """The launcher's output for SIGNALLED_RANK with rank 1 ended by SIGKILL, then by SIGSEGV: PREFIX-rank-killed.log and
    PREFIX-rank-segfault.log."""
    script = write_job(work, "signalled_rank.py", SIGNALLED_RANK)
    return {f"{prefix}-rank-{outcome}.log": run_bounded([*launch, TORCH_PYTHON, script, name], cwd=work)
            for outcome, name in (("killed", "SIGKILL"), ("segfault", "SIGSEGV"))}


def case_mpich_signal(work: Path) -> dict[str, str]:
    """MPICH's hydra (Debian's mpich) running 2 ranks, rank 1 ended by a signal: its BAD TERMINATION block."""
    mpiexec = shutil.which("mpiexec.hydra") or shutil.which("mpiexec")
    if mpiexec is None:
        raise SystemExit("mpich-signal needs MPICH's mpiexec (Debian: apt-get install mpich)")
    return _signalled_rank(work, "mpich", [mpiexec, "-n", "2"])


def _openmpi(case: str, ranks: int) -> list[str]:
    """Open MPI's mpirun (Debian's openmpi-bin, 4.1) starting `ranks` processes, as root on this 2-core machine."""
    mpirun = shutil.which("mpirun.openmpi")
    if mpirun is None:
        raise SystemExit(f"{case} needs Open MPI's mpirun (Debian: apt-get install openmpi-bin)")
    return [mpirun, "--allow-run-as-root", "--oversubscribe", "-n", str(ranks)]


def case_openmpi_signal(work: Path) -> dict[str, str]:
    """Open MPI's mpirun running 3 ranks, rank 1 ended by a signal."""
    return _signalled_rank(work, "openmpi", _openmpi("openmpi-signal", 3))


def case_spawn_signal(work: Path) -> dict[str, str]:
    """torch.multiprocessing.spawn of 2 ranks, rank 1 ended by SIGKILL, then by SIGSEGV: spawn's ProcessExitedException."""
    script = write_job(work, "spawned_ranks.py", SPAWNED_RANKS)
    return {f"spawn-rank-{outcome}.log": run_bounded([TORCH_PYTHON, script, name, str(free_port())], cwd=work)
            for outcome, name in (("killed", "SIGKILL"), ("segfault", "SIGSEGV"))}


def case_monitored_barrier(work: Path) -> dict[str, str]:
    """Three spawned gloo ranks at a 3 s monitored barrier that rank 2 reaches 8 s late: rank 0 names it; then with
    wait_all_ranks, ranks 1 and 2 late, every one."""
    script = write_job(work, "monitored_barrier.py", MONITORED_BARRIER)
    return {f"monitored-barrier-{which}-late.log": run_bounded([TORCH_PYTHON, script, mode, str(free_port())], cwd=work)
            for which, mode in (("one", "one"), ("two", "all"))}


def case_openmpi_exit(work: Path) -> dict[str, str]:
    """Open MPI's mpirun (Debian's openmpi-bin, 4.1) running 2 gloo ranks, rank 1 raising, then exiting with 3: its
    report of the first process that exited with an error."""
    launch = _openmpi("openmpi-exit", 2)
    script = write_job(work, "mpi_started_ranks.py", MPI_STARTED_RANKS)
    return {f"openmpi-rank-{outcome}.log": run_bounded([*launch, TORCH_PYTHON, script, outcome, str(free_port())], cwd=work)
            for outcome in ("raise", "exit")}


def case_forced_kill(work: Path) -> dict[str, str]:
    """A crash (SIGSEGV) on rank 1; rank 0 ignores the agent's SIGTERM and is killed with SIGKILL by the agent (about 35 s)."""
    return {"torchrun-forced-kill.log": torchrun(work, write_job(work, "traps_sigterm.py", TRAPS_SIGTERM))}


def _kernel_lines() -> list[str]:
    return subprocess.run(["dmesg", "-T"], capture_output=True, text=True, timeout=30, check=True).stdout.splitlines(keepends=True)


@contextlib.contextmanager
def _cgroup_v1(controller: str, settings: Mapping[str, str]) -> Iterator[Path]:
    """A cgroup v1 group of controller with settings written, removed once its last process has gone."""
    root = Path("/sys/fs/cgroup") / controller
    if not (root / "tasks").is_file():
        raise SystemExit(f"this case needs the cgroup v1 {controller} controller at {root}")
    group = root / f"preflight-logs-{os.getpid()}"
    group.mkdir()
    try:
        for name, value in settings.items():
            (group / name).write_text(value)
        yield group
    finally:
        for _ in range(50):  # the group can be removed once its last process has gone
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def _torchrun_in(group: Path, work: Path, script: str) -> str:
    """A single-host torchrun of 2 ranks started inside a cgroup v1 group, with everything it starts."""
    return run_bounded(["sh", "-c", f'echo $$ > {group}/tasks && exec "$@"', "sh", *single_host_torchrun(), script], cwd=work)


def case_cgroup_oom(work: Path) -> dict[str, str]:
    """torchrun of 2 ranks in a cgroup v1 memory group of 1.5 GiB (as a container's or a Slurm job's limit): the kernel's
    OOM killer ends rank 1. torchrun's output, and the kernel's lines printed meanwhile (dmesg -T: the OOM report) as
    kern.log beside it."""
    with _cgroup_v1("memory", {"memory.limit_in_bytes": str(1536 << 20)}) as group:
        before = len(_kernel_lines())
        output = _torchrun_in(group, work, write_job(work, "growing_memory.py", GROWING_MEMORY))
        kernel = _kernel_lines()[before:]
    return {"torchrun-cgroup-oom/torchrun.log": output, "torchrun-cgroup-oom/kern.log": "".join(kernel)}


def case_fork_limit(work: Path) -> dict[str, str]:
    """As task-limit, with 8 DataLoader workers per rank in a pids group of 14 tasks: the workers cannot be forked."""
    with _cgroup_v1("pids", {"pids.max": "14"}) as group:
        script = write_job(work, "loader_workers.py", LOADER_WORKERS.replace("num_workers=4", "num_workers=8"))
        return {"torchrun-fork-limit.log": _torchrun_in(group, work, script)}


def case_task_limit(work: Path) -> dict[str, str]:
    """torchrun of 2 ranks, each with 4 DataLoader workers, in a cgroup v1 pids group of 30 tasks (a container's
    --pids-limit, systemd's TasksMax, a Slurm job's cgroup): the workers' queue threads cannot start."""
    with _cgroup_v1("pids", {"pids.max": "30"}) as group:
        return {"torchrun-task-limit.log": _torchrun_in(group, work, write_job(work, "loader_workers.py", LOADER_WORKERS))}


def case_late_rank(work: Path) -> dict[str, str]:
    """torchrun, 2 gloo ranks, LATE_RANK: rank 0's init_process_group waits for rank 1's address in the store."""
    return {"init-late-rank.log": torchrun(work, write_job(work, "late_rank.py", LATE_RANK))}


def case_restart_c10d(work: Path) -> dict[str, str]:
    """torchrun --max-restarts 1 with a c10d rendezvous on 127.0.0.1 (2 ranks, RAISES_ONCE): the restarted rank 0's gloo
    connects to the address rank 1 listened on in the first attempt, refused (pytorch/pytorch#167288 is NCCL's)."""
    script = write_job(work, "raises_once.py", RAISES_ONCE)
    return {"torchrun-restart-c10d.log": run_bounded(
        [*torchrun_argv(), "--nnodes", "1", "--nproc-per-node", "2", "--max-restarts", "1", "--rdzv-backend", "c10d",
         "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "job45", script], cwd=work)}


def _torchrun_log_dir(work: Path, folder: str, script: str, run_id: str, timeout: float = JOB_TIMEOUT_S) -> tuple[str, dict[str, str]]:
    """torchrun --log-dir --redirects 3 of script, 2 ranks: torchrun's own output, and each rank's logs under FOLDER/
    (RUN_ID/attempt_0/RANK/stdout.log, stderr.log)."""
    output = torchrun(work, script, "--rdzv-id", run_id, "--log-dir", str(work / "logs"), "--redirects", "3", timeout=timeout)
    root = work / "logs"
    return output, {f"{folder}/{path.relative_to(root)}": path.read_text(encoding="utf-8")
                    for path in sorted(root.rglob("*.log")) if "filtered" not in path.name}


def case_log_dir_hang(work: Path) -> dict[str, str]:
    """torchrun --log-dir: one folder per rank; killed at 20 s as hung."""
    return _torchrun_log_dir(work, "torchrun-log-dir-hang", write_job(work, "hang_rank_1.py", HANG_RANK_1), "job42", timeout=20)[1]


def _log_dir(work: Path, folder: str, script: str, run_id: str) -> dict[str, str]:
    """The ranks' logs of a torchrun --log-dir run under FOLDER/, and torchrun's own output, whose failure summary names
    the root cause, as FOLDER/torchrun.log beside them."""
    output, ranks = _torchrun_log_dir(work, folder, script, run_id)
    return {f"{folder}/torchrun.log": output, **ranks}


def case_log_dir_peer_exits(work: Path) -> dict[str, str]:
    """torchrun --log-dir of PEER_EXITS: rank 1 leaves without a word."""
    return _log_dir(work, "torchrun-log-dir-peer-exits", write_job(work, "peer_exits.py", PEER_EXITS), "job43")


def case_log_dir_rank_raises(work: Path) -> dict[str, str]:
    """torchrun --log-dir of RAISES_ONCE with no restart: rank 1 raises at step 3, its traceback in its own stderr.log."""
    return _log_dir(work, "torchrun-log-dir-rank-raises", write_job(work, "raises_once.py", RAISES_ONCE), "job46")


def gloo_across(sandbox: Any, script: Path, hosts: Sequence[str], env: Sequence[str] = (),
                python: str | None = None) -> dict[str, list[tuple[float, str]]]:
    """torchrun on each of hosts at once (one rank each, a static rendezvous at the sandbox master's address, gloo, no
    GLOO_SOCKET_IFNAME unless env, NAME=VALUE settings for every host, sets it), with python's torch: each host's output
    lines, each stamped with the shared monotonic clock as it arrived."""
    master = sandbox.master.address
    stamped: dict[str, list[tuple[float, str]]] = {}

    def launch(node_rank: int, host: str) -> None:
        # the underscore spellings, which torchrun has read since torch 1.9 (1.12.1's reads no dashed one)
        torchrun_cmd = [python or TORCH_PYTHON, "-m", "torch.distributed.run", "--nnodes", str(len(hosts)), "--nproc_per_node", "1",
                        "--node_rank", str(node_rank), "--master_addr", master, "--master_port", "29500", str(script)]
        # Each line is stamped as it arrives, so the hosts' logs can be merged in the order a log collector (srun, pdsh)
        # would have received them.
        stamp = "import sys, time\nfor line in sys.stdin: sys.stdout.write(f'{time.monotonic():.6f} {line}')"
        shell = f"timeout -k 5 170 {' '.join(torchrun_cmd)} 2>&1 | {sys.executable} -c \"{stamp}\""
        result = sandbox.run_in(host, ["env", "PYTHONUNBUFFERED=1", *env, "sh", "-c", shell], timeout=190)
        stamped[host] = [(float(t), text) for t, _, text in (line.partition(" ") for line in result.stdout.splitlines(keepends=True))]

    threads = [threading.Thread(target=launch, args=(k, name)) for k, name in enumerate(hosts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return stamped


def merged(stamped: Mapping[str, list[tuple[float, str]]]) -> str:
    """The hosts' lines in the order they arrived, each prefixed with its host, as `srun --label` or pdsh collect them."""
    return "".join(text for _, text in sorted((t, f"{host}: {text}") for host, lines in stamped.items() for t, text in lines))


def case_sandbox(work: Path) -> dict[str, str]:
    """Three namespace hosts: h1 as it should be, h2 whose /etc/hosts maps its name to 127.0.0.1, h3 whose name does not resolve."""
    sys.path.insert(0, str(REPO))
    from preflight.sandbox import HostQuirks, Sandbox

    script = work / write_job(work, "all_reduce.py", ALL_REDUCE)
    logs: dict[str, str] = {}
    quirks = {2: HostQuirks(own_name="loopback"), 3: HostQuirks(own_name="missing")}
    Sandbox.down_prefix(SANDBOX_PREFIX)  # what a killed earlier run left
    with Sandbox.up(3, prefix=SANDBOX_PREFIX, index=SANDBOX_INDEX, quirks=quirks) as sandbox:
        stamped = gloo_across(sandbox, script, ("h1", "h2"))
        for host, lines in stamped.items():
            logs[f"gloo-loopback-{host}.log"] = "".join(text for _, text in lines)
        logs["gloo-loopback-cluster.log"] = merged(stamped)

        # h3 alone, with torchrun's c10d rendezvous, which resolves this host's own name.
        h3 = sandbox.host("h3")
        argv = [TORCH_PYTHON, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"{h3.address}:29500", "--rdzv-id", "job7", str(script)]
        result = sandbox.run_in("h3", ["timeout", "-k", "5", str(JOB_TIMEOUT_S), *argv], timeout=JOB_TIMEOUT_S + 20)
        logs["hostname-does-not-resolve.log"] = result.stdout + result.stderr
    return logs


def older_torch(case: str, lowest: tuple[int, int], below: tuple[int, int]) -> tuple[str, str] | None:
    """--python and its torch's version, when that version is at least lowest and below below."""
    versions = f"{'.'.join(map(str, lowest))} to before {'.'.join(map(str, below))}"
    return other_python_says(case, f"torch {versions}", "import torch; print(torch.__version__.split('+')[0])",
                             lambda version: lowest <= tuple(int(part) for part in version.split(".")[:2]) < below)


def case_old_dev_shm_full(work: Path) -> dict[str, str]:
    """dev-shm-full's loader with torch 2.10 or 2.11, whose MapAllocator reports a failed posix_fallocate with errno, which
    posix_fallocate does not set (it returns its error): the message ends in "Success (0)", or whatever errno last held,
    where 2.12 on print the error itself ("No space left on device (28)")."""
    if (older := older_torch("old-dev-shm-full", (2, 10), (2, 12))) is None:
        return {}
    python, version = older
    script = write_job(work, "load_frames.py", LARGE_SAMPLES)
    return {f"dev-shm-full-torch{version}.log": _on_small_dev_shm(work, script, python=python)}


def case_old_gloo_loopback(work: Path) -> dict[str, str]:
    """gloo-loopback's two hosts with a torch from 1.9 (torchrun) to 2.0, whose gloo predates its 2023 connect rework
    (gloo's 31b1f02): the rank that dials the 127.0.0.1 its peer advertised reports the connect's SO_ERROR in pair.cc's
    own words."""
    if (older := older_torch("old-gloo-loopback", (1, 9), (2, 1))) is None:
        return {}
    python, version = older
    sys.path.insert(0, str(REPO))
    from preflight.sandbox import HostQuirks, Sandbox

    script = work / write_job(work, "all_reduce.py", ALL_REDUCE)
    Sandbox.down_prefix(SANDBOX_PREFIX)
    with Sandbox.up(2, prefix=SANDBOX_PREFIX, index=SANDBOX_INDEX, quirks={2: HostQuirks(own_name="loopback")}) as sandbox:
        stamped = gloo_across(sandbox, script, ("h1", "h2"), python=python)
    return {f"gloo-loopback-torch{version}-h1.log": "".join(text for _, text in stamped["h1"]),
            f"gloo-loopback-torch{version}-cluster.log": merged(stamped)}


def case_old_launch(work: Path) -> dict[str, str]:
    """torch.distributed.launch as torch 1.8 had it, the last before torchrun: 2 ranks, rank 1 ended by SIGKILL at step 3
    (the launcher's CalledProcessError, "died with <Signals.SIGKILL: 9>"); then 2 ranks and SIGTERM to the launcher once
    both logged step 3 ("Main process received SIGTERM, exiting"). 1.8 only: an earlier launcher has no handler for
    SIGTERM, and would leave its ranks running."""
    if (older := older_torch("old-launch", (1, 8), (1, 9))) is None:
        return {}
    python, version = older
    script = write_job(work, "launched_rank.py", LAUNCHED_RANK)
    launch = [python, "-m", "torch.distributed.launch", "--use_env", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
              "--master_port", str(free_port()), script]
    return {f"launch-rank-killed-torch{version}.log": run_bounded([*launch, "SIGKILL"], cwd=work),
            f"launch-sigterm-torch{version}.log": sigterm_at_step_3([*launch, "none"], work)}


def case_old_spawn(work: Path) -> dict[str, str]:
    """spawn-signal's job with torch 1.0 to 1.7, whose torch.multiprocessing.spawn raised a plain Exception ("Exception:
    process 1 terminated with signal SIGKILL") where 1.8 on raise ProcessExitedException."""
    if (older := older_torch("old-spawn", (1, 0), (1, 8))) is None:
        return {}
    python, version = older
    script = write_job(work, "spawned_ranks.py", SPAWNED_RANKS)
    return {f"spawn-rank-killed-torch{version}.log": run_bounded([python, script, "SIGKILL", str(free_port())], cwd=work)}


def case_deepspeed_launch(work: Path) -> dict[str, str]:
    """DeepSpeed's per-node launcher (deepspeed.launcher.launch, what the deepspeed command runs on each node) of 2 ranks
    that log a step every 0.5 s: rank 1 ended by SIGKILL at step 3 ("exits with return code = -9"), then SIGTERM to the
    launcher once both logged step 3 ("Main process received SIGTERM, exiting"). The ranks need no GPU: the launcher only
    sets CUDA_VISIBLE_DEVICES from its world info."""
    if (found := other_python_says("deepspeed-launch", "DeepSpeed", "import deepspeed; print(deepspeed.__version__)")) is None:
        return {}
    python, version = found
    script = write_job(work, "launched_rank.py", LAUNCHED_RANK)
    world_info = base64.b64encode(b'{"localhost": [0, 1]}').decode()
    launch = [python, "-m", "deepspeed.launcher.launch", f"--world_info={world_info}", "--master_addr", "127.0.0.1",
              "--master_port", str(free_port()), "--no_local_rank", script]
    return {f"deepspeed-rank-killed-{version}.log": run_bounded([*launch, "SIGKILL"], cwd=work),
            f"deepspeed-sigterm-{version}.log": sigterm_at_step_3([*launch, "none"], work)}


def case_etcd_unreachable(work: Path) -> dict[str, str]:
    """torchrun with each of its etcd rendezvous backends (etcd-v2, and the legacy etcd), whose endpoint is a loopback port
    no etcd server listens on (a server that is not running): the agent fails before any worker starts, etcd-v2 with
    torch's RendezvousConnectionError, etcd with python-etcd's own error."""
    torch_version = "import etcd, torch; print(torch.__version__.split('+')[0])"
    if (found := other_python_says("etcd-unreachable", "python-etcd", torch_version)) is None:
        return {}
    python, version = found
    script = write_job(work, "all_reduce.py", ALL_REDUCE)
    logs = {}
    for backend in ("etcd-v2", "etcd"):
        launch = [python, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", backend,
                  "--rdzv_endpoint", f"127.0.0.1:{free_port()}", "--rdzv_id", "job", str(script)]
        logs[f"rendezvous-{backend}-unreachable-torch{version}.log"] = run_bounded(launch, cwd=work)
    return logs


def case_old_late_rank(work: Path) -> dict[str, str]:
    """late-rank's job with a torch from 1.9 (torchrun) to 2.4, before TCPStore's wait named its keys: rank 0's gloo
    group waits in the store for rank 1's address, and the store's read times out as "Socket Timeout"."""
    if (older := older_torch("old-late-rank", (1, 9), (2, 5))) is None:
        return {}
    python, version = older
    return {f"init-late-rank-torch{version}.log": torchrun(work, write_job(work, "late_rank.py", LATE_RANK), python=python)}


def case_node_loss(work: Path) -> dict[str, str]:
    """Two namespace hosts train under torchrun (TRAIN_STEPS), with a c10d rendezvous at h1, whose agent hosts the store.
    Once both ranks have logged step 5, every process of h1's job is SIGKILLed at once, as a node that lost its power
    would end them: h2's torchrun output (the survivor's), read over ssh as it ran."""
    sys.path.insert(0, str(REPO))
    from preflight.sandbox import Sandbox

    script = work / write_job(work, "train_steps.py", TRAIN_STEPS)
    Sandbox.down_prefix(SANDBOX_PREFIX)
    with Sandbox.up(2, prefix=SANDBOX_PREFIX, index=SANDBOX_INDEX) as sandbox:
        idle = set(sandbox.pids("h1"))  # its anchor and sshd, which stay: the node's job is what goes
        command = (f"PYTHONUNBUFFERED=1 timeout -k 5 {JOB_TIMEOUT_S} {TORCH_PYTHON} -m torch.distributed.run --nnodes 2 "
                   f"--nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint {sandbox.master.address}:29500 --rdzv-id job44 "
                   f"{script} 2>&1")
        jobs = {host: subprocess.Popen(sandbox.ssh_argv(host, command), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                       text=True) for host in ("h1", "h2")}
        lines: dict[str, list[str]] = {host: [] for host in jobs}
        readers = [threading.Thread(target=lambda h=host: lines[h].extend(jobs[h].stdout or ()), daemon=True) for host in jobs]
        for reader in readers:
            reader.start()
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while not all(any("step 5" in line for line in lines[h]) for h in jobs) and time.monotonic() < deadline:
            time.sleep(0.2)
        for _ in range(3):  # a process forked meanwhile goes in the next pass
            for pid in set(sandbox.pids("h1")) - idle:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        try:
            jobs["h2"].wait(timeout=JOB_TIMEOUT_S + 20)
        finally:
            for job in jobs.values():
                job.kill()
                job.wait()
        for reader in readers:
            reader.join(10)
    return {"rendezvous-host-lost-h2.log": "".join(lines["h2"])}


def case_hostname_foreign(work: Path) -> dict[str, str]:
    """Two namespace hosts: h2's /etc/hosts maps its name to an address no host has (a cloned image's stale entry)."""
    sys.path.insert(0, str(REPO))
    from preflight.sandbox import HostQuirks, Sandbox

    script = work / write_job(work, "all_reduce.py", ALL_REDUCE)
    Sandbox.down_prefix(SANDBOX_PREFIX)
    with Sandbox.up(2, prefix=SANDBOX_PREFIX, index=SANDBOX_INDEX, quirks={2: HostQuirks(own_name="foreign")}) as sandbox:
        stamped = gloo_across(sandbox, script, ("h1", "h2"))
    return {"gloo-hostname-foreign-h2.log": "".join(text for _, text in stamped["h2"]),
            "gloo-hostname-foreign-cluster.log": merged(stamped)}


def case_mtu_blackhole(work: Path) -> dict[str, str]:
    """Two namespace hosts whose interfaces are at MTU 9000 while the bridge's ports carry 1500 (jumbo frames on the hosts,
    not on the switch): the rendezvous and gloo's handshake pass, LARGE_ALL_REDUCE's full-size segments are dropped."""
    sys.path.insert(0, str(REPO))
    from preflight.sandbox import Sandbox

    script = work / write_job(work, "large_all_reduce.py", LARGE_ALL_REDUCE)
    Sandbox.down_prefix(SANDBOX_PREFIX)
    with Sandbox.up(2, prefix=SANDBOX_PREFIX, index=SANDBOX_INDEX) as sandbox:
        for name in ("h1", "h2"):
            host = sandbox.host(name)
            result = sandbox.run_in(name, ["ip", "link", "set", "dev", host.ifname, "mtu", "9000"])
            if result.returncode:
                raise RuntimeError(f"{name}: ip link set mtu 9000: {result.stderr.strip()}")
        stamped = gloo_across(sandbox, script, ("h1", "h2"))
    # Which rank's connection the kernel gives up on first varies from run to run: the other waits out its recv.
    return {**{f"gloo-mtu-blackhole-{host}.log": "".join(text for _, text in lines) for host, lines in stamped.items()},
            "gloo-mtu-blackhole-cluster.log": merged(stamped)}


def case_rail_astray(work: Path) -> dict[str, str]:
    """Two namespace hosts with one rail each (eth1, a bridge and a /24 of its own), GLOO_SOCKET_IFNAME=eth1 on both, and
    h2's rail addressed on another subnet (Faults.misaddress_rail: a mistyped address, a NIC readdressed for another
    switch): each rank advertises its rail address, and h2 has no route to h1's."""
    sys.path.insert(0, str(REPO))
    from preflight.sandbox import Sandbox

    script = work / write_job(work, "all_reduce.py", ALL_REDUCE)
    Sandbox.down_prefix(SANDBOX_PREFIX)
    with Sandbox.up(2, prefix=SANDBOX_PREFIX, index=SANDBOX_INDEX, rails=1) as sandbox:
        sandbox.misaddress_rail("h2", 0)
        stamped = gloo_across(sandbox, script, ("h1", "h2"), env=("GLOO_SOCKET_IFNAME=eth1",))
    return {**{f"gloo-rail-astray-{host}.log": "".join(text for _, text in lines) for host, lines in stamped.items()},
            "gloo-rail-astray-cluster.log": merged(stamped)}


def set_sysctl(sandbox: Any, hosts: Sequence[str], setting: str) -> None:
    """A network sysctl (NAME=VALUE) in each host's namespace: its own, gone with the namespace."""
    for host in hosts:
        result = sandbox.run_in(host, ["sysctl", "-q", "-w", setting])
        if result.returncode:
            raise RuntimeError(f"{host}: sysctl {setting}: {result.stderr.strip()}")


def case_ports_exhausted(work: Path) -> dict[str, str]:
    """Two namespace hosts whose net.ipv4.ip_local_port_range is two ports (40000-40001), which torchrun's own store
    connections take: gloo's bind to port 0 finds none. Run twice: with GLOO_SOCKET_IFNAME=eth0 (gloo's listener fails
    to bind), and without (torch's test bind of the host name's address fails first, and it falls back to 127.0.0.1)."""
    sys.path.insert(0, str(REPO))
    from preflight.sandbox import Sandbox

    script = work / write_job(work, "all_reduce.py", ALL_REDUCE)
    logs: dict[str, str] = {}
    for env, name in ((("GLOO_SOCKET_IFNAME=eth0",), "gloo-ports-exhausted"), ((), "gloo-ports-exhausted-fallback")):
        Sandbox.down_prefix(SANDBOX_PREFIX)
        with Sandbox.up(2, prefix=SANDBOX_PREFIX, index=SANDBOX_INDEX) as sandbox:
            set_sysctl(sandbox, ("h1", "h2"), "net.ipv4.ip_local_port_range=40000 40001")
            stamped = gloo_across(sandbox, script, ("h1", "h2"), env=env)
        if env:
            logs[f"{name}-h1.log"] = "".join(text for _, text in stamped["h1"])
        else:
            logs[f"{name}-cluster.log"] = merged(stamped)
    return logs


def case_rendezvous_dropped(work: Path) -> dict[str, str]:
    """Node 1 of 2 on h2, its rendezvous endpoint h1's address, where every packet that arrives is dropped (a firewall
    rule, a security group without the port, a host gone dark): each connect times out (ETIMEDOUT) until the rendezvous
    gives up. h2's namespace sends a SYN twice (net.ipv4.tcp_syn_retries=1, about 3 s), where Linux's default 6 waits
    about 2 minutes for each connect: the same kernel path, sooner. Both rendezvous (node_one_alone)."""
    sys.path.insert(0, str(REPO))
    from preflight.sandbox import Sandbox

    script = str(work / write_job(work, "all_reduce.py", ALL_REDUCE))
    logs: dict[str, str] = {}
    Sandbox.down_prefix(SANDBOX_PREFIX)
    with Sandbox.up(2, prefix=SANDBOX_PREFIX, index=SANDBOX_INDEX) as sandbox:
        sandbox.blackhole("h1")
        set_sysctl(sandbox, ("h2",), "net.ipv4.tcp_syn_retries=1")
        static, c10d = node_one_alone([TORCH_PYTHON, "-m", "torch.distributed.run"], sandbox.host("h1").address, 29500, script)
        for name, argv in (("rendezvous-dropped.log", static), ("rendezvous-dropped-c10d.log", c10d)):
            result = sandbox.run_in("h2", ["timeout", "-k", "5", str(JOB_TIMEOUT_S), *argv], timeout=JOB_TIMEOUT_S + 20)
            logs[name] = result.stdout + result.stderr
    return logs


def case_link_down(work: Path) -> dict[str, str]:
    """Two namespace hosts train (STEPS_THEN_MARK); once both are past step 5, h2's link goes down at the bridge, as a
    pulled cable or a failed switch port. Linux's default tcp_retries2 (15) gives up on a connection after about 15
    minutes, past this script's bounds, so both hosts' namespaces run with 5 (about 6 s at this RTT): the same kernel
    path, sooner. Both hosts' output, merged."""
    sys.path.insert(0, str(REPO))
    from preflight.sandbox import Sandbox

    mark = work / "link-down.mark"
    script = work / write_job(work, "steps_then_mark.py", STEPS_THEN_MARK.replace('"MARK"', repr(str(mark))))
    Sandbox.down_prefix(SANDBOX_PREFIX)
    with Sandbox.up(2, prefix=SANDBOX_PREFIX, index=SANDBOX_INDEX) as sandbox:
        set_sysctl(sandbox, ("h1", "h2"), "net.ipv4.tcp_retries2=5")

        def pull_when_marked() -> None:
            deadline = time.monotonic() + JOB_TIMEOUT_S
            while not mark.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            if mark.exists():
                sandbox.pull_link("h2")

        puller = threading.Thread(target=pull_when_marked, daemon=True)
        puller.start()
        stamped = gloo_across(sandbox, script, ("h1", "h2"))
        puller.join(JOB_TIMEOUT_S)
    return {"gloo-link-down-cluster.log": merged(stamped)}


CASES: dict[str, Callable[[Path], dict[str, str]]] = {
    "unused-parameters": case_unused_parameters,
    "inplace": case_inplace,
    "port-in-use": case_port_in_use,
    "sampler-with-shuffle": case_sampler_with_shuffle,
    "collective-timeout": case_collective_timeout,
    "collective-size-mismatch": case_collective_size_mismatch,
    "interface-missing": case_interface_missing,
    "rendezvous-timeout": case_rendezvous_timeout,
    "rendezvous-refused": case_rendezvous_refused,
    "clean": case_clean,
    "cpu-build": case_cpu_build,
    "dev-shm-full": case_dev_shm_full,
    "dev-shm-bus-error": case_dev_shm_bus_error,
    "dev-shm-semaphore": case_dev_shm_semaphore,
    "open-file-limit": case_open_file_limit,
    "filesystem-full": case_filesystem_full,
    "launch-environment": case_launch_environment,
    "sandbox": case_sandbox,
    "hostname-foreign": case_hostname_foreign,
    "mtu-blackhole": case_mtu_blackhole,
    "rail-astray": case_rail_astray,
    "ports-exhausted": case_ports_exhausted,
    "link-down": case_link_down,
    "rendezvous-dropped": case_rendezvous_dropped,
    "node-loss": case_node_loss,
    "log-dir-hang": case_log_dir_hang,
    "log-dir-peer-exits": case_log_dir_peer_exits,
    "log-dir-rank-raises": case_log_dir_rank_raises,
    "sigterm": case_sigterm,
    "peer-exits": case_peer_exits,
    "mpich-signal": case_mpich_signal,
    "openmpi-signal": case_openmpi_signal,
    "openmpi-exit": case_openmpi_exit,
    "forced-kill": case_forced_kill,
    "spawn-signal": case_spawn_signal,
    "monitored-barrier": case_monitored_barrier,
    "stack-dumps": case_stack_dumps,
    "cgroup-oom": case_cgroup_oom,
    "task-limit": case_task_limit,
    "fork-limit": case_fork_limit,
    "restart-c10d": case_restart_c10d,
    "late-rank": case_late_rank,
    "old-dev-shm-full": case_old_dev_shm_full,
    "old-gloo-loopback": case_old_gloo_loopback,
    "old-launch": case_old_launch,
    "old-spawn": case_old_spawn,
    "old-late-rank": case_old_late_rank,
    "deepspeed-launch": case_deepspeed_launch,
    "etcd-unreachable": case_etcd_unreachable,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", metavar="CASE", help="cases to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--python", metavar="PYTHON", help="another python, for the cases that need one (old-*: an older "
                        "torch; deepspeed-launch: DeepSpeed)")
    parser.add_argument("--torch", metavar="PYTHON", help="run every job under this python and its torch (make_logs "
                        "itself, the sandbox and the line stamper stay on this one)")
    parser.add_argument("--out", metavar="DIR", type=Path, default=HERE, help="write the logs there (default: this folder)")
    args = parser.parse_args()
    global OTHER_PYTHON, TORCH_PYTHON
    OTHER_PYTHON = args.python
    TORCH_PYTHON = args.torch or sys.executable
    if args.list:
        print("\n".join(CASES))
        return 0
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s): {', '.join(unknown)}; --list names them")
    for name in args.cases or list(CASES):
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="preflight-logs-") as tmp:
            for filename, text in CASES[name](Path(tmp)).items():
                (args.out / filename).parent.mkdir(parents=True, exist_ok=True)
                (args.out / filename).write_text(text, encoding="utf-8")
                print(f"{name}: wrote {filename} ({len(text.splitlines())} lines, {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
