"""The CUDA backend's op table: the shared C column (:func:`~..cstyle.c_ops`) over libm's
``std::`` functions, which CUDA device code calls as its own (``std::exp`` is ``expf`` for a
float); the activations with attributes (gelu, elu, leaky_relu) are not rows here and render
through the op table's decompositions. :data:`PRELUDE` holds the device helpers the C column
names."""

from __future__ import annotations

from kforge.agents.expert.codegen.cstyle import LIBM, c_ops, division_helpers
from kforge.agents.expert.codegen.optable import OpTable

CUDA_OPS: OpTable = c_ops(LIBM)

PRELUDE = r"""
#include <cuda_runtime.h>
#include <stdint.h>
#include <cmath>
#define KF_DEVICE __device__ __forceinline__

template <class T> KF_DEVICE T kf_max(T a, T b) { return (a > b || a != a) ? a : b; }
template <class T> KF_DEVICE T kf_min(T a, T b) { return (a < b || a != a) ? a : b; }
""" + division_helpers("KF_DEVICE") + r"""static inline unsigned kf_blocks(int64_t work, int64_t per_block) {
    const int64_t n = (work + per_block - 1) / per_block;
    return (unsigned)(n < 1 ? 1 : (n > (1 << 20) ? (1 << 20) : n));  // grid-stride loops do the rest
}
"""
