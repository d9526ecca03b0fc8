"""The baseline of bench/collective_speed.py: the textbook torch.distributed timing loop, nothing of preflight's.

Started by torchrun on every host with ``'{"sizes": [...], "ops": [...], "warmup": N, "iters": N}'``; every rank prints
one ``PLAIN {json}`` line per (op, size) with its busbw (nccl-tests' factors: all_gather (n-1)/n, all_reduce 2(n-1)/n).
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.distributed as dist


def seconds_per_op(op: str, elements: int, n: int, warmup: int, iters: int) -> float:
    """Mean seconds of one op over `elements` float32 elements in all, after an untimed warm-up and a barrier."""
    if op == "all_gather":
        output, shard = torch.zeros(elements), torch.zeros(elements // n)
        for _ in range(warmup):
            dist.all_gather_into_tensor(output, shard)
        dist.barrier()
        begun = time.perf_counter()
        for _ in range(iters):
            dist.all_gather_into_tensor(output, shard)
    else:
        buffer = torch.zeros(elements)
        for _ in range(warmup):
            dist.all_reduce(buffer)
        dist.barrier()
        begun = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buffer)
    return (time.perf_counter() - begun) / iters


def main() -> None:
    """Time every (op, size) the way a user would write it by hand."""
    config = json.loads(sys.argv[1])
    dist.init_process_group("gloo")
    try:
        n = dist.get_world_size()
        for op in config["ops"]:
            factor = (n - 1) / n if op == "all_gather" else 2 * (n - 1) / n
            for size in config["sizes"]:
                elements = size // 4 // n * n
                seconds = seconds_per_op(op, elements, n, config["warmup"], config["iters"])
                print("PLAIN " + json.dumps({"op": op, "bytes": size, "busbw_GBps": elements * 4 / seconds / 1e9 * factor}), flush=True)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
