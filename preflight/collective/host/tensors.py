"""The verified payload and the collectives on it (torch is imported inside each function)."""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch



_MASK32 = 0xFFFFFFFF


def payload(seed: int, rank: int, elements: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Rank's int32 payload: a bijective hash of the element index keyed by (seed, rank), so every element differs
    from its neighbours and from the same element of every other rank, on any device and torch version."""
    import torch

    key = seed * 1000003 + rank
    offset = (key * 0x9E3779B1) & _MASK32
    # Every product stays below 2**63: int64 never overflows, so CPU and CUDA agree exactly.
    v = (torch.arange(elements, dtype=torch.int64, device=device) + offset) & _MASK32
    v = (v * 0x2545F491) & _MASK32
    v = v ^ (v >> 16)
    v = (v * 0x045D9F3B) & _MASK32
    v = v ^ (v >> 16)
    return (v - (1 << 31)).to(torch.int32)


def count_wrong(received: torch.Tensor, seed: int, world_size: int) -> tuple[int, dict[int, int]]:
    """Wrong elements in an all_gather's output (every rank's payload in rank order): the total and, for each
    source rank with any, its count."""
    import torch

    if received.dim() != 1 or received.numel() % world_size:
        raise ValueError(f"received must be 1-D with a multiple of {world_size} elements, not shape {tuple(received.shape)}")
    elements = received.numel() // world_size
    # One expected chunk at a time, so the check needs memory for one rank's payload, not the whole world's.
    counts = torch.stack([torch.ne(received[src * elements:(src + 1) * elements], payload(seed, src, elements, received.device)).sum()
                          for src in range(world_size)]).tolist()
    by_source = {src: int(n) for src, n in enumerate(counts) if n}
    return sum(by_source.values()), by_source


def all_gather_json(value: Any, world_size: int, device: torch.device | str = "cpu") -> list[Any]:
    """Every rank's JSON-able value, in rank order. torch's all_gather_object decodes through numpy, which torch does
    not require: in an environment without it (a fresh venv with only torch) every rank failed with "Numpy is not
    available". JSON bytes in uint8 tensors, padded to the longest, need nothing but torch."""
    import torch
    import torch.distributed as dist

    data = json.dumps(value).encode()
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world_size)]
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64, device=device))
    longest = max(int(size.item()) for size in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8, device=device)
    mine[:len(data)] = torch.tensor(list(data), dtype=torch.uint8, device=device)
    chunks = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(world_size)]
    dist.all_gather(chunks, mine)
    # Indexed, not zip(strict=): the worker runs on python 3.8's grammar too (chunks and sizes are one a rank).
    return [json.loads(bytes(chunk[:int(sizes[i].item())].tolist())) for i, chunk in enumerate(chunks)]



def all_gather_single() -> Callable[[torch.Tensor, torch.Tensor], object]:
    import torch.distributed as dist

    # Newer torch names it all_gather_single and warns on every call of the old name, inside the timed loop too.
    gather: Callable[[torch.Tensor, torch.Tensor], object] = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather


def destroy_if_initialized() -> None:
    """Best effort: a process group left behind after an error must not keep the store or the GPU busy."""
    if "torch.distributed" not in sys.modules:
        return
    import torch.distributed as dist

    try:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        traceback.print_exc()
