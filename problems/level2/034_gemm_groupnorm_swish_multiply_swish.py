"""Linear layer, GroupNorm (32 groups) over the output features, swish, multiply by a learned
per-feature weight, swish again. The GroupNorm statistics are a mean and variance per (row,
group): a fused kernel can take them in the GEMM epilogue when one tile spans whole groups,
then apply the normalisation, both swishes and the multiply in the same pass instead of five
round trips of the [B, N] activation through memory.
"""

# ruff: noqa: UP008 -- super(Model, self) is the KernelBench idiom, kept on purpose
import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Model that performs a GEMM, GroupNorm, Swish, Multiply, and Swish operations.
    """

    def __init__(self, in_features, out_features, num_groups):
        super(Model, self).__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.group_norm = nn.GroupNorm(num_groups, out_features)
        self.multiply_weight = nn.Parameter(torch.randn(out_features))

    def forward(self, x):
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, in_features).

        Returns:
            torch.Tensor: Output tensor of shape (batch_size, out_features).
        """
        x = self.gemm(x)
        x = self.group_norm(x)
        x = x * torch.sigmoid(x)
        x = x * self.multiply_weight
        x = x * torch.sigmoid(x)
        return x


CATEGORY = "gemm_epilogue"
batch_size = 1024
in_features = 8192
out_features = 8192
num_groups = 32
PRESETS = {"ci": {"batch_size": 256, "in_features": 1024, "out_features": 1024}}


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, num_groups]
