"""Scalar expression trees (:class:`~.lower.E`) as C++ for the CPU backend.

:class:`Emitter` turns an ``E`` into C++ inside a tree of loop :class:`Scope` s. Every
compound node becomes one ``const T tN = ...;`` definition (shared subtrees are computed
once) placed in the *outermost* scope that holds all the loop variables and accumulators
it reads: a bias load over the column index leaves the row loop, a row mean leaves the
column loop. :class:`Block` s hold the loop headers and statements; a scope's definitions
are rendered at the top of its block, so they precede every statement that reads them.

The math prelude has branch-free ``kf_*`` versions of exp / log / tanh / erf / expm1 /
log1p (selects only, always inlined) so chains inside ``#pragma omp simd`` vectorise;
libm calls stop GCC's vectoriser. Errors: exp < 2e-7 relative, tanh < 1e-6, erf < 2e-7
absolute, log < 2e-7. With ``fast=False`` libm is used instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kforge.agents.expert.errors import UnsupportedError
from kforge.agents.expert.plan.lower import E

CTYPES = {"f32": "float", "i64": "int64_t", "i32": "int32_t", "bool": "bool"}

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

KF_INLINE int64_t kf_floordiv(int64_t a, int64_t b) {
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
KF_INLINE int64_t kf_mod(int64_t a, int64_t b) {
    int64_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
KF_INLINE float kf_fmod(float a, float b) {
    float r = std::fmod(a, b);
    return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r;
}
"""


def literal(v: Any, dt: str) -> str:
    if dt == "bool":
        return "true" if v else "false"
    if dt in ("i64", "i32"):
        return f"(({CTYPES[dt]}){int(v)})"
    f = float(v)
    if math.isnan(f):
        return "NAN"
    if math.isinf(f):
        return "INFINITY" if f > 0 else "(-INFINITY)"
    return f"{f!r}f"


class Scope:
    """A loop body: the loop variables and accumulators it can read, its hoisted definitions."""

    def __init__(self, parent: Scope | None, new_vars: tuple[str, ...] = (), new_accs: tuple[str, ...] = ()) -> None:
        self.parent = parent
        self.vars: set[str] = (parent.vars if parent else set()) | set(new_vars)
        self.accs: set[str] = (parent.accs if parent else set()) | set(new_accs)
        self.defs: list[str] = []
        self.memo: dict[E, str] = {}

    def child(self, new_vars: tuple[str, ...] = (), new_accs: tuple[str, ...] = ()) -> Scope:
        return Scope(self, new_vars, new_accs)


@dataclass
class Block:
    """``head`` (pragmas and a ``for``), then ``{`` definitions, items ``}``."""

    scope: Scope
    head: str = ""
    items: list[str | Block] = field(default_factory=list)

    def add(self, item: str | Block) -> None:
        self.items.append(item)

    def render(self, indent: int = 1) -> str:
        pad = "  " * indent
        out = [pad + h for h in self.head.splitlines()] if self.head else []
        out.append(pad + "{")
        out += ["  " + pad + d for d in self.scope.defs]
        for it in self.items:
            out.append(it.render(indent + 1) if isinstance(it, Block) else "\n".join("  " + pad + s for s in it.splitlines()))
        out.append(pad + "}")
        return "\n".join(out)


