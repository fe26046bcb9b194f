"""Linear layer (GEMM + bias) followed by ReLU.

y = relu(x @ W^T + b) with x [M, K], W [N, K]. The simplest GEMM epilogue: the bias add and
ReLU are applied to the accumulator tile before it is stored, so the fused kernel costs
exactly one GEMM. Full size 1024 x 8192 x 8192 is compute-bound.
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
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
