"""Maximum over the last dimension of a [B, N] matrix (torch.amax), giving [B].

Like the row mean, a read-bandwidth problem; the max is exact, so any reduction order
gives bit-identical results and the problem isolates memory-access efficiency.
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
        return x.amax(dim=-1)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
