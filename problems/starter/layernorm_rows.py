"""Layer normalisation with a learned affine transform over the last dimension.

nn.LayerNorm(N) on a [B, N] input: per-row mean and variance, normalise, then scale and
shift by [N] weight and bias. A one-pass (Welford) row kernel is memory-bound; the biased
variance and eps=1e-5 of PyTorch must be reproduced exactly.
"""

import torch
import torch.nn as nn

CATEGORY = "normalization"
batch_size = 32768
dim = 16384
PRESETS = {"ci": {"batch_size": 1024, "dim": 4096}}


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim, elementwise_affine=True)
        with torch.no_grad():
            # Non-trivial affine parameters so a kernel that ignores them fails.
            self.norm.weight.copy_(1.0 + 0.1 * torch.randn(dim))
            self.norm.bias.copy_(0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    return [torch.randn(batch_size, dim) * 2.0 + 0.5]


def get_init_inputs():
    return [dim]
