"""One process: NCCL init on cuda:LOCAL_RANK, an all_reduce, destroy. Run under torchrun; prints what NCCL prints."""
import datetime
import os

import torch
import torch.distributed as dist

dev = int(os.environ.get("DEV", os.environ.get("LOCAL_RANK", "0")))
torch.cuda.set_device(dev)
dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=60), device_id=torch.device("cuda", dev))
t = torch.ones(1 << 20, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
print("rank", dist.get_rank(), "sum", t[0].item(), "nccl", torch.cuda.nccl.version(), flush=True)
dist.destroy_process_group()
