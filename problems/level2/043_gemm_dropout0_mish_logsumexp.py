"""Linear layer, `nn.Dropout(p=0.0)` in training mode, Mish, then logsumexp over dim 1 with
keepdim: [B, 1]. Dropout with p = 0 keeps every element and scales by 1 / (1 - 0) = 1, so
the reference is deterministic even in training mode: a compiler must recognise it as the
identity (not flag it as random), then fuse Mish and the row logsumexp into the GEMM
epilogue.
"""

# ruff: noqa: UP008 -- super(Model, self) is the KernelBench idiom, kept on purpose
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """
    Linear, dropout (p = 0), Mish and a logsumexp over the features.
    """

    def __init__(self, in_features, out_features, dropout_p):
        super(Model, self).__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.dropout = nn.Dropout(p=dropout_p)

    def forward(self, x):
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, in_features).

        Returns:
            torch.Tensor: Output tensor of shape (batch_size, 1).
        """
        x = self.linear(x)
        x = self.dropout(x)
        x = F.mish(x)
        x = torch.logsumexp(x, dim=1, keepdim=True)
        return x


CATEGORY = "gemm_epilogue"
batch_size = 1024
in_features = 8192
out_features = 8192
dropout_p = 0.0
PRESETS = {"ci": {"batch_size": 256, "in_features": 1024, "out_features": 1024}}


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, dropout_p]