class Emitter:
    """C++ for E trees of one kernel. ``sizes`` collects every size expression read (the
    kernel's size arguments); ``accs`` maps an accumulator name to its C++ value and the
    loop variables that value depends on; ``buffers`` maps a buffer to its pointer name."""

    def __init__(self, fast: bool = True) -> None:
        self.buffers: dict[str, str] = {}
        self.fast = fast
        self.sizes: dict[Any, str] = {}
        self.accs: dict[str, tuple[str, frozenset[str]]] = {}
        self.count = 0
        self._needs: dict[E, tuple[frozenset[str], frozenset[str]]] = {}

    def size(self, expr: Any) -> str:
        if expr not in self.sizes:
            self.sizes[expr] = f"z{len(self.sizes)}"
        return self.sizes[expr]

    def ptr(self, buffer: str) -> str:
        if buffer not in self.buffers:
            self.buffers[buffer] = f"b_{buffer}"
        return self.buffers[buffer]

    def needs(self, e: E) -> tuple[frozenset[str], frozenset[str]]:
        """(loop variables, accumulators) an expression reads."""
        hit = self._needs.get(e)
        if hit is None:
            if e.op == "var":
                hit = (frozenset([e.v[0]]), frozenset())
            elif e.op == "acc":
                hit = (self.accs[e.v][1] if e.v in self.accs else frozenset(), frozenset([e.v]))
            else:
                vs: frozenset[str] = frozenset()
                acs: frozenset[str] = frozenset()
                for a in e.args:
                    v, c = self.needs(a)
                    vs, acs = vs | v, acs | c
                hit = (vs, acs)
            self._needs[e] = hit
        return hit

    def expr(self, e: E, scope: Scope) -> str:
        if e.op == "const":
            return literal(e.v, e.dt)
        if e.op == "var":
            return str(e.v[0])
        if e.op == "size":
            return self.size(e.v)
        if e.op == "acc":
            if e.v not in self.accs:
                raise UnsupportedError(f"accumulator {e.v} read outside its kernel")
            return self.accs[e.v][0]
        vs, acs = self.needs(e)
        target = scope
        while target.parent is not None and vs <= target.parent.vars and acs <= target.parent.accs:
            target = target.parent
        s: Scope | None = target
        while s is not None:
            if e in s.memo:
                return s.memo[e]
            s = s.parent
        args = [self.expr(a, target) for a in e.args]
        code = self.op(e, args)
        name = f"t{self.count}"
        self.count += 1
        target.defs.append(f"const {CTYPES[e.dt]} {name} = {code};")
        target.memo[e] = name
        return name

    def op(self, e: E, a: list[str]) -> str:
        op, dt = e.op, e.dt
        fl = dt == "f32"
        f = self.fast
        exp_, log_ = ("kf_exp", "kf_log") if f else ("std::exp", "std::log")
        if op == "load":
            return f"{self.ptr(e.v)}[{a[0]}]"
        simple = {"iadd": "+", "isub": "-", "imul": "*", "add": "+", "sub": "-", "mul": "*",
                  "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
                  "logical_and": "&&", "logical_or": "||", "logical_xor": "!="}
        if op in simple:
            return f"({a[0]} {simple[op]} {a[1]})"
        if op == "ifloordiv":
            return f"({a[0]} / {a[1]})"
        if op == "imod":
            return f"({a[0]} % {a[1]})"
        if op in ("imin", "minimum"):
            return f"kf_min<{CTYPES[dt]}>({a[0]}, {a[1]})"
        if op in ("imax", "maximum"):
            return f"kf_max<{CTYPES[dt]}>({a[0]}, {a[1]})"
        if op == "div":
            return f"({a[0]} / {a[1]})"
        if op == "floordiv":
            return f"std::floor({a[0]} / {a[1]})" if fl else f"kf_floordiv({a[0]}, {a[1]})"
        if op == "truncdiv":
            return f"std::trunc({a[0]} / {a[1]})" if fl else f"({a[0]} / {a[1]})"
        if op == "remainder":
            return f"kf_fmod({a[0]}, {a[1]})" if fl else f"kf_mod({a[0]}, {a[1]})"
        if op == "where":
            return f"({a[0]} ? {a[1]} : {a[2]})"
        if op == "cast":
            if dt == "bool":
                return f"({a[0]} != 0)"
            return f"(({CTYPES[dt]}){a[0]})"
        if op == "pow":
            return self.pow(e, a)
        x = a[0] if a else ""
        zero = "0.0f" if fl else f"(({CTYPES[dt]})0)"
        unary = {
            "neg": f"(-{x})", "abs": f"std::fabs({x})" if fl else f"({x} < {zero} ? -{x} : {x})",
            "exp": f"{exp_}({x})", "exp2": f"{exp_}({x} * 0.6931471805599453f)",
            "expm1": f"kf_expm1({x})" if f else f"std::expm1({x})",
            "log": f"{log_}({x})", "log2": f"({log_}({x}) * 1.4426950408889634f)",
            "log1p": f"kf_log1p({x})" if f else f"std::log1p({x})",
            "sqrt": f"std::sqrt({x})", "rsqrt": f"(1.0f / std::sqrt({x}))",
            "reciprocal": f"(1.0f / {x})", "sigmoid": f"(1.0f / (1.0f + {exp_}(-{x})))",
            "tanh": f"kf_tanh({x})" if f else f"std::tanh({x})",
            "relu": f"({x} < {zero} ? {zero} : {x})",
            "erf": f"kf_erf({x})" if f else f"std::erf({x})",
            "sin": f"std::sin({x})", "cos": f"std::cos({x})",
            "sign": f"(({CTYPES[dt]})(({x} > {zero}) - ({x} < {zero})))",
            "floor": f"std::floor({x})" if fl else x, "ceil": f"std::ceil({x})" if fl else x,
            "round": f"std::nearbyint({x})" if fl else x, "trunc": f"std::trunc({x})" if fl else x,
            "isnan": f"({x} != {x})", "logical_not": f"(!{x})",
            "softplus_raw": f"kf_log1p({exp_}({x}))" if f else f"std::log1p(std::exp({x}))",
        }
        if op in unary:
            return unary[op]
        if op == "gelu":
            if e.v == "tanh":
                t = "kf_tanh" if f else "std::tanh"
                return f"(0.5f * {x} * (1.0f + {t}(0.7978845608028654f * ({x} + 0.044715f * {x} * {x} * {x}))))"
            erf = "kf_erf" if f else "std::erf"
            return f"(0.5f * {x} * (1.0f + {erf}({x} * 0.7071067811865476f)))"
        if op == "leaky_relu":
            return f"({x} > 0.0f ? {x} : {x} * {literal(e.v, 'f32')})"
        if op == "elu":
            alpha, scale, iscale = (float(v) for v in e.v)
            em1 = "kf_expm1" if f else "std::expm1"
            return (f"({x} > 0.0f ? {x} * {literal(scale, 'f32')} : "
                    f"{em1}({x} * {literal(iscale, 'f32')}) * {literal(alpha * scale, 'f32')})")
        if op == "clamp":
            lo, hi = e.v
            out = x
            if lo is not None:
                out = f"kf_max<{CTYPES[dt]}>({out}, {literal(lo, dt)})"
            if hi is not None:
                out = f"kf_min<{CTYPES[dt]}>({out}, {literal(hi, dt)})"
            return out
        raise UnsupportedError(f"pointwise op {op} on the cpu platform")

    def pow(self, e: E, a: list[str]) -> str:
        x, ex = a
        b = e.args[1]
        if b.op == "const" and b.dt != "bool":
            p = float(b.v)
            if p == int(p) and 0 <= p <= 4:
                return "(" + " * ".join([x] * int(p)) + ")" if p else literal(1, e.dt)
            if p == int(p) and -4 <= p < 0:
                return "(1.0f / (" + " * ".join([x] * int(-p)) + "))"
            if p == 0.5:
                return f"std::sqrt({x})"
        if e.dt != "f32":
            return f"(({CTYPES[e.dt]})std::pow((double){x}, (double){ex}))"
        return f"std::pow({x}, (float){ex})"
