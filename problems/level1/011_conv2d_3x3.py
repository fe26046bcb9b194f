"""Standard 2-D convolution, 3x3 kernel, stride 1, padding 1, with bias, NCHW. Implicit-GEMM
territory: K = C_in * 9, and the im2col gather must be done on the fly.
"""

import torch
import torch.nn as nn

CATEGORY = "conv"
batch_size = 32
in_channels = 64
out_channels = 128
height = 128
width = 128
PRESETS = {
    "ci": {"batch_size": 16, "in_channels": 16, "out_channels": 32, "height": 32, "width": 32}
}


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
