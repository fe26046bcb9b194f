"""Fused bias + ReLU for the CPU: one OpenMP-parallel, vectorised pass over the rows."""

import torch
import torch.nn as nn

from kforge.platforms import cpu_runtime

CPP_SOURCE = r"""
#include <cstdint>
#include <omp.h>

// y[r, c] = max(x[r, c] + bias[c], 0) for a row-major [rows, cols] matrix.
extern "C" void bias_relu(const float* __restrict x, const float* __restrict bias,
                          float* __restrict y, int64_t rows, int64_t cols, int64_t nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        #pragma omp simd
        for (int64_t c = 0; c < cols; ++c) {
            float v = xr[c] + bias[c];
            yr[c] = v > 0.0f ? v : 0.0f;
        }
    }
}
"""

lib = cpu_runtime.load_library(CPP_SOURCE)
BIAS_RELU = cpu_runtime.entry(lib, "bias_relu", "pppiii")


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        # Same parameter, same name and same initialisation order as the reference.
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = cpu_runtime.as_input(x)
        bias = cpu_runtime.as_input(self.bias.detach())
        cols = x.shape[-1]
        rows = x.numel() // cols if cols else 0
        y = torch.empty_like(x)
        cpu_runtime.launch(BIAS_RELU, "bias_relu", x.data_ptr(), bias.data_ptr(), y.data_ptr(),
                           rows, cols, cpu_runtime.threads())
        return y
