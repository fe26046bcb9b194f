"""Inclusive prefix sum along the last dimension of [B, N]. A scan: sequential by definition,
parallel only through a work-efficient (Blelloch or decoupled look-back) algorithm; fp32
summation order changes the result slightly.
"""

import torch
import torch.nn as nn

CATEGORY = "scan"
batch_size = 16384
dim = 16384
PRESETS = {"ci": {"batch_size": 256, "dim": 4096}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=-1)


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
