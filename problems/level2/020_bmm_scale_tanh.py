"""Batched matmul of two inputs [B, M, K] @ [B, K, N], scaled by 0.125, then tanh. A batched
GEMM with a pointwise epilogue and no weights.
"""

import torch
import torch.nn as nn

CATEGORY = "gemm_epilogue"
batch = 32
M = 1024
K = 1024
N = 2048
PRESETS = {"ci": {"batch": 4, "M": 128, "K": 256, "N": 256}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.bmm(a, b) * 0.125)


def get_inputs():
    return [torch.randn(batch, M, K), torch.randn(batch, K, N)]


def get_init_inputs():
    return []
