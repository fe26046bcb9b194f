"""Depthwise 3x3 convolution (groups = channels): each channel is filtered independently. Very
low arithmetic intensity, so it is a bandwidth problem disguised as a convolution.
"""

import torch
import torch.nn as nn

CATEGORY = "conv"
batch_size = 32
channels = 256
height = 128
width = 128
PRESETS = {"ci": {"batch_size": 8, "channels": 32, "height": 64, "width": 64}}


class Model(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size=3, padding=1, groups=channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels]
