"""Plain matmul of two inputs followed by sigmoid and a constant scale.

y = sigmoid(A @ B) * 2.0 with A [M, K] and B [K, N] both given as inputs (no weights), so
B is row-major in K: the kernel must handle the non-transposed right operand layout.
Full size M=2048, K=8192, N=4096.
"""

import torch
import torch.nn as nn

CATEGORY = "gemm_epilogue"
M = 2048
K = 8192
N = 4096
PRESETS = {"ci": {"M": 256, "K": 1024, "N": 1024}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(torch.matmul(A, B)) * 2.0


def get_inputs():
    # A is scaled by 1/sqrt(K) so the product is ~N(0, 1) where the sigmoid is informative.
    # Unscaled, the product is ~N(0, sqrt(K)): the sigmoid saturates, and the fp32 reference is
    # itself ~4e-4 from the exact product at K = 8192, outside the strict band.
    return [torch.randn(M, K) * K**-0.5, torch.randn(K, N)]


def get_init_inputs():
    return []
