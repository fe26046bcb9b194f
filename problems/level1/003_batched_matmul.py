"""Batched matrix multiplication (torch.bmm) of [B, M, K] and [B, K, N]. Many independent
medium GEMMs: the batch index becomes a grid dimension.
"""

import torch
import torch.nn as nn

CATEGORY = "gemm"
batch = 64
M = 1024
K = 1024
N = 1024
PRESETS = {"ci": {"batch": 8, "M": 128, "K": 256, "N": 256}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.bmm(A, B)


def get_inputs():
    return [torch.randn(batch, M, K), torch.randn(batch, K, N)]


def get_init_inputs():
    return []
