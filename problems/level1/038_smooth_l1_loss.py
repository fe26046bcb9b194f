"""Smooth-L1 (Huber, beta = 1) loss, mean-reduced to a scalar: piecewise quadratic/linear
elementwise term plus a global mean.
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
        return F.smooth_l1_loss(predictions, targets, beta=1.0)


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
