"""Linear classifier head followed by cross-entropy against int64 targets, mean-reduced to a
scalar. The logits can be consumed tile by tile with an online logsumexp, never written out.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

CATEGORY = "gemm_epilogue"
batch_size = 1024
in_features = 4096
num_classes = 16384
PRESETS = {"ci": {"batch_size": 256, "in_features": 512, "num_classes": 2048}}


class Model(nn.Module):
    def __init__(self, in_features: int, num_classes: int):
        super().__init__()
        self.linear = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.linear(x), targets)


def get_inputs():
    return [torch.randn(batch_size, in_features), torch.randint(0, num_classes, (batch_size,))]


def get_init_inputs():
    return [in_features, num_classes]
