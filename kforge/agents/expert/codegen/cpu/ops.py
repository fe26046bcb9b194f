"""The CPU backend's op table: the shared C column (:func:`~..cstyle.c_ops`) over the
branch-free ``kf_*`` math of :data:`PRELUDE` (``fast``, the default) or libm, plus the CPU's
own one-line renderings of the activations with attributes.

The math prelude has branch-free ``kf_*`` versions of exp / log / tanh / erf / expm1 / log1p
(selects only, always inlined) so chains inside ``#pragma omp simd`` vectorise; libm calls stop
GCC's vectoriser. Errors: exp < 2e-7 relative, tanh < 1e-6, erf < 2e-7 absolute, log < 2e-7.
With ``fast=False`` libm is used instead.
"""

from __future__ import annotations

from kforge.agents.expert.codegen.cstyle import LIBM, CMath, c_ops, division_helpers, literal
from kforge.agents.expert.codegen.optable import Call, OpTable
from kforge.agents.expert.ir.ops import GELU_CUBIC, INV_SQRT_2, SQRT_2_OVER_PI

FAST = CMath("kf_exp", "kf_log", "kf_expm1", "kf_log1p", "kf_tanh", "kf_erf")

PRELUDE = r"""
#include <cstdint>
#include <cstring>
#include <cmath>
#include <vector>
#include <algorithm>
#include <omp.h>
#define KF_INLINE static inline __attribute__((always_inline))

KF_INLINE float kf_bits_to_float(int32_t b) { float f; std::memcpy(&f, &b, 4); return f; }
KF_INLINE int32_t kf_float_to_bits(float f) { int32_t b; std::memcpy(&b, &f, 4); return b; }
template <class T> KF_INLINE T kf_max(T a, T b) { return (a > b || a != a) ? a : b; }
template <class T> KF_INLINE T kf_min(T a, T b) { return (a < b || a != a) ? a : b; }
KF_INLINE float kf_fmax(float a, float b) { return a > b ? a : b; }
KF_INLINE float kf_fmin(float a, float b) { return a < b ? a : b; }

KF_INLINE float kf_exp(float x) {
    float xc = kf_fmin(kf_fmax(x, -87.0f), 88.5f);
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = xc - n * 0.693145751953125f;
    r = r - n * 1.428606765330187e-06f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    float y = p * kf_bits_to_float(((int32_t)n + 127) << 23);
    y = x > 88.7f ? INFINITY : y;
    y = x != x ? x : y;
    return x < -87.0f ? 0.0f : y;
}

KF_INLINE float kf_log(float x) {
    int32_t b = kf_float_to_bits(x);
    int32_t e = ((b >> 23) & 0xff) - 127;
    float m = kf_bits_to_float((b & 0x007fffff) | 0x3f800000);
    bool big = m > 1.41421356f;
    m = big ? m * 0.5f : m;
    float ef = (float)e + (big ? 1.0f : 0.0f);
    float s = (m - 1.0f) / (m + 1.0f);
    float s2 = s * s;
    float q = 1.0f / 9.0f;
    q = q * s2 + 1.0f / 7.0f;
    q = q * s2 + 1.0f / 5.0f;
    q = q * s2 + 1.0f / 3.0f;
    q = q * s2 + 1.0f;
    float y = 2.0f * s * q + ef * 0.693147180559945f;
    y = x == 0.0f ? -INFINITY : y;
    y = x < 0.0f ? NAN : y;
    y = x == INFINITY ? INFINITY : y;
    return x != x ? x : y;
}

KF_INLINE float kf_expm1(float x) {
    float p = 1.0f / 40320.0f;
    p = p * x + 1.0f / 5040.0f;
    p = p * x + 1.0f / 720.0f;
    p = p * x + 1.0f / 120.0f;
    p = p * x + 1.0f / 24.0f;
    p = p * x + 1.0f / 6.0f;
    p = p * x + 0.5f;
    float small = x + x * x * p;
    return (x < 0.5f && x > -0.5f) ? small : kf_exp(x) - 1.0f;
}

KF_INLINE float kf_log1p(float x) {
    float u = 1.0f + x;
    float d = u - 1.0f;
    float y = kf_log(u) * (x / (d == 0.0f ? 1.0f : d));
    return d == 0.0f ? x : (u == INFINITY ? INFINITY : y);
}

KF_INLINE float kf_tanh(float x) {
    float a = x < 0.0f ? -x : x;
    float e = kf_exp(2.0f * kf_fmin(a, 20.0f));
    float big = 1.0f - 2.0f / (e + 1.0f);
    float x2 = x * x;
    float p = 62.0f / 2835.0f;
    p = p * x2 - 17.0f / 315.0f;
    p = p * x2 + 2.0f / 15.0f;
    p = p * x2 - 1.0f / 3.0f;
    float small = x + x * x2 * p;
    float y = x < 0.0f ? -big : big;
    return a < 0.1f ? small : (x != x ? x : y);
}

KF_INLINE float kf_erf(float x) {
    float a = x < 0.0f ? -x : x;
    float t = 1.0f / (1.0f + 0.3275911f * a);
    float p = 1.061405429f;
    p = p * t - 1.453152027f;
    p = p * t + 1.421413741f;
    p = p * t - 0.284496736f;
    p = p * t + 0.254829592f;
    float y = 1.0f - p * t * kf_exp(-a * a);
    return x < 0.0f ? -y : y;
}

""" + division_helpers("KF_INLINE")


def _gelu(m: CMath) -> object:
    def gelu(c: Call) -> str:
        x = c.x
        if c.attrs.approximate == "tanh":
            return (f"(0.5f * {x} * (1.0f + {m.tanh}({SQRT_2_OVER_PI!r}f * ({x} + {GELU_CUBIC!r}f * {x} * {x} * "
                    f"{x}))))")
        return f"(0.5f * {x} * (1.0f + {m.erf}({x} * {INV_SQRT_2!r}f)))"
    return gelu


def _elu(m: CMath) -> object:
    def elu(c: Call) -> str:
        a, x = c.attrs, c.x
        return (f"({x} > 0.0f ? {x} * {literal(float(a.scale), 'f32')} : "
                f"{m.expm1}({x} * {literal(float(a.input_scale), 'f32')}) * {literal(float(a.alpha * a.scale), 'f32')})")
    return elu


def cpu_ops(m: CMath) -> OpTable:
    return {**c_ops(m), "gelu": _gelu(m), "elu": _elu(m),
            "leaky_relu": lambda c: f"({c.x} > 0.0f ? {c.x} : {c.x} * {literal(c.attrs.slope, 'f32')})"}


CPU_OPS = {True: cpu_ops(FAST), False: cpu_ops(LIBM)}  # by the ``fast`` knob
