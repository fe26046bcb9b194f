"""RMSNorm over the last dimension: x / sqrt(mean(x^2) + eps) * weight, as in Llama-style
transformers. One reduction (no mean subtraction) and a per-column scale.
"""

import torch
import torch.nn as nn

CATEGORY = "normalization"
batch_size = 16384
dim = 16384
PRESETS = {"ci": {"batch_size": 512, "dim": 4096}}


class Model(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return x * rms * self.weight


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]
