"""3x3 convolution, ReLU, then a learned per-channel bias [C, 1, 1]. The convolution epilogue
analogue of GEMM + bias + activation.
"""

import torch
import torch.nn as nn

CATEGORY = "conv_epilogue"
batch_size = 64
in_channels = 64
out_channels = 128
height = 128
width = 128
PRESETS = {
    "ci": {"batch_size": 8, "in_channels": 16, "out_channels": 32, "height": 32, "width": 32}
}


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3)
        self.bias = nn.Parameter(0.1 * torch.randn(out_channels, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return torch.relu(y) + self.bias


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
