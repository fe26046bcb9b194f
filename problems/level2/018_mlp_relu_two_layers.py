"""Two-layer MLP: Linear(K, H), ReLU, Linear(H, N). Two GEMMs with an activation in between;
the hidden activation can stay on chip only with careful tiling, but fusing the ReLU into
the first GEMM is easy.
"""

import torch
import torch.nn as nn

CATEGORY = "gemm_epilogue"
batch_size = 1024
in_features = 4096
hidden = 8192
out_features = 4096
PRESETS = {"ci": {"batch_size": 256, "in_features": 512, "hidden": 1024, "out_features": 512}}


class Model(nn.Module):
    def __init__(self, in_features: int, hidden: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, hidden, out_features]
