"""Pointwise chains of the expert IR as CUDA C++ (text), for the CUDA code generator.

A chain becomes one ``__device__`` function, ``kf_chain``, that the pattern's kernel calls
once per output element::

    float kf_chain(float core, float f_<full>..., const float* t_<other>..., int64_t row,
                   int64_t col)

Operands are classified by their ``broadcast`` against the output viewed as ``[rows, cols]``
(see :mod:`kforge.agents.expert.graph`): ``full`` tensors arrive as *values* (the caller
loads them, so an elementwise kernel can use ``float4`` loads); ``per_col``, ``per_row`` and
``scalar`` tensors arrive as pointers indexed by ``col``, ``row`` or ``0`` inside.

Math is IEEE-accurate single precision (``expf``, ``tanhf``, ``erff``, ``logf``, ``sqrtf``,
``powf``); no ``__expf``-style intrinsics, so the strict policy holds unless the candidate is
built with ``--use_fast_math`` (only a relaxed plan asks for that). ``relu``, ``clamp``,
``maximum``/``minimum`` propagate NaN as torch does.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from kforge.agents.expert.errors import UnsupportedError
from kforge.agents.expert.graph import Operand, PointwiseOp

CUDA_PRELUDE = r"""
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

// ---- accurate fp32 pointwise math (no fast-math intrinsics) ----
__device__ __forceinline__ float kf_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float kf_silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float kf_gelu(float x) {
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}
__device__ __forceinline__ float kf_gelu_tanh(float x) {
    const float u = 0.79788456080286536f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}
__device__ __forceinline__ float kf_relu(float x) { return x < 0.0f ? 0.0f : x; }
__device__ __forceinline__ float kf_leaky_relu(float x, float s) { return x >= 0.0f ? x : x * s; }
__device__ __forceinline__ float kf_clamp(float x, float lo, float hi) {
    x = x < lo ? lo : x;
    return x > hi ? hi : x;
}
// NaN-propagating max/min (torch.maximum / torch.amax semantics; fmaxf drops NaN).
__device__ __forceinline__ float kf_maximum(float a, float b) { return (a != a || a > b) ? a : b; }
__device__ __forceinline__ float kf_minimum(float a, float b) { return (a != a || a < b) ? a : b; }

// ---- host-side launch helpers ----
inline bool kf_aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
inline cudaError_t kf_sm_count(int* sms) {
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    return cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev);
}
"""

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def c_ident(name: str) -> str:
    """A C identifier fragment for a tensor name (``linear.bias`` -> ``linear_bias``)."""
    return re.sub(r"\W", "_", name)


def literal(value: float) -> str:
    """An fp32 C literal (``INFINITY``/``NAN`` for the non-finite ones)."""
    if math.isnan(value):
        return "NAN"
    if math.isinf(value):
        return "INFINITY" if value > 0 else "(-INFINITY)"
    text = f"{float(value)!r}f"
    return f"({text})" if value < 0 else text


@dataclass(frozen=True)
class ChainTensor:
    name: str
    broadcast: str

    @property
    def var(self) -> str:
        """Kernel parameter (pointer) name."""
        return f"t_{c_ident(self.name)}"

    @property
    def value(self) -> str:
        """``kf_chain`` parameter name of a ``full`` operand's value."""
        return f"f_{c_ident(self.name)}"


@dataclass(frozen=True)
class ChainSig:
    """What ``kf_chain`` needs from its caller."""

    tensors: tuple[ChainTensor, ...]

    @property
    def fulls(self) -> tuple[ChainTensor, ...]:
        return tuple(t for t in self.tensors if t.broadcast == "full")

    @property
    def others(self) -> tuple[ChainTensor, ...]:
        return tuple(t for t in self.tensors if t.broadcast != "full")

    @property
    def needs_row_col(self) -> bool:
        return any(t.broadcast in ("per_row", "per_col") for t in self.tensors)

    def kernel_params(self) -> str:
        """Pointer parameters for a kernel (each followed by ``", "``)."""
        return "".join(f"const float* __restrict__ {t.var}, " for t in self.tensors)

    def launcher_params(self) -> str:
        """The same pointers for a host launcher or its declaration (no ``__restrict__``)."""
        return "".join(f"const float* {t.var}, " for t in self.tensors)

    def kernel_args(self) -> str:
        return "".join(f"{t.var}, " for t in self.tensors)

    def call(
        self, core: str, flat: str, row: str, col: str, fulls: dict[str, str] | None = None
    ) -> str:
        """A ``kf_chain`` call; ``full`` operands are loaded at ``flat`` unless ``fulls`` gives
        their value expression."""
        given = fulls or {}
        args = [core]
        args += [given.get(t.name, f"{t.var}[{flat}]") for t in self.fulls]
        args += [t.var for t in self.others]
        args += [row, col] if self.needs_row_col else ["0", "0"]
        return f"kf_chain({', '.join(args)})"


