"""Linear layer (square, N = K), residual add of the input, then LayerNorm: the post-norm
transformer sub-block epilogue.
"""

import torch
import torch.nn as nn

CATEGORY = "gemm_epilogue"
batch_size = 2048
features = 8192
PRESETS = {"ci": {"batch_size": 256, "features": 1024}}


class Model(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.linear = nn.Linear(features, features)
        self.norm = nn.LayerNorm(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.linear(x) + x)


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features]
