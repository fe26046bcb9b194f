"""2-D convolution with a 5x5 kernel, stride 2, padding 2 and no bias, downsampling an image by
2. Strided windows break the simple sliding-window reuse of stride-1 kernels.
"""

import torch
import torch.nn as nn

CATEGORY = "conv"
batch_size = 16
in_channels = 32
out_channels = 64
height = 256
width = 256
PRESETS = {"ci": {"batch_size": 8, "in_channels": 8, "out_channels": 16, "height": 64, "width": 64}}


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(
            in_channels, out_channels, kernel_size=5, stride=2, padding=2, bias=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
