"""A small DDP training run for torchrun, started with nothing but what `preflight emit-launch` wrote.

A few SGD steps over a DistributedSampler-sharded dataset; each rank then prints one JSON line: its rank, the
indices it trained on, and a digest of its parameters, which must be the same on every rank.
"""

from __future__ import annotations

import datetime
import gc
import hashlib
import json
import os
import socket

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

SAMPLES = 240  # divisible by 1 to 6 ranks: the sampler pads nothing, so shards are disjoint


def digest(model: torch.nn.Module) -> str:
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def train() -> None:
    rank = dist.get_rank()
    # Different starting weights per rank: DDP's broadcast from rank 0 is part of what is tested.
    torch.manual_seed(100 + rank)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    initial = digest(model)
    data_seed = torch.Generator().manual_seed(1)
    inputs = torch.randn(SAMPLES, 8, generator=data_seed)
    targets = inputs.sum(dim=1, keepdim=True)
    sampler = DistributedSampler(TensorDataset(inputs, targets), shuffle=True, seed=7)
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=10, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps, seen = 0, []
    for epoch in range(2):
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        if epoch == 0:
            seen = list(sampler)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            steps += 1
    # One write of the whole line: ranks share the job's output, and print's separate write of the newline let
    # two ranks' lines run together.
    os.write(1, (json.dumps({
        "rank": rank, "local_rank": int(os.environ["LOCAL_RANK"]), "world_size": dist.get_world_size(), "host": socket.gethostname(),
        "steps": steps,
        "initial": initial, "params": digest(model), "indices": seen, "master_addr": os.environ["MASTER_ADDR"],
        "master_port": os.environ["MASTER_PORT"], "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
    }) + "\n").encode())
    dist.barrier()  # the store's host must not leave before the others are done with it


def main() -> None:
    # The README's snippet: init_process_group reads no variable for its timeout, so the launch passes one.
    timeout = datetime.timedelta(seconds=int(os.environ.get("PREFLIGHT_INIT_TIMEOUT_S", "600")))
    dist.init_process_group(backend=os.environ.get("PREFLIGHT_BACKEND", "nccl"), timeout=timeout)
    try:
        train()
        # DDP's module is a reference cycle that holds the process group: left to the collection at interpreter exit, the
        # group's worker threads were still dropping finished work (which needs the GIL) while Python shut down, and the
        # rank aborted with "terminate called without an active exception" in about one gloo run in ten (torch 2.13).
        # Collected here, destroy_process_group frees the group and joins its threads while Python still runs.
        gc.collect()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
