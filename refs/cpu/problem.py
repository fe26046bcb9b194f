"""Per-column bias add followed by ReLU: y = relu(x + bias), x [B, N], bias [N].

Eager PyTorch makes two passes over memory (add, then relu) and one temporary; a fused
kernel reads x once and writes y once.
"""

import torch
import torch.nn as nn

batch_size = 512
dim = 1000


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.bias)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]
