"""Batched matmul [B, M, K] @ [B, K, N], LayerNorm over the last two dims (M, N) of each batch
element, then GELU. The normalisation statistics span the whole M x N output of one batch
element, i.e. every tile of that bmm: a fused kernel accumulates per-tile partial sums in the
bmm epilogue and applies the (M, N)-shaped affine and the GELU in a finishing pass.
"""

# ruff: noqa: UP008 -- super(Model, self) is the KernelBench idiom, kept on purpose
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """
    Batched matrix multiplication followed by a LayerNorm over the two matrix dims and GELU.
    """

    def __init__(self, M, N, eps):
        super(Model, self).__init__()
        self.layer_norm = nn.LayerNorm((M, N), eps=eps)
        with torch.no_grad():
            self.layer_norm.weight.copy_(1.0 + 0.1 * torch.randn(M, N))
            self.layer_norm.bias.copy_(0.1 * torch.randn(M, N))

    def forward(self, A, B):
        """
        Args:
            A (torch.Tensor): Input tensor of shape (batch_size, M, K).
            B (torch.Tensor): Input tensor of shape (batch_size, K, N).

        Returns:
            torch.Tensor: Output tensor of shape (batch_size, M, N).
        """
        x = torch.bmm(A, B)
        x = self.layer_norm(x)
        return F.gelu(x)


CATEGORY = "gemm_epilogue"
batch_size = 128
M = 512
K = 512
N = 512
eps = 1e-5
PRESETS = {"ci": {"batch_size": 8, "M": 64, "K": 128, "N": 64}}


def get_inputs():
    A = torch.randn(batch_size, M, K)
    B = torch.randn(batch_size, K, N)
    return [A, B]


def get_init_inputs():
    return [M, N, eps]
