"""3x3 convolution, ReLU, global average pooling, then a linear classifier to 10 classes: a
tiny CNN head where the convolution dominates and everything after it is a reduction.
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
        self.fc = nn.Linear(out_channels, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        y = torch.relu(y).mean(dim=(2, 3))
        return self.fc(y)


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
