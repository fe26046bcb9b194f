"""Matrix-vector product y = A @ x with A [M, K] and x [K, 1]. Arithmetic intensity is about
0.5 FLOP/byte, so the kernel is bound by streaming A once.
"""

import torch
import torch.nn as nn

CATEGORY = "gemm"
M = 32768
K = 32768
PRESETS = {"ci": {"M": 2048, "K": 2048}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, 1)]


def get_init_inputs():
    return []
