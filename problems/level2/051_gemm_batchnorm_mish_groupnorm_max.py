"""Linear layer, BatchNorm1d in training mode (batch statistics, running buffers updated),
Mish, GroupNorm (16 groups), the max over the features with keepdim, then GELU: [B, 1]. Two
normalisations along different axes of the same GEMM output: BatchNorm reduces down the
columns (across row tiles), GroupNorm along row segments; a fused plan needs a split column
reduction first, then a row pass that normalises, reduces and writes B values.
"""

# ruff: noqa: UP008 -- super(Model, self) is the KernelBench idiom, kept on purpose
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """
    Gemm, BatchNorm (training mode), Mish, GroupNorm, max over features and GELU.
    """

    def __init__(self, in_features, out_features, num_groups):
        super(Model, self).__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.batch_norm = nn.BatchNorm1d(out_features)
        self.group_norm = nn.GroupNorm(num_groups, out_features)

    def forward(self, x):
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, in_features).

        Returns:
            torch.Tensor: Output tensor of shape (batch_size, 1).
        """
        x = self.gemm(x)
        x = self.batch_norm(x)
        x = F.mish(x)
        x = self.group_norm(x)
        x = torch.max(x, dim=1, keepdim=True)[0]
        x = F.gelu(x)
        return x


CATEGORY = "gemm_epilogue"
batch_size = 1024
in_features = 8192
out_features = 8192
num_groups = 16
PRESETS = {"ci": {"batch_size": 256, "in_features": 1024, "out_features": 1024}}


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, num_groups]
