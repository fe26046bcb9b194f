"""GroupNorm with 32 groups on an NCHW activation [B, C, H, W]. Statistics span C/G channels
times H*W pixels per (image, group) pair, followed by a per-channel affine.
"""

import torch
import torch.nn as nn

CATEGORY = "normalization"
batch_size = 32
channels = 256
groups = 32
height = 128
width = 128
PRESETS = {"ci": {"batch_size": 16, "channels": 64, "groups": 8, "height": 32, "width": 32}}


class Model(nn.Module):
    def __init__(self, groups: int, channels: int):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels)
        with torch.no_grad():
            self.norm.weight.copy_(1.0 + 0.1 * torch.randn(channels))
            self.norm.bias.copy_(0.1 * torch.randn(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [groups, channels]
