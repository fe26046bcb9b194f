"""Pointwise chains of the expert IR as Triton expressions (text), for the Triton code generator.

Every IR operand becomes a Triton value inside a kernel. Tensors other than the pattern's
core input are passed as pointers; how an operand is indexed depends on its ``broadcast``
against the output viewed as ``[rows, cols]``::

    full     ptr + flat          (flat = row * cols + col: the output's own element index)
    per_col  ptr + col
    per_row  ptr + row
    scalar   ptr (one element)

Each generator hands :func:`emit_chain` the names of the Triton variables holding ``flat``,
``row``, ``col``, the mask and the core value; it returns the kernel lines and the final
expression. Transcendentals use forms that the Triton interpreter also runs (``tanh`` as
``2 * sigmoid(2x) - 1``), so CPU-side verification exercises the same code as the GPU.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from kforge.agents.expert.errors import UnsupportedError
from kforge.agents.expert.graph import Operand, PointwiseOp

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
INV_SQRT_2 = 1.0 / math.sqrt(2.0)


@dataclass(frozen=True)
class IndexVars:
    """Names of kernel variables the chain may index with."""

    flat: str
    row: str
    col: str
    mask: str


def pointer_arg(tensor_name: str) -> str:
    """Kernel argument name for a tensor (``linear.bias`` -> ``p_linear_bias``)."""
    return "p_" + re.sub(r"\W", "_", tensor_name)


def chain_tensors(ops: list[PointwiseOp], result: Operand | None = None) -> list[str]:
    """Tensor names (inputs and params) a chain reads, in first-use order."""
    names: list[str] = []
    operands = [a for op in ops for a in op.args] + ([result] if result is not None else [])
    for arg in operands:
        if arg.kind in ("input", "param") and arg.name not in names:
            names.append(arg.name)
    return names


def _literal(value: float) -> str:
    if math.isinf(value):
        return "float('inf')" if value > 0 else "float('-inf')"
    return repr(float(value))


def _tanh(x: str) -> str:
    return f"(2.0 * tl.sigmoid(2.0 * ({x})) - 1.0)"


def _unary(op: PointwiseOp, a: str) -> str:
    name, attrs = op.op, op.attrs
    if name == "neg":
        return f"(-({a}))"
    if name == "relu":
        return f"tl.maximum({a}, 0.0)"
    if name == "sigmoid":
        return f"tl.sigmoid({a})"
    if name == "tanh":
        return _tanh(a)
    if name == "gelu":
        return f"(0.5 * ({a}) * (1.0 + tl.erf(({a}) * {INV_SQRT_2!r})))"
    if name == "gelu_tanh":
        inner = f"{SQRT_2_OVER_PI!r} * (({a}) + 0.044715 * ({a}) * ({a}) * ({a}))"
        return f"(0.5 * ({a}) * (1.0 + {_tanh(inner)}))"
    if name == "silu":
        return f"(({a}) * tl.sigmoid({a}))"
    if name in ("exp", "log", "abs", "sqrt", "rsqrt"):
        return f"tl.{name}({a})"
    if name == "square":
        return f"(({a}) * ({a}))"
    if name == "clamp":
        out = a
        if "min" in attrs and not math.isinf(attrs["min"]):
            out = f"tl.maximum({out}, {_literal(attrs['min'])})"
        if "max" in attrs and not math.isinf(attrs["max"]):
            out = f"tl.minimum({out}, {_literal(attrs['max'])})"
        return out
    if name == "leaky_relu":
        slope = attrs.get("negative_slope", 0.01)
        return f"tl.where(({a}) >= 0.0, {a}, ({a}) * {_literal(slope)})"
    if name == "pow":
        return _pow(a, attrs.get("exponent", 1.0))
    raise UnsupportedError(f"pointwise op {name!r} in the Triton generator")


def _pow(a: str, exponent: float) -> str:
    if exponent == 0.5:
        return f"tl.sqrt({a})"
    if exponent == -0.5:
        return f"tl.rsqrt({a})"
    if float(exponent).is_integer() and abs(exponent) <= 4:
        n = int(abs(exponent))
        prod = " * ".join([f"({a})"] * n) if n else "1.0"
        return f"(1.0 / ({prod}))" if exponent < 0 else f"({prod})"
    # Non-integer exponent: NaN for negative bases, as in torch.
    return f"tl.exp({_literal(exponent)} * tl.log({a}))"


def _binary(name: str, a: str, b: str) -> str:
    symbols = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
    if name in symbols:
        return f"(({a}) {symbols[name]} ({b}))"
    if name in ("maximum", "minimum"):
        return f"tl.{name}({a}, {b})"
    raise UnsupportedError(f"pointwise op {name!r} in the Triton generator")


def operand_load(arg: Operand, idx: IndexVars) -> str:
    """A ``tl.load`` of a tensor operand indexed by its broadcast kind."""
    ptr = pointer_arg(arg.name)
    if arg.broadcast == "scalar":
        return f"tl.load({ptr})"
    offset = {"full": idx.flat, "per_col": idx.col, "per_row": idx.row}[arg.broadcast]
    return f"tl.load({ptr} + {offset}, mask={idx.mask}, other=0.0)"


def emit_chain(
    ops: list[PointwiseOp],
    result: Operand,
    idx: IndexVars,
    core: str | None,
    indent: str = "    ",
) -> tuple[list[str], str]:
    """Kernel lines computing the chain, and the expression of its result.

    Each tensor operand is loaded once (``t_<name>``) however often it is used; each op's
    result is a kernel variable named after its SSA name."""
    lines: list[str] = []
    loaded: dict[str, str] = {}

    def value(arg: Operand) -> str:
        if arg.kind == "core":
            if core is None:
                raise UnsupportedError("a 'core' operand in a pattern without a core value")
            return core
        if arg.kind == "const":
            return _literal(arg.value)
        if arg.kind == "value":
            return arg.name
        key = f"{arg.name}/{arg.broadcast}"
        if key not in loaded:
            var = f"t_{pointer_arg(arg.name)[2:]}_{arg.broadcast}"
            lines.append(f"{indent}{var} = {operand_load(arg, idx)}")
            loaded[key] = var
        return loaded[key]

    for op in ops:
        args = [value(a) for a in op.args]
        if len(args) == 1:
            expr = _unary(op, args[0])
        elif len(args) == 2:
            expr = _binary(op.op, args[0], args[1])
        else:
            raise UnsupportedError(f"pointwise op {op.op!r} with {len(args)} operands")
        lines.append(f"{indent}{op.out} = {expr}")
    return lines, value(result)
