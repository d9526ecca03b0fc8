"""Fill the GPU through torch's caching allocator, keep it full, then call a library that allocates for itself:
cuBLAS (a first matmul creates its handle) or cuDNN (a first convolution). What each prints is the capture."""
import sys

import torch

what = sys.argv[1]
torch.cuda.init()
a = torch.randn(64, 64, device="cuda")
image, weight = torch.randn(1, 3, 32, 32, device="cuda"), torch.randn(8, 3, 3, 3, device="cuda")
held = []
for size in (1 << 30, 2 << 20):  # 1 GiB pieces, then 2 MiB ones: every byte the allocator can get
    while True:
        try:
            held.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            break
free_mib = torch.cuda.mem_get_info()[0] / 2**20
print(f"held {sum(t.numel() for t in held) / 2**30:.1f} GiB in {len(held)} pieces; free {free_mib:.0f} MiB", flush=True)
if what == "cublas":
    print((a @ a).sum().item())
else:
    print(torch.nn.functional.conv2d(image, weight).sum().item())
