"""Render :class:`~.lower.E` trees as Triton block expressions (one CSE scope per section).

Transcendentals use forms the CPU interpreter (``TRITON_INTERPRET=1``) also runs, so the
code verified on a CPU host is the code timed on the GPU (``tanh`` is ``2*sigmoid(2x) - 1``).
"""

from __future__ import annotations

from collections.abc import Callable

from kforge.agents.expert.errors import UnsupportedError
from kforge.agents.expert.plan.lower import E

INV_SQRT_2 = 0.7071067811865476
SQRT_2_OVER_PI = 0.7978845608028654
TL_DTYPES = {"f32": "tl.float32", "i64": "tl.int64", "i32": "tl.int32", "bool": "tl.int1"}


def literal(v: object, dt: str) -> str:
    if dt == "bool" or isinstance(v, bool):
        return "True" if v else "False"
    if dt == "f32":
        f = float(v)  # type: ignore[arg-type]
        if f != f:
            return "float('nan')"
        if f in (float("inf"), float("-inf")):
            return f"float('{'' if f > 0 else '-'}inf')"
        return repr(f)
    return str(int(v))  # type: ignore[call-overload]


def _tanh(x: str) -> str:
    return f"(2.0 * tl.sigmoid(2.0 * {x}) - 1.0)"


