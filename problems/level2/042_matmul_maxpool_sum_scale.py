"""x @ W.T with a weight made as `nn.Parameter(torch.randn(...))` (no bias, unit-variance
entries), MaxPool1d with overlapping windows (kernel 3, stride 2) over the output features
after `x.unsqueeze(1)`, sum over dim 1 with keepdim, then a scale: [B, 1]. The pooling windows
straddle tile boundaries, and at the ci sizes (not multiples of 16) the last features fall
outside any window: a fused kernel must get both edges right while reducing in the epilogue.
"""

# ruff: noqa: UP008 -- super(Model, self) is the KernelBench idiom, kept on purpose
import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Matrix multiplication with a randn weight, max pooling, sum, and scaling.
    """

    def __init__(self, in_features, out_features, kernel_size, stride, scale_factor):
        super(Model, self).__init__()
        self.weight = nn.Parameter(torch.randn(out_features, in_features))
        self.max_pool = nn.MaxPool1d(kernel_size, stride=stride)
        self.scale_factor = scale_factor

    def forward(self, x):
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, in_features).

        Returns:
            torch.Tensor: Output tensor of shape (batch_size, 1).
        """
        x = torch.matmul(x, self.weight.T)
        x = self.max_pool(x.unsqueeze(1)).squeeze(1)
        x = torch.sum(x, dim=1, keepdim=True)
        x = x * self.scale_factor
        return x


CATEGORY = "gemm_epilogue"
batch_size = 1024
in_features = 8192
out_features = 8192
kernel_size = 3
stride = 2
scale_factor = 0.5
PRESETS = {"ci": {"batch_size": 120, "in_features": 250, "out_features": 250}}


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, kernel_size, stride, scale_factor]
