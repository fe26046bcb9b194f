"""Mean over the last dimension of a [B, N] matrix, giving [B].

A pure read-bandwidth problem: the output is N times smaller than the input, so the
kernel is judged by how close it gets to streaming the input at full memory bandwidth.
"""

import torch
import torch.nn as nn

CATEGORY = "reduction"
batch_size = 65536
dim = 16384
PRESETS = {"ci": {"batch_size": 2048, "dim": 4096}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=-1)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
