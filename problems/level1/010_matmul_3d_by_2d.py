"""A 3-D tensor [B, M, K] times a shared 2-D matrix [K, N] (broadcast matmul). Equivalent to
one GEMM of [B*M, K] by [K, N] if the kernel sees through the batch dimension.
"""

import torch
import torch.nn as nn

CATEGORY = "gemm"
batch = 16
M = 1024
K = 2048
N = 2048
PRESETS = {"ci": {"batch": 4, "M": 128, "K": 512, "N": 512}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(batch, M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
