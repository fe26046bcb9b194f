"""C++ for pointwise math on the CPU: a prelude of vectorisable functions and the emitter
that turns one IR :class:`PointwiseOp` into a C++ expression.

libm's ``expf``/``tanhf``/``erff`` are opaque calls that stop GCC from vectorising a loop;
the ``kf_*`` functions below are branch-free (selects only) and always inlined, so a chain
inside ``#pragma omp simd`` becomes AVX2 code. Accuracy: ``kf_exp`` relative error < 2e-7
(range reduction by 2^n with a split ln2, degree-6 Taylor polynomial on |r| <= ln2/2);
``kf_tanh`` < 1e-6 (odd polynomial for |x| < 0.1, exp form beyond); ``kf_erf`` absolute
error < 2e-7 (Abramowitz-Stegun 7.1.26); ``kf_log`` < 2e-7 (atanh series on the mantissa).
With ``fast=False`` the emitter uses the libm functions instead (the conservative plan).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from kforge.agents.expert.graph import UnsupportedError

PRELUDE = r"""
#include <cstdint>
#include <cstring>
#include <cmath>
#include <omp.h>
#define KF_INLINE static inline __attribute__((always_inline))

KF_INLINE float kf_bits_to_float(int32_t b) { float f; std::memcpy(&f, &b, 4); return f; }
KF_INLINE int32_t kf_float_to_bits(float f) { int32_t b; std::memcpy(&b, &f, 4); return b; }
KF_INLINE float kf_max(float a, float b) { return a > b ? a : b; }
KF_INLINE float kf_min(float a, float b) { return a < b ? a : b; }

KF_INLINE float kf_exp(float x) {
    float xc = kf_min(kf_max(x, -87.0f), 88.5f);
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
    float r = xc - n * 0.693145751953125f;
    r = r - n * 1.428606765330187e-06f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    float s = kf_bits_to_float(((int32_t)n + 127) << 23);
    float y = p * s;
    return x < -87.0f ? 0.0f : y;
}

KF_INLINE float kf_log(float x) {
    int32_t b = kf_float_to_bits(x);
    int32_t e = ((b >> 23) & 0xff) - 127;
    float m = kf_bits_to_float((b & 0x007fffff) | 0x3f800000);  // [1, 2)
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
    return y;
}

KF_INLINE float kf_tanh(float x) {
    float a = x < 0.0f ? -x : x;
    float e = kf_exp(2.0f * kf_min(a, 20.0f));
    float big = 1.0f - 2.0f / (e + 1.0f);
    float x2 = x * x;
    float p = 62.0f / 2835.0f;
    p = p * x2 - 17.0f / 315.0f;
    p = p * x2 + 2.0f / 15.0f;
    p = p * x2 - 1.0f / 3.0f;
    float small = x + x * x2 * p;
    float y = x < 0.0f ? -big : big;
    return a < 0.1f ? small : y;
}

KF_INLINE float kf_sigmoid(float x) { return 1.0f / (1.0f + kf_exp(-x)); }

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
"""


def _lit(value: float) -> str:
    if math.isinf(value):
        return "INFINITY" if value > 0 else "-INFINITY"
    return f"{float(value)!r}f"


def _pow(x: str, exponent: float, fast: bool) -> str:
    if exponent == 2.0:
        return f"(({x}) * ({x}))"
    if exponent == 3.0:
        return f"(({x}) * ({x}) * ({x}))"
    if exponent == 1.0:
        return f"({x})"
    if exponent == 0.5:
        return f"std::sqrt({x})"
    if exponent == -1.0:
        return f"(1.0f / ({x}))"
    if exponent == 0.0:
        return "1.0f"
    if fast and exponent == int(exponent) and abs(exponent) <= 8:
        n = int(abs(exponent))
        prod = " * ".join([f"({x})"] * n)
        return f"(1.0f / ({prod}))" if exponent < 0 else f"({prod})"
    if fast:
        return f"kf_exp({_lit(exponent)} * kf_log({x}))"
    return f"std::pow({x}, {_lit(exponent)})"


def pointwise_expr(op: str, args: list[str], attrs: dict[str, float], fast: bool) -> str:
    """C++ expression for one IR op over argument expressions ``args``."""
    exp_ = "kf_exp" if fast else "std::exp"
    tanh_ = "kf_tanh" if fast else "std::tanh"
    erf_ = "kf_erf" if fast else "std::erf"
    log_ = "kf_log" if fast else "std::log"
    sig = (lambda v: f"kf_sigmoid({v})") if fast else (lambda v: f"(1.0f / (1.0f + std::exp(-({v}))))")
    x = args[0] if args else ""
    binary: dict[str, Callable[[str, str], str]] = {
        "add": lambda a, b: f"({a} + {b})",
        "sub": lambda a, b: f"({a} - {b})",
        "mul": lambda a, b: f"({a} * {b})",
        "div": lambda a, b: f"({a} / {b})",
        "maximum": lambda a, b: f"kf_max({a}, {b})",
        "minimum": lambda a, b: f"kf_min({a}, {b})",
    }
    if op in binary:
        return binary[op](args[0], args[1])
    unary: dict[str, Callable[[str], str]] = {
        "neg": lambda v: f"(-({v}))",
        "relu": lambda v: f"kf_max({v}, 0.0f)",
        "sigmoid": sig,
        "tanh": lambda v: f"{tanh_}({v})",
        "gelu": lambda v: f"(0.5f * ({v}) * (1.0f + {erf_}(({v}) * 0.7071067811865476f)))",
        "gelu_tanh": lambda v: (
            f"(0.5f * ({v}) * (1.0f + {tanh_}(0.7978845608028654f * (({v}) + 0.044715f * ({v}) * ({v}) * ({v})))))"
        ),
        "silu": lambda v: f"(({v}) * {sig(v)})",
        "exp": lambda v: f"{exp_}({v})",
        "log": lambda v: f"{log_}({v})",
        "abs": lambda v: f"std::fabs({v})",
        "sqrt": lambda v: f"std::sqrt({v})",
        "rsqrt": lambda v: f"(1.0f / std::sqrt({v}))",
        "square": lambda v: f"(({v}) * ({v}))",
    }
    if op in unary:
        return unary[op](x)
    if op == "clamp":
        expr = x
        if "min" in attrs:
            expr = f"kf_max({expr}, {_lit(attrs['min'])})"
        if "max" in attrs:
            expr = f"kf_min({expr}, {_lit(attrs['max'])})"
        return f"({expr})"
    if op == "leaky_relu":
        slope = _lit(attrs.get("negative_slope", 0.01))
        return f"(({x}) > 0.0f ? ({x}) : ({x}) * {slope})"
    if op == "pow":
        return _pow(x, attrs["exponent"], fast)
    raise UnsupportedError(f"pointwise op {op} on the cpu platform")
