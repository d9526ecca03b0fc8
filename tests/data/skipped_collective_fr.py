"""A gloo job for torchrun in which the last rank skips a collective the others enter, with the flight recorder on.

Every rank issues two all_reduces and a broadcast; then every rank but the last enters a third all_reduce and waits for
it JOB_TIMEOUT_S seconds (Work.wait's own timeout: the process group's, which also bounds init_process_group's joining,
stays long enough for hosts that start seconds apart on a loaded machine). Each rank then writes torch's flight recorder dump to
TORCH_FR_DUMP_TEMP_FILE + its rank: gloo's watchdog does not dump on a timeout as NCCL's does (TORCH_NCCL_DUMP_ON_TIMEOUT),
so the job asks for the dump itself, with the call torch provides for that.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
tensor = torch.ones(4)
dist.all_reduce(tensor)
dist.broadcast(tensor, src=0)
dist.all_reduce(tensor)
if rank != world - 1:  # the last rank skips it
    try:
        dist.all_reduce(tensor, async_op=True).wait(timeout=datetime.timedelta(seconds=int(os.environ.get("JOB_TIMEOUT_S", "6"))))
    except RuntimeError as e:
        print(f"rank {rank}: all_reduce failed: {str(e).splitlines()[0]}", flush=True)
prefix = os.environ["TORCH_FR_DUMP_TEMP_FILE"]
os.makedirs(os.path.dirname(prefix), exist_ok=True)
with open(f"{prefix}{rank}", "wb") as f:
    f.write(_dump_fr_trace())
print(f"rank {rank}: flight recorder dump written", flush=True)
