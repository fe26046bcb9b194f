"""C = A^T @ B^T with A stored [K, M] and B stored [N, K]. Both operands arrive in the
unfriendly layout.
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
        return torch.matmul(A.T, B.T)


def get_inputs():
    return [torch.randn(K, M), torch.randn(N, K)]


def get_init_inputs():
    return []
