"""Softmax over the middle dimension of a [B, S, D] tensor: the reduction axis is strided
(stride D), not contiguous, so a row-softmax kernel cannot be reused as is.
"""

import torch
import torch.nn as nn

CATEGORY = "softmax"
batch_size = 64
seq = 4096
dim = 1024
PRESETS = {"ci": {"batch_size": 16, "seq": 256, "dim": 256}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(batch_size, seq, dim)]


def get_init_inputs():
    return []
