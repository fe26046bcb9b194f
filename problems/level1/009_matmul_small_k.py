"""Outer-product-like matrix multiplication [M, K] @ [K, N] with K = 64 and a huge output.
Writing C dominates: the kernel is bound by store bandwidth, not FLOPs.
"""

import torch
import torch.nn as nn

CATEGORY = "gemm"
M = 16384
K = 64
N = 16384
PRESETS = {"ci": {"M": 1024, "K": 32, "N": 1024}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
