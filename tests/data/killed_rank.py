"""A gloo job for torchrun whose rank 1 is SIGKILLed in the middle of an all_reduce loop, as the kernel's OOM killer or
an operator's kill -9 does; the other ranks are in (or about to enter) the same all_reduce when their peer's sockets
close.

Every rank runs all_reduces of 64 KiB in a loop bounded in count and in time (LOOP_S). Rank 1 starts a timer at
KILL_AFTER_STEPS steps that sends SIGKILL to its own process KILL_DELAY_S later, while its main thread is inside the
loop: the process dies mid-collective, without a traceback. Each rank logs its steps with a time, as training scripts
do.
"""

from __future__ import annotations

import datetime
import logging
import os
import signal
import threading
import time

import torch
import torch.distributed as dist

KILL_AFTER_STEPS = 20
KILL_DELAY_S = 0.05
LOOP_S = 30
MAX_STEPS = 100_000

logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", level=logging.INFO)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
tensor = torch.ones(1 << 14)
deadline = time.monotonic() + LOOP_S
for step in range(MAX_STEPS):
    if time.monotonic() > deadline:
        break
    if rank == 1 and step == KILL_AFTER_STEPS:
        threading.Timer(KILL_DELAY_S, os.kill, (os.getpid(), signal.SIGKILL)).start()
    dist.all_reduce(tensor)
    if step % 10 == 0:
        logging.info("rank %d: step %d", rank, step)
dist.destroy_process_group()
