"""Linear layer, plus a second learned bias, times a learned per-feature multiplier, then ReLU.
Two extra [N] parameter vectors read by the epilogue.
"""

import torch
import torch.nn as nn

CATEGORY = "gemm_epilogue"
batch_size = 1024
in_features = 8192
out_features = 8192
PRESETS = {"ci": {"batch_size": 256, "in_features": 1024, "out_features": 1024}}


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.extra_bias = nn.Parameter(0.1 * torch.randn(out_features))
        self.multiplier = nn.Parameter(1.0 + 0.1 * torch.randn(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = (self.linear(x) + self.extra_bias) * self.multiplier
        return torch.relu(y)


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
