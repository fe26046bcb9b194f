"""Reverse cumulative product along the last dimension, computed as flip-cumprod-flip, on
values near 1 so the products stay finite. Tests a scan with a multiplicative operator and
reversed direction.
"""

import torch
import torch.nn as nn

CATEGORY = "scan"
batch_size = 16384
dim = 8192
PRESETS = {"ci": {"batch_size": 256, "dim": 2048}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flip(torch.cumprod(torch.flip(x, [-1]), dim=-1), [-1])


def get_inputs():
    return [1.0 + 0.001 * torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
