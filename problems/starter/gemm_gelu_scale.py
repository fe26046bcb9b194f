"""Linear layer, tanh-approximated GELU, multiply by a constant scale, add 1.

y = gelu_tanh(x @ W^T + b) * scale + 1.0 with x [M, K], W [N, K]. Three epilogue ops that
eager PyTorch runs as three extra passes over the [M, N] output; fused into the GEMM they
are free. Full size 1024 x 8192 x 8192.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

CATEGORY = "gemm_epilogue"
batch_size = 1024
in_features = 8192
out_features = 8192
scale = 0.5
PRESETS = {"ci": {"batch_size": 256, "in_features": 1024, "out_features": 1024}}


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int, scale: float):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.gelu(self.linear(x), approximate="tanh")
        return y * self.scale + 1.0


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, scale]
