"""A Triton kernel's parameters (:class:`Args`: buffer pointers, then every size a runtime
argument ``z0, z1...`` that ``forward`` computes from the tensors' shapes) and the names its
expressions read (:func:`resolver`, :func:`unflatten`)."""

from __future__ import annotations

from typing import Any

import sympy

from kforge.agents.expert.codegen.candidate import py_expr
from kforge.agents.expert.plan.expr import E, strides


def next_pow2(n: int) -> int:
    return 1 << max(0, (max(n, 1) - 1).bit_length())


class Args:
    """A kernel's parameters: buffer pointers and size expressions, in a stable order."""

    def __init__(self) -> None:
        self.buffers: list[str] = []
        self.sizes: dict[str, str] = {}  # sympy srepr -> arg name
        self.exprs: dict[str, Any] = {}

    def buffer(self, name: str) -> str:
        if name not in self.buffers:
            self.buffers.append(name)
        return name

    def size(self, expr: Any) -> str:
        expr = sympy.sympify(expr)
        if expr.is_Integer:
            return str(int(expr))
        key = sympy.srepr(expr)
        if key not in self.sizes:
            self.sizes[key] = f"z{len(self.sizes)}"
            self.exprs[key] = expr
        return self.sizes[key]

    def collect(self, *es: E) -> None:
        for root in es:
            for e in root.walk():
                if e.op == "load":
                    self.buffer(e.v)
                elif e.op == "size":
                    self.size(e.v)

    def params(self) -> str:
        return ", ".join([*self.buffers, *self.sizes.values()])

    def launch_args(self) -> str:
        vals = [py_expr(self.exprs[k]) for k in self.sizes]
        return ", ".join([*self.buffers, *vals])


def resolver(args: Args, names: dict[str, str], accs: dict[str, str]) -> Any:
    def resolve(e: E) -> str | None:
        if e.op == "var":
            return names[e.v[0]]
        if e.op == "size":
            return args.size(e.v)
        if e.op == "acc":
            return accs[e.v]
        return None
    return resolve


def unflatten(flat: str, shape: tuple[Any, ...], prefix: str, args: Args, indent: str) -> tuple[list[str], dict[str, str]]:
    lines, names = [], {}
    st = strides(shape)
    for d, s in enumerate(shape):
        name = f"{prefix}{d}"
        names[name] = name
        if sympy.sympify(s) == 1:
            lines.append(f"{indent}{name} = 0")
            continue
        q = f"({flat} // {args.size(st[d])})" if sympy.sympify(st[d]) != 1 else flat
        lines.append(f"{indent}{name} = {q}" if d == 0 else f"{indent}{name} = {q} % {args.size(s)}")
    return lines, names


def numel_of(shape: tuple[Any, ...]) -> sympy.Expr:
    return sympy.Mul(*shape) if shape else sympy.Integer(1)


