"""The Triton backend's op table: one rendering per op of the IR's table (its capability
list). Transcendentals use forms the CPU interpreter (``TRITON_INTERPRET=1``) also runs, so the
code verified on a CPU host is the code timed on the GPU (``tanh`` is ``2*sigmoid(2x) - 1``)."""

from __future__ import annotations

from kforge.agents.expert.codegen.optable import Call, OpTable, binary
from kforge.agents.expert.ir.ops import GELU_CUBIC, INV_SQRT_2, SQRT_2_OVER_PI

TL_DTYPES = {"f32": "tl.float32", "i64": "tl.int64", "i32": "tl.int32", "bool": "tl.int1"}


def tanh(x: str) -> str:
    return f"(2.0 * tl.sigmoid(2.0 * {x}) - 1.0)"


def _cast(c: Call) -> str:
    if c.e.args[0].op == "size" and c.dt == "f32":  # a scalar argument (int or float)
        return f"({c.x} + 0.0)"
    if c.dt == "bool":
        return f"({c.x} != 0)"
    return f"({c.x}).to({TL_DTYPES[c.dt]})"


def _gelu(c: Call) -> str:
    x = c.x
    if c.attrs.approximate == "tanh":
        inner = f"{SQRT_2_OVER_PI} * ({x} + {GELU_CUBIC} * {x} * {x} * {x})"
        return f"(0.5 * {x} * (1.0 + {tanh('(' + inner + ')')}))"
    return f"(0.5 * {x} * (1.0 + tl.erf({x} * {INV_SQRT_2})))"


def _elu(c: Call) -> str:
    a, x = c.attrs, c.x
    return (f"tl.where({x} > 0, {x} * {float(a.scale)!r}, {float(a.alpha * a.scale)!r} * "
            f"(tl.exp({x} * {float(a.input_scale)!r}) - 1.0))")


def _clamp(c: Call) -> str:
    out = c.x
    if c.attrs.min is not None:
        out = f"tl.maximum({out}, {float(c.attrs.min)!r})"
    if c.attrs.max is not None:
        out = f"tl.minimum({out}, {float(c.attrs.max)!r})"
    return out


def _pow(c: Call) -> str:
    base, expo = c.e.args
    x = c.x
    if expo.op == "const":
        p = float(expo.v)
        if p == 2.0:
            return f"({x} * {x})"
        if p == 3.0:
            return f"({x} * {x} * {x})"
        if p == 0.5:
            return f"tl.sqrt({x})"
        if p == 1.0:
            return x
        if p == -1.0:
            return f"(1.0 / {x})"
        if p == int(p):
            sign = "tl.where(" + x + " < 0, " + ("-1.0" if int(p) % 2 else "1.0") + ", 1.0)"
            return f"({sign} * tl.exp2({p!r} * tl.log2(tl.abs({x}))))"
    return f"tl.exp2({c.y} * tl.log2({x}))"


def _div(c: Call) -> str:
    q = f"({c.x} / {c.y})"
    if c.dt == "f32":
        return f"tl.floor({q})" if c.e.op == "floordiv" else f"tl.where({q} < 0, tl.ceil({q}), tl.floor({q}))"
    return f"({c.x} // {c.y})"


TRITON_OPS: OpTable = {
    **{op: binary(sym) for op, sym in (
        ("iadd", "+"), ("isub", "-"), ("imul", "*"), ("ifloordiv", "//"), ("imod", "%"), ("add", "+"), ("sub", "-"),
        ("mul", "*"), ("div", "/"), ("eq", "=="), ("ne", "!="), ("lt", "<"), ("le", "<="), ("gt", ">"),
        ("ge", ">="), ("logical_and", "&"), ("logical_or", "|"), ("logical_xor", "^"))},
    "imin": "tl.minimum({x}, {y})", "minimum": "tl.minimum({x}, {y})",
    "imax": "tl.maximum({x}, {y})", "maximum": "tl.maximum({x}, {y})",
    "cast": _cast,
    "where": "tl.where({x}, {y}, {z})",
    "neg": "(-{x})", "abs": "tl.abs({x})", "exp": "tl.exp({x})", "exp2": "tl.exp2({x})",
    "expm1": "(tl.exp({x}) - 1.0)", "log": "tl.log({x})", "log1p": "tl.log(1.0 + {x})", "log2": "tl.log2({x})",
    "sqrt": "tl.sqrt({x})", "rsqrt": "tl.rsqrt({x})", "reciprocal": "(1.0 / {x})", "sigmoid": "tl.sigmoid({x})",
    "tanh": lambda c: tanh(c.x),
    "relu": lambda c: f"tl.maximum({c.x}, 0.0)" if c.dt == "f32" else f"tl.maximum({c.x}, 0)",
    "erf": "tl.erf({x})", "sin": "tl.sin({x})", "cos": "tl.cos({x})", "floor": "tl.floor({x})",
    "ceil": "tl.ceil({x})", "isnan": "({x} != {x})", "logical_not": "({x} == 0)",
    "trunc": "tl.where({x} < 0, tl.ceil({x}), tl.floor({x}))",
    "round": "tl.where(tl.floor({x}) + 0.5 == {x}, 2.0 * tl.floor(({x}) * 0.5 + 0.5), tl.floor({x} + 0.5))",
    "sign": lambda c: f"tl.where({c.x} > 0, 1.0, tl.where({c.x} < 0, -1.0, 0.0)).to({TL_DTYPES[c.dt]})",
    "gelu": _gelu,
    "leaky_relu": lambda c: f"tl.where({c.x} > 0, {c.x}, {c.x} * {float(c.attrs.slope)!r})",
    "elu": _elu,
    "clamp": _clamp,
    "pow": _pow,
    "floordiv": _div,
    "truncdiv": _div,
    "remainder": lambda c: f"({c.x} - {c.y} * tl.floor({c.x} / {c.y}))" if c.dt == "f32" else f"({c.x} % {c.y})",
}
