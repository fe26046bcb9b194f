"""A per-feature input gain (prologue), x @ W + b with W made as
`nn.Parameter(torch.randn(in_features, out_features) ...)` in `__init__` (stored [K, N], not
nn.Linear's [N, K]), then a softmax over dim 0, the batch axis of a 2-D output. The gain
folds into W's rows; the column softmax needs statistics over all B rows of each column, so
either one tile spans the batch or per-tile partials are combined before normalising.
"""

# ruff: noqa: UP008 -- super(Model, self) is the KernelBench idiom, kept on purpose
import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Input gain, matmul with a randn weight and bias, softmax over the batch dimension.
    """

    def __init__(self, in_features, out_features):
        super(Model, self).__init__()
        self.input_gain = nn.Parameter(torch.rand(in_features) + 0.5)
        self.weight = nn.Parameter(torch.randn(in_features, out_features) / in_features**0.5)
        self.bias = nn.Parameter(torch.randn(out_features))

    def forward(self, x):
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, in_features).

        Returns:
            torch.Tensor: Output tensor of shape (batch_size, out_features).
        """
        x = x * self.input_gain
        x = torch.matmul(x, self.weight) + self.bias
        x = torch.softmax(x, dim=0)
        return x


CATEGORY = "gemm_epilogue"
batch_size = 1024
in_features = 8192
out_features = 8192
PRESETS = {"ci": {"batch_size": 256, "in_features": 1024, "out_features": 1024}}


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
