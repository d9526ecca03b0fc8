"""One NCCL rank on a GPU that torch has filled first: NCCL's own buffers find no memory left."""
import torch
import torch.distributed as dist

torch.cuda.set_device(0)
free, total = torch.cuda.mem_get_info()
held = [torch.empty(free - (512 << 20), dtype=torch.uint8, device="cuda")]
while True:  # the rest in 2 MiB pieces, until the GPU has none left
    try:
        held.append(torch.empty(2 << 20, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError:
        break
print(f"holding {sum(h.numel() for h in held) >> 20} MiB of {total >> 20} MiB", flush=True)
dist.init_process_group("nccl", device_id=torch.device("cuda:0"))
tensor = torch.ones(1 << 20, device="cuda")
dist.all_reduce(tensor)
torch.cuda.synchronize()
dist.destroy_process_group()
