"""Linear layer, then the KernelBench residual idiom: `original_x = x.clone().detach()` of the
GEMM output, GELU, scale, and `x + original_x`. The clone and detach are no-ops for the
forward values (a copy the fused kernel never needs to make): the whole tail is
y + s * gelu(y) on the accumulator, one write of [B, N].
"""

# ruff: noqa: UP008 -- super(Model, self) is the KernelBench idiom, kept on purpose
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """
    Gemm, GELU, scaling and a residual add of the detached GEMM output.
    """

    def __init__(self, in_features, out_features, scaling_factor):
        super(Model, self).__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.scaling_factor = scaling_factor

    def forward(self, x):
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, in_features).

        Returns:
            torch.Tensor: Output tensor of shape (batch_size, out_features).
        """
        x = self.gemm(x)
        original_x = x.clone().detach()
        x = F.gelu(x)
        x = x * self.scaling_factor
        x = x + original_x
        return x


CATEGORY = "gemm_epilogue"
batch_size = 1024
in_features = 8192
out_features = 8192
scaling_factor = 0.7
PRESETS = {"ci": {"batch_size": 256, "in_features": 1024, "out_features": 1024}}


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, scaling_factor]
