"""Rectangular matrix multiplication C = A @ B with A [M, K] and B [K, N], M != N != K. Checks
that a kernel handles non-square tile grids and edge tiles.
"""

import torch
import torch.nn as nn

CATEGORY = "gemm"
M = 2048
K = 8192
N = 4096
PRESETS = {"ci": {"M": 256, "K": 1024, "N": 512}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
