"""Matrix multiplication with a tiny output and a huge reduction dimension: [M, K] @ [K, N]
with M = N = 256 and K = 262144. Too few output tiles to fill the machine: needs split-K.
"""

import torch
import torch.nn as nn

CATEGORY = "gemm"
M = 256
K = 262144
N = 256
PRESETS = {"ci": {"M": 64, "K": 32768, "N": 64}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
