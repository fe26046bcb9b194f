"""C = A^T @ B where A is stored [K, M]. The left operand is read column-wise, so a kernel must
load it transposed (or swap the loop order) to keep accesses coalesced.
"""

import torch
import torch.nn as nn

CATEGORY = "gemm"
M = 4096
K = 4096
N = 4096
PRESETS = {"ci": {"M": 512, "K": 512, "N": 512}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A.T, B)


def get_inputs():
    return [torch.randn(K, M), torch.randn(K, N)]


def get_init_inputs():
    return []
