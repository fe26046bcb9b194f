"""Mean-squared-error loss reduced to a scalar over two [B, N] tensors: a two-input elementwise
op feeding a global reduction.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

CATEGORY = "loss"
batch_size = 16384
dim = 16384
PRESETS = {"ci": {"batch_size": 512, "dim": 2048}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(predictions, targets)


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
