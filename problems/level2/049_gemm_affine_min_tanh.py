"""Linear layer, a per-feature affine (learned scale and shift), min over dim 1 with keepdim,
then tanh: [B, 1]. The affine is a pointwise prologue of the row-min reduction: computed on
the accumulator, reduced in the GEMM epilogue (partial mins per N tile, combined across
tiles), and only B values written. The ci sizes (200 x 1000 -> 700) are not multiples of 16.
"""

# ruff: noqa: UP008 -- super(Model, self) is the KernelBench idiom, kept on purpose
import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Gemm, per-feature scale and shift, min over the features, tanh.
    """

    def __init__(self, in_features, out_features):
        super(Model, self).__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.scale = nn.Parameter(torch.rand(out_features) + 0.5)
        self.shift = nn.Parameter(torch.randn(out_features) * 0.1)

    def forward(self, x):
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, in_features).

        Returns:
            torch.Tensor: Output tensor of shape (batch_size, 1).
        """
        x = self.gemm(x)
        x = x * self.scale + self.shift
        x = torch.min(x, dim=1, keepdim=True)[0]
        x = torch.tanh(x)
        return x


CATEGORY = "gemm_epilogue"
batch_size = 1024
in_features = 8192
out_features = 8192
PRESETS = {"ci": {"batch_size": 200, "in_features": 1000, "out_features": 700}}


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
