"""Sum over the middle dimension of a [B, R, C] tensor: a column reduction, where each output
element reads a strided column; coalescing comes from assigning threads along C.
"""

import torch
import torch.nn as nn

CATEGORY = "reduction"
batch_size = 128
rows = 4096
cols = 4096
PRESETS = {"ci": {"batch_size": 16, "rows": 256, "cols": 1024}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=1)


def get_inputs():
    return [torch.randn(batch_size, rows, cols)]


def get_init_inputs():
    return []
