"""Two GEMMs in a row: Linear(K, H), Mish, Linear(H, N), then a softmax over the output
features (dim 1). Mish fuses into the first GEMM's epilogue and the row softmax into the
second's when a tile holds the row (else an online softmax over N tiles); keeping the [B, H]
hidden activation on chip between the two GEMMs needs a back-to-back tiling.
"""

# ruff: noqa: UP008 -- super(Model, self) is the KernelBench idiom, kept on purpose
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """
    Linear, Mish, Linear, Softmax.
    """

    def __init__(self, in_features, hidden_features, out_features):
        super(Model, self).__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.fc2 = nn.Linear(hidden_features, out_features)

    def forward(self, x):
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, in_features).

        Returns:
            torch.Tensor: Output tensor of shape (batch_size, out_features).
        """
        x = self.fc1(x)
        x = F.mish(x)
        x = self.fc2(x)
        x = torch.softmax(x, dim=1)
        return x


CATEGORY = "gemm_epilogue"
batch_size = 1024
in_features = 8192
hidden_features = 8192
out_features = 8192
PRESETS = {
    "ci": {"batch_size": 256, "in_features": 512, "hidden_features": 1024, "out_features": 512}
}


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, hidden_features, out_features]
