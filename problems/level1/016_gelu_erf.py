"""Exact (erf-based) GELU on a [B, N] matrix. The erf makes it the most expensive common
activation per element, yet it stays memory-bound on a GPU.
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
        return F.gelu(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
