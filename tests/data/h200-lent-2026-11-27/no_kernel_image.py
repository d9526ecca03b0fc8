"""A CUDA extension built for sm_80 only (no PTX), its kernel launched on this GPU: what torch prints when a build
lacks the GPU's architecture."""
import os

import torch
from torch.utils.cpp_extension import load_inline

os.environ["TORCH_CUDA_ARCH_LIST"] = "8.0"
cuda = r"""
#include <c10/cuda/CUDAException.h>
__global__ void add_one(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.0f; }
torch::Tensor add_one_launch(torch::Tensor x) {
  add_one<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), x.numel());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return x;
}
"""
cpp = "torch::Tensor add_one_launch(torch::Tensor x);"
ext = load_inline("sm80_only", cpp_sources=cpp, cuda_sources=cuda, functions=["add_one_launch"],
                  extra_cuda_cflags=["-gencode=arch=compute_80,code=sm_80"], verbose=False)
print(ext.add_one_launch(torch.zeros(1024, device="cuda")).sum().item())
