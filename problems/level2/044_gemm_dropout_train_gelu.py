"""Linear layer, `nn.Dropout(p=0.2)` in training mode (the module's default), then GELU. A
NONDETERMINISTIC reference on purpose: every call draws a new random mask, so no kernel can
match it and the tool must detect and report it (degenerate flag `nondeterministic`) instead
of counting a pass or a failure. Kept as a test of that detection, not as a speed problem.
"""

# ruff: noqa: UP008 -- super(Model, self) is the KernelBench idiom, kept on purpose
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """
    Linear, dropout in training mode and GELU.
    """

    def __init__(self, in_features, out_features, dropout_p):
        super(Model, self).__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.dropout = nn.Dropout(dropout_p)

    def forward(self, x):
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, in_features).

        Returns:
            torch.Tensor: Output tensor of shape (batch_size, out_features).
        """
        x = self.linear(x)
        x = self.dropout(x)
        x = F.gelu(x)
        return x


CATEGORY = "gemm_epilogue"
batch_size = 1024
in_features = 8192
out_features = 8192
dropout_p = 0.2
PRESETS = {"ci": {"batch_size": 256, "in_features": 1024, "out_features": 1024}}


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, dropout_p]
