"""Linear layer, AvgPool1d (kernel 4) over the output features of each row (via
`x.unsqueeze(1)` ... `.squeeze(1)`), Mish, then the max over dim 1 (no keepdim), giving
[B]. Average pooling of a GEMM output is itself linear: it folds into the weights (each group
of 4 rows of W and of the bias averaged), a GEMM with N / 4 outputs, and the Mish and the row
max then fit in that GEMM's epilogue.
"""

# ruff: noqa: UP008 -- super(Model, self) is the KernelBench idiom, kept on purpose
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """
    Matmul, 1-D average pooling over the features, Mish and a max over the features.
    """

    def __init__(self, in_features, out_features, pool_kernel_size):
        super(Model, self).__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.avg_pool = nn.AvgPool1d(kernel_size=pool_kernel_size)

    def forward(self, x):
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, in_features).

        Returns:
            torch.Tensor: Output tensor of shape (batch_size,).
        """
        x = self.matmul(x)
        x = self.avg_pool(x.unsqueeze(1)).squeeze(1)
        x = F.mish(x)
        x = torch.max(x, dim=1).values
        return x


CATEGORY = "gemm_epilogue"
batch_size = 1024
in_features = 8192
out_features = 8192
pool_kernel_size = 4
PRESETS = {"ci": {"batch_size": 256, "in_features": 1024, "out_features": 1024}}


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, pool_kernel_size]
