"""Square matrix multiplication C = A @ B with A, B [N, N]. The reference point for every GEMM
kernel: tiling, shared-memory staging and register blocking decide the speed; at full size
it is compute-bound.
"""

import torch
import torch.nn as nn

CATEGORY = "gemm"
N = 4096
PRESETS = {"ci": {"N": 512}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(N, N), torch.randn(N, N)]


def get_init_inputs():
    return []
