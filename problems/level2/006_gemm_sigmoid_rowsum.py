"""Linear layer, sigmoid, then sum over the output features, giving [B, 1]. A reduction after
the GEMM: the [B, N] intermediate never needs to reach memory.
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        return torch.sigmoid(y).sum(dim=1, keepdim=True)


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
