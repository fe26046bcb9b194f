"""A backend's op table: one rendering per op of :data:`~kforge.agents.expert.ir.ops.OPS` it
renders itself, keyed by the op's name (the table doubles as the backend's capability list).

A rendering is a template over the operands' code (``"({x} + {y})"``: ``x``, ``y``, ``z``) or
a function of the :class:`Call` (the operands' code, the expression, its dtype and typed
attributes). An op a backend's table lacks is rendered through the op's decomposition
(:func:`decompose`: the same expression in ops of the table), so every backend renders every
pointwise and index op (``tests/test_expert_ops.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kforge.agents.expert.errors import UnsupportedError
from kforge.agents.expert.ir.ops import NONE, OPS, Attrs, Clamp, Elu, Gelu, LeakyRelu
from kforge.agents.expert.plan.expr import E


@dataclass(frozen=True)
class Call:
    """What a rendering sees: the operands' code, the expression being rendered."""

    args: tuple[str, ...]
    e: E

    @property
    def x(self) -> str:
        return self.args[0]

    @property
    def y(self) -> str:
        return self.args[1]

    @property
    def dt(self) -> str:
        return self.e.dt

    @property
    def attrs(self) -> Any:
        """The op's typed attributes (its :mod:`~kforge.agents.expert.ir.ops` record)."""
        return self.e.v


Rendering = str | Callable[[Call], str]
OpTable = Mapping[str, Rendering]


def render(table: OpTable, call: Call) -> str:
    """``call`` through the backend's rendering of its op."""
    rendering = table[call.e.op]
    if isinstance(rendering, str):
        return rendering.format(**dict(zip("xyz", call.args, strict=False)))
    return rendering(call)


def binary(symbol: str) -> str:
    return "({x} " + symbol + " {y})"


class _ExprBuilder:
    """Builds a decomposition's expressions: ops over E trees, numbers of one dtype."""

    def __init__(self, dt: str) -> None:
        self.dt = dt

    def op(self, name: str, *args: E, attrs: Attrs = NONE) -> E:
        rule = OPS[name].dtype
        dt = "bool" if rule == "compare" else (args[1].dt if rule == "select" else self.dt)
        return E(name, tuple(args), v=None if attrs is NONE else attrs, dt=dt)

    def const(self, value: float) -> E:
        if self.dt == "bool":
            return E("const", v=bool(value), dt="bool")
        return E("const", v=float(value) if self.dt == "f32" else int(value), dt=self.dt)


def decompose(e: E) -> E:
    """``e`` written in other ops of the table (its op's decomposition); UnsupportedError
    when the op has none."""
    spec = OPS.get(e.op)
    if spec is None or spec.decomposition is None:
        raise UnsupportedError(f"op {e.op} has neither a rendering nor a decomposition")
    return spec.decomposition(_ExprBuilder(e.dt), e.args, NONE if e.v is None else e.v)  # type: ignore[no-any-return]


def missing(table: OpTable, ops: tuple[str, ...]) -> dict[str, str]:
    """The ops of ``ops`` the backend can render neither itself nor through decompositions
    into ops it renders (op -> why): empty for a complete backend."""
    out: dict[str, str] = {}

    def renderable(name: str, seen: frozenset[str]) -> str | None:
        if name in table:
            return None
        spec = OPS[name]
        if spec.decomposition is None:
            return "no rendering and no decomposition"
        if name in seen:
            return "a decomposition that needs itself"
        probe = E(name, tuple(E("var", v=(f"a{i}", 1), dt="f32") for i in range(spec.arity or 0)),
                  v=_probe_attrs(name), dt="f32")
        for sub in decompose(probe).walk():
            if sub.op in OPS and OPS[sub.op].kind in ("pointwise", "index"):
                why = renderable(sub.op, seen | {name})
                if why is not None:
                    return f"its decomposition uses {sub.op}: {why}"
        return None

    for name in ops:
        why = renderable(name, frozenset())
        if why is not None:
            out[name] = why
    return out


def _probe_attrs(name: str) -> Any:
    """Attributes of ``name`` for a probe expression (every field set)."""
    probes: dict[type[Attrs], Attrs] = {Gelu: Gelu("tanh"), LeakyRelu: LeakyRelu(0.01), Elu: Elu(1.0, 1.0, 1.0),
                                        Clamp: Clamp(-1.0, 1.0)}
    return probes.get(OPS[name].attrs)
