"""Render :class:`~kforge.agents.expert.plan.lower.E` trees as Triton block expressions, one
``tN = ...`` line per shared subtree (one CSE scope per section); each op through the
backend's table (:mod:`.ops`)."""

from __future__ import annotations

from collections.abc import Callable

from kforge.agents.expert.codegen.optable import Call, decompose, render
from kforge.agents.expert.codegen.triton.ops import TL_DTYPES, TRITON_OPS
from kforge.agents.expert.plan.expr import E

__all__ = ["TL_DTYPES", "TritonEmitter", "literal"]


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


class TritonEmitter:
    """Emits ``tN = ...`` lines; ``names`` maps vars / sizes / accs to code names."""

    def __init__(self, resolve: Callable[[E], str | None], mask: str, indent: str = "    ",
                 prefix: str = "t", scalars: frozenset[str] = frozenset()) -> None:
        self.resolve = resolve
        self.mask = mask
        self.scalars = scalars  # loop variables that are one number a program (a GEMM's batch index)
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
        if any(x.op == "var" and x.v[0] not in self.scalars for x in e.walk()):
            return code
        return f"({code}) + tl.zeros_like({self.mask}).to(tl.int64)"

    def render(self, e: E) -> str:
        if e.op == "load":  # a float is f32 from here on, whatever the buffer holds (``Buffer.storage``)
            load = f"tl.load({e.v} + {self.index(e.args[0])}, mask={self.mask}, other=0)"
            return f"{load}.to(tl.float32)" if e.dt == "f32" else load
        if e.op not in TRITON_OPS:  # through the op's decomposition (ops of the table)
            return self(decompose(e))
        return render(TRITON_OPS, Call(tuple(self(x) for x in e.args), e))
