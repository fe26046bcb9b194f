"""Global average pooling (AdaptiveAvgPool2d(1)) of an NCHW activation to [B, C, 1, 1], as at
the end of a CNN backbone.
"""

import torch
import torch.nn as nn

CATEGORY = "pooling"
batch_size = 32
channels = 64
height = 256
width = 256
PRESETS = {"ci": {"batch_size": 4, "channels": 16, "height": 128, "width": 128}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return []
