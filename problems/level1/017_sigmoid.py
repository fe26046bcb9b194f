"""Sigmoid on a [B, N] matrix. Needs a numerically safe exp for large negative inputs."""

import torch
import torch.nn as nn

CATEGORY = "elementwise"
batch_size = 16384
dim = 32768
PRESETS = {"ci": {"batch_size": 512, "dim": 4096}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
