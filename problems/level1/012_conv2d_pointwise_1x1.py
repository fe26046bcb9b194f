"""1x1 (pointwise) convolution on NCHW: a GEMM of [C_out, C_in] by [C_in, H*W] per image,
written as a convolution. A kernel that recognises it gets GEMM speed.
"""

import torch
import torch.nn as nn

CATEGORY = "conv"
batch_size = 32
in_channels = 256
out_channels = 256
height = 64
width = 64
PRESETS = {
    "ci": {"batch_size": 8, "in_channels": 64, "out_channels": 64, "height": 32, "width": 32}
}


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
