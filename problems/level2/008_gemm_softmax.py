"""Linear layer followed by a softmax over the output features (a classifier head). Fusing
needs the full row of the GEMM output, i.e. a tile spanning N or a two-pass scheme.
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
        return torch.softmax(y, dim=1)


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
