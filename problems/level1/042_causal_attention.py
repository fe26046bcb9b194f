"""Causal scaled dot-product attention over [B, H, S, D]: like plain attention, but a kernel
should skip the fully masked upper-triangular tiles (half of the work).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

CATEGORY = "attention"
FLOP_FRACTION = 0.5  # the masked upper triangle needs no work: the roofline counts half
batch_size = 8
heads = 16
seq_len = 2048
head_dim = 128
PRESETS = {"ci": {"batch_size": 2, "heads": 4, "seq_len": 256, "head_dim": 64}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def get_inputs():
    return [
        torch.randn(batch_size, heads, seq_len, head_dim),
        torch.randn(batch_size, heads, seq_len, head_dim),
        torch.randn(batch_size, heads, seq_len, head_dim),
    ]


def get_init_inputs():
    return []
