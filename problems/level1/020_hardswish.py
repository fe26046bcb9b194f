"""Hard-swish x * relu6(x + 3) / 6 on a [B, N] matrix: piecewise polynomial, cheap and exactly
reproducible.
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
        return F.hardswish(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
