"""Log-softmax over very long rows ([B, N] with N = 262144, as in a large-vocabulary output
layer). A row no longer fits on chip: needs a multi-block or online reduction.
"""

import torch
import torch.nn as nn

CATEGORY = "softmax"
batch_size = 1024
vocab = 262144
PRESETS = {"ci": {"batch_size": 16, "vocab": 65536}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(batch_size, vocab)]


def get_init_inputs():
    return []
