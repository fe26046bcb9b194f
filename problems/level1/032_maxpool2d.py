"""2-D max pooling, 3x3 window, stride 2, padding 1, on NCHW. Overlapping windows: each input
pixel is read by up to four outputs.
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
        self.pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return []
