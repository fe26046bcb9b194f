"""Linear layer followed by tanh: y = tanh(x @ W^T + b), x [M, K], W [N, K], b [N].

Eager PyTorch runs a GEMM (writing the [M, N] pre-activation), then reads it back to add the
bias (inside addmm) and again for tanh: two extra passes over [M, N]. A fused kernel applies
bias and tanh to the accumulator tile in registers, so it costs one GEMM and one store.
"""

import torch
import torch.nn as nn

batch_size = 128
in_features = 256
out_features = 192


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
