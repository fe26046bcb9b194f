"""C = A @ B^T where B is stored [N, K], the layout of nn.Linear weights. Both operands are
K-contiguous, the friendliest layout for dot-product tiles.
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
        return torch.matmul(A, B.T)


def get_inputs():
    return [torch.randn(M, K), torch.randn(N, K)]


def get_init_inputs():
    return []
