"""LayerNorm over the last two dimensions of a [B, S, D] tensor (normalized_shape = (S, D)),
with affine parameters of shape [S, D]. Each reduction covers S * D elements: one row per
CTA is not enough parallelism.
"""

import torch
import torch.nn as nn

CATEGORY = "normalization"
batch_size = 64
seq = 512
dim = 1024
PRESETS = {"ci": {"batch_size": 32, "seq": 64, "dim": 512}}


class Model(nn.Module):
    def __init__(self, seq: int, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm((seq, dim))
        with torch.no_grad():
            self.norm.weight.copy_(1.0 + 0.1 * torch.randn(seq, dim))
            self.norm.bias.copy_(0.1 * torch.randn(seq, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    return [torch.randn(batch_size, seq, dim)]


def get_init_inputs():
    return [seq, dim]
