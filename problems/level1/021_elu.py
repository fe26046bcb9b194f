"""ELU with alpha 1.0 on a [B, N] matrix: exp(x) - 1 for negative inputs, where expm1 keeps
precision near zero.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

CATEGORY = "elementwise"
batch_size = 16384
dim = 32768
PRESETS = {"ci": {"batch_size": 512, "dim": 4096}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.elu(x, alpha=1.0)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
