"""ReLU on a [B, N] matrix. The simplest memory-bound kernel: one read, one write, a max per
element; the baseline for vectorised loads and stores.
"""

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
        return torch.relu(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