def chain_signature(ops: list[PointwiseOp], result: Operand) -> ChainSig:
    seen: dict[str, ChainTensor] = {}
    for arg in [a for op in ops for a in op.args] + [result]:
        if arg.kind not in ("input", "param"):
            continue
        known = seen.get(arg.name)
        if known is not None and known.broadcast != arg.broadcast:
            raise UnsupportedError(f"tensor {arg.name!r} read with two broadcasts")
        seen.setdefault(arg.name, ChainTensor(arg.name, arg.broadcast))
    return ChainSig(tuple(seen.values()))


def _pow(a: str, exponent: float) -> str:
    if exponent == 0.5:
        return f"sqrtf({a})"
    if exponent == -0.5:
        return f"(1.0f / sqrtf({a}))"
    if float(exponent).is_integer() and abs(exponent) <= 4:
        n = int(abs(exponent))
        prod = " * ".join([a] * n) if n else "1.0f"
        return f"(1.0f / ({prod}))" if exponent < 0 else f"({prod})"
    return f"powf({a}, {literal(exponent)})"


def _unary(op: PointwiseOp, a: str) -> str:
    name, attrs = op.op, op.attrs
    simple = {
        "neg": f"(-{a})",
        "relu": f"kf_relu({a})",
        "sigmoid": f"kf_sigmoid({a})",
        "tanh": f"tanhf({a})",
        "gelu": f"kf_gelu({a})",
        "gelu_tanh": f"kf_gelu_tanh({a})",
        "silu": f"kf_silu({a})",
        "exp": f"expf({a})",
        "log": f"logf({a})",
        "abs": f"fabsf({a})",
        "sqrt": f"sqrtf({a})",
        "rsqrt": f"(1.0f / sqrtf({a}))",
        "square": f"({a} * {a})",
    }
    if name in simple:
        return simple[name]
    if name == "clamp":
        lo = literal(attrs.get("min", -math.inf))
        hi = literal(attrs.get("max", math.inf))
        return f"kf_clamp({a}, {lo}, {hi})"
    if name == "leaky_relu":
        return f"kf_leaky_relu({a}, {literal(attrs.get('negative_slope', 0.01))})"
    if name == "pow":
        return _pow(a, attrs.get("exponent", 1.0))
    raise UnsupportedError(f"pointwise op {name!r} in the CUDA generator")


def _binary(name: str, a: str, b: str) -> str:
    symbols = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
    if name in symbols:
        return f"({a} {symbols[name]} {b})"
    if name in ("maximum", "minimum"):
        return f"kf_{name}({a}, {b})"
    raise UnsupportedError(f"pointwise op {name!r} in the CUDA generator")


def chain_function(ops: list[PointwiseOp], result: Operand) -> tuple[str, ChainSig]:
    """The ``kf_chain`` device function for ``ops`` and its signature."""
    sig = chain_signature(ops, result)
    full_names = {t.name for t in sig.fulls}

    def value(arg: Operand) -> str:
        if arg.kind == "core":
            return "core"
        if arg.kind == "const":
            return literal(arg.value)
        if arg.kind == "value":
            return f"v_{c_ident(arg.name)}"
        t = ChainTensor(arg.name, arg.broadcast)
        if arg.name in full_names:
            return t.value
        return f"{t.var}[{'row' if arg.broadcast == 'per_row' else 'col' if arg.broadcast == 'per_col' else '0'}]"

    body = []
    for op in ops:
        args = [value(a) for a in op.args]
        if len(args) == 1:
            expr = _unary(op, args[0])
        elif len(args) == 2:
            expr = _binary(op.op, args[0], args[1])
        else:
            raise UnsupportedError(f"pointwise op {op.op!r} with {len(args)} operands")
        body.append(f"    const float v_{c_ident(op.out)} = {expr};")
    params = ["float core"]
    params += [f"float {t.value}" for t in sig.fulls]
    params += [f"const float* __restrict__ {t.var}" for t in sig.others]
    params += ["int64_t row", "int64_t col"]
    src = (
        "// The fused pointwise chain for one output element (row, col of the [rows, cols] view).\n"
        f"__device__ __forceinline__ float kf_chain({', '.join(params)}) {{\n"
        "    (void)core; (void)row; (void)col;\n"
        + "".join(line + "\n" for line in body)
        + f"    return {value(result)};\n}}\n"
    )
    return src, sig


def cpp_chain_checks(sig: ChainSig, cvars: dict[str, str], numel: str, rows: str, cols: str) -> str:
    """C++ (wrapper side) checks that each chain tensor holds exactly the elements its
    broadcast indexes, so no kernel access can leave it."""
    lines = []
    for t in sig.tensors:
        expected = {"full": numel, "per_col": cols, "per_row": rows, "scalar": "1"}[t.broadcast]
        lines.append(f'        kf_check_numel({cvars[t.name]}, {expected}, "{t.name}");')
    if not lines:
        return ""
    return f"    if ({numel} > 0) {{\n" + "\n".join(lines) + "\n    }\n"