class TritonEmitter:
    """Emits ``tN = ...`` lines; ``names`` maps vars / sizes / accs to code names."""

    def __init__(self, resolve: Callable[[E], str | None], mask: str, indent: str = "    ",
                 prefix: str = "t") -> None:
        self.resolve = resolve
        self.mask = mask
        self.indent = indent
        # names unique per section: Triton rejects a name that a loop gives another shape
        self.prefix = prefix
        self.lines: list[str] = []
        self.cache: dict[E, str] = {}

    def __call__(self, e: E) -> str:
        hit = self.cache.get(e)
        if hit is not None:
            return hit
        named = self.resolve(e)
        if named is not None:
            self.cache[e] = named
            return named
        if e.op == "const":
            return literal(e.v, e.dt)
        if e.op == "cast" and e.args[0].op == "const":  # fold: literals have no .to()
            v = e.args[0].v
            return literal(bool(v) if e.dt == "bool" else (float(v) if e.dt == "f32" else int(v)), e.dt)
        code = self.render(e)
        name = f"{self.prefix}{len(self.cache)}"
        self.lines.append(f"{self.indent}{name} = {code}")
        self.cache[e] = name
        return name

    def index(self, e: E) -> str:
        """An offset that is a block even when it depends on no loop variable (a scalar
        offset with a block mask is an error in Triton)."""
        code = self(e)
        if any(x.op == "var" for x in e.walk()):
            return code
        return f"({code}) + tl.zeros_like({self.mask}).to(tl.int64)"

    def render(self, e: E) -> str:
        op = e.op
        if op == "load":
            return f"tl.load({e.v} + {self.index(e.args[0])}, mask={self.mask}, other=0)"
        a = [self(x) for x in e.args]
        binary = {"iadd": "+", "isub": "-", "imul": "*", "ifloordiv": "//", "imod": "%",
                  "add": "+", "sub": "-", "mul": "*", "div": "/", "eq": "==", "ne": "!=",
                  "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "logical_and": "&",
                  "logical_or": "|", "logical_xor": "^"}
        if op in binary:
            return f"({a[0]} {binary[op]} {a[1]})"
        if op in ("imin", "minimum"):
            return f"tl.minimum({a[0]}, {a[1]})"
        if op in ("imax", "maximum"):
            return f"tl.maximum({a[0]}, {a[1]})"
        if op == "cast":
            if e.args[0].op == "size" and e.dt == "f32":  # a scalar argument (int or float)
                return f"({a[0]} + 0.0)"
            if e.dt == "bool":
                return f"({a[0]} != 0)"
            return f"({a[0]}).to({TL_DTYPES[e.dt]})"
        if op == "where":
            return f"tl.where({a[0]}, {a[1]}, {a[2]})"
        x = a[0] if a else ""
        simple = {"neg": f"(-{x})", "abs": f"tl.abs({x})", "exp": f"tl.exp({x})",
                  "exp2": f"tl.exp2({x})", "expm1": f"(tl.exp({x}) - 1.0)", "log": f"tl.log({x})",
                  "log1p": f"tl.log(1.0 + {x})", "log2": f"tl.log2({x})", "sqrt": f"tl.sqrt({x})",
                  "rsqrt": f"tl.rsqrt({x})", "reciprocal": f"(1.0 / {x})", "sigmoid": f"tl.sigmoid({x})",
                  "tanh": _tanh(x), "relu": f"tl.maximum({x}, 0.0)", "erf": f"tl.erf({x})",
                  "sin": f"tl.sin({x})", "cos": f"tl.cos({x})", "floor": f"tl.floor({x})",
                  "ceil": f"tl.ceil({x})", "isnan": f"({x} != {x})", "logical_not": f"({x} == 0)",
                  "trunc": f"tl.where({x} < 0, tl.ceil({x}), tl.floor({x}))",
                  "round": f"tl.where(tl.floor({x}) + 0.5 == {x}, 2.0 * tl.floor(({x}) * 0.5 + 0.5), tl.floor({x} + 0.5))",
                  "sign": f"tl.where({x} > 0, 1.0, tl.where({x} < 0, -1.0, 0.0)).to({TL_DTYPES[e.dt]})"}
        if op in simple:
            if e.dt != "f32" and op in ("relu", "abs", "neg"):
                return {"relu": f"tl.maximum({x}, 0)", "abs": f"tl.abs({x})", "neg": f"(-{x})"}[op]
            return simple[op]
        if op == "gelu":
            if e.v == "tanh":
                inner = f"{SQRT_2_OVER_PI} * ({x} + 0.044715 * {x} * {x} * {x})"
                return f"(0.5 * {x} * (1.0 + {_tanh('(' + inner + ')')}))"
            return f"(0.5 * {x} * (1.0 + tl.erf({x} * {INV_SQRT_2})))"
        if op == "leaky_relu":
            return f"tl.where({x} > 0, {x}, {x} * {float(e.v)!r})"
        if op == "elu":
            alpha, scale, input_scale = e.v
            return f"tl.where({x} > 0, {x} * {float(scale)!r}, {float(alpha * scale)!r} * (tl.exp({x} * {float(input_scale)!r}) - 1.0))"
        if op == "clamp":
            lo, hi = e.v
            out = x
            if lo is not None:
                out = f"tl.maximum({out}, {float(lo)!r})"
            if hi is not None:
                out = f"tl.minimum({out}, {float(hi)!r})"
            return out
        if op == "pow":
            return self.power(e, a)
        if op in ("floordiv", "truncdiv"):
            q = f"({a[0]} / {a[1]})"
            if e.dt == "f32":
                return f"tl.floor({q})" if op == "floordiv" else f"tl.where({q} < 0, tl.ceil({q}), tl.floor({q}))"
            return f"({a[0]} // {a[1]})"
        if op == "remainder":
            return f"({a[0]} - {a[1]} * tl.floor({a[0]} / {a[1]}))" if e.dt == "f32" else f"({a[0]} % {a[1]})"
        raise UnsupportedError(f"triton: op {op}")

    def power(self, e: E, a: list[str]) -> str:
        base, expo = e.args
        if expo.op == "const":
            p = float(expo.v)
            if p == 2.0:
                return f"({a[0]} * {a[0]})"
            if p == 3.0:
                return f"({a[0]} * {a[0]} * {a[0]})"
            if p == 0.5:
                return f"tl.sqrt({a[0]})"
            if p == 1.0:
                return a[0]
            if p == -1.0:
                return f"(1.0 / {a[0]})"
            if p == int(p):
                sign = "tl.where(" + a[0] + " < 0, " + ("-1.0" if int(p) % 2 else "1.0") + ", 1.0)"
                return f"({sign} * tl.exp2({p!r} * tl.log2(tl.abs({a[0]}))))"
        return f"tl.exp2({a[1]} * tl.log2({a[0]}))"
