"""Leaky ReLU with negative slope 0.01 on a [B, N] matrix: a branch-free select per element."""

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
        return F.leaky_relu(x, negative_slope=0.01)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
