"""A few DDP steps on this rank's GPU, started only with what emit-launch wrote."""
import datetime
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group(backend=os.environ.get("PREFLIGHT_BACKEND", "nccl"),
                        timeout=datetime.timedelta(seconds=int(os.environ.get("PREFLIGHT_INIT_TIMEOUT_S", "600"))),
                        device_id=torch.device("cuda", local))
model = DistributedDataParallel(torch.nn.Linear(1024, 1024).cuda(), device_ids=[local])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(20):
    opt.zero_grad()
    model(torch.randn(64, 1024, device="cuda")).square().mean().backward()
    opt.step()
torch.cuda.synchronize()
print(json.dumps({"rank": dist.get_rank(), "world": dist.get_world_size(), "backend": dist.get_backend(),
                  "env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "MASTER_", "PREFLIGHT_", "TORCH_NCCL"))}}))
dist.destroy_process_group()
