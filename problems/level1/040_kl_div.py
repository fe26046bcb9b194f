"""KL divergence between two row distributions, given log-probabilities for the input and
probabilities for the target, with reduction='batchmean'.
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
        return F.kl_div(predictions, targets, reduction="batchmean")


def get_inputs():
    return [
        torch.log_softmax(torch.randn(batch_size, dim), dim=-1),
        torch.softmax(torch.randn(batch_size, dim), dim=-1),
    ]


def get_init_inputs():
    return []
