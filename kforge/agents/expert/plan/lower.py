"""Index lowering: the value of any IR node at a symbolic index, as a scalar expression tree
(:class:`~.expr.E`).

:func:`Lowerer.value` follows views, broadcasts and pointwise ops down to the nodes that are
*materialised* (held in a buffer): views become index arithmetic (a reshape groups dimensions
whose sizes match, so an unsqueeze or a flatten costs nothing), pointwise ops are inlined.
A kernel hook can claim a node first (``claim``): the GEMM epilogue claims its matmul at the
tile's own index, a row kernel its reductions at the current row; a claim at any other index
raises :class:`NotFusable`, which tells the planner to materialise instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy

from kforge.agents.expert.errors import NotFusable
from kforge.agents.expert.ir.graph import Node, Scalar
from kforge.agents.expert.ir.ops import NONE, OPS
from kforge.agents.expert.plan.expr import (
    ZERO,
    E,
    const,
    iadd,
    imul,
    isub,
    linear,
    reshape_index,
    size,
)

Claim = Callable[[Node, tuple[E, ...]], E | None]


class Lowerer:
    """``value(node, idx)`` with memoisation; ``buffers`` maps materialised nodes to names."""

    def __init__(self, buffers: dict[Node, str], claim: Claim | None = None) -> None:
        self.buffers = buffers
        self.claim = claim
        self.memo: dict[tuple[int, tuple[E, ...]], E] = {}
        self.loads: dict[str, Node] = {}

    def value(self, node: Node, idx: tuple[E, ...]) -> E:
        key = (id(node), idx)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = self._value(node, idx)
        return hit

    def scalar(self, s: Scalar, dt: str) -> E:
        v = sympy.sympify(s.value) if not isinstance(s.value, bool) else s.value
        if isinstance(v, sympy.Expr) and not v.is_number:
            e = E("size", v=_plain(v), dt="i64")
            return E("cast", (e,), dt=dt) if dt != "i64" else e
        if isinstance(v, bool):
            return const(v, "bool")
        num = float(v) if dt == "f32" else int(v)
        return const(num, dt)

    def operand(self, a: Node | Scalar, node: Node, idx: tuple[E, ...], dt: str) -> E:
        if isinstance(a, Scalar):
            return self.scalar(a, dt)
        rank = len(a.shape)
        n = len(node.shape)
        sub = tuple(ZERO if sympy.sympify(a.shape[j]) == 1 else idx[n - rank + j] for j in range(rank))
        e = self.value(a, sub)
        return e if e.dt == dt else E("cast", (e,), dt=dt)

    def claim_of(self, node: Node, idx: tuple[E, ...]) -> E | None:
        return self.claim(node, idx) if self.claim is not None else None

    def _value(self, node: Node, idx: tuple[E, ...]) -> E:
        claimed = self.claim_of(node, idx)
        if claimed is not None:
            return claimed
        if node in self.buffers:
            name = self.buffers[node]
            self.loads[name] = node
            return E("load", (linear(idx, node.shape),), v=name, dt=node.dtype)
        op = node.op
        if op == "const":
            return self.scalar(Scalar(node.attrs.value, node.dtype), node.dtype)
        if op == "iota":
            e = iadd(size(node.attrs.start), imul(idx[0], size(node.attrs.step)))
            return e if node.dtype == "i64" else E("cast", (e,), dt=node.dtype)
        if op == "view":
            (x,) = node.tensors
            sub = reshape_index(idx, node.shape, x.shape)
            if x in self.buffers:
                # a buffer is row-major: its reshape's element sits at the reshape's own linear
                # index (no div/mod that a stride analysis cannot see through: a conv weight's
                # [CO, C, kh, kw] -> [CO, C*kh*kw] stays a strided GEMM operand)
                claimed = self.claim_of(x, sub)
                if claimed is not None:
                    return claimed
                name = self.buffers[x]
                self.loads[name] = x
                return E("load", (linear(idx, node.shape),), v=name, dt=x.dtype)
            return self.value(x, sub)
        if op == "permute":
            (x,) = node.tensors
            sub = [ZERO] * len(idx)
            for j, d in enumerate(node.attrs.dims):
                sub[d] = idx[j]
            return self.value(x, tuple(sub))
        if op == "broadcast":
            (x,) = node.tensors
            bd = node.attrs.bdims
            return self.value(x, tuple(ZERO if sympy.sympify(x.shape[j]) == 1 else idx[bd[j]] for j in range(len(x.shape))))
        if op == "slice":
            (x,) = node.tensors
            d = node.attrs.dim
            sub = list(idx)
            sub[d] = iadd(size(node.attrs.start), imul(idx[d], const(node.attrs.step)))
            return self.value(x, tuple(sub))
        if op == "unfold":  # window j of position i along dim: element i * step + j
            (x,) = node.tensors
            d = node.attrs.dim
            sub = list(idx[:-1])
            sub[d] = iadd(imul(idx[d], const(node.attrs.step)), idx[-1])
            return self.value(x, tuple(sub))
        if op == "select":
            (x,) = node.tensors
            d = node.attrs.dim
            return self.value(x, (*idx[:d], size(node.attrs.index), *idx[d:]))
        if op == "flip":
            (x,) = node.tensors
            sub = list(idx)
            for d in node.attrs.dims:
                sub[d] = isub(isub(size(node.shape[d]), const(1)), idx[d])
            return self.value(x, tuple(sub))
        if op == "cat":
            return self._cat(node, idx)
        if op == "pad":
            return self._pad(node, idx)
        if op == "gather":
            x, index = node.tensors
            d = node.attrs.dim
            sub = list(idx)
            sub[d] = self.value(index, idx)
            if sub[d].dt != "i64":
                sub[d] = E("cast", (sub[d],), dt="i64")
            return self.value(x, tuple(sub))
        if op in ("reduce", "scan", "matmul", "pool", "input", "param"):
            raise NotFusable(f"{node.name} ({op}) is not materialised")
        return self._pointwise(node, idx)

    def _pointwise(self, node: Node, idx: tuple[E, ...]) -> E:
        op = node.op
        rule = OPS[op].dtype  # the table's dtype rule: what the operands are computed in
        if rule == "compare":
            dts = [a.dtype for a in node.inputs if isinstance(a, Node | Scalar)]
            cdt = "f32" if "f32" in dts else ("bool" if op.startswith("logical") or all(d == "bool" for d in dts) else "i64")
        else:
            cdt = node.dtype
        args = []
        for i, a in enumerate(node.inputs):
            want = "bool" if (rule == "select" and i == 0) else cdt
            args.append(self.operand(a, node, idx, want))
        if op == "cast":
            return args[0] if args[0].dt == node.dtype else E("cast", (args[0],), dt=node.dtype)
        return E(op, tuple(args), v=None if node.attrs is NONE else node.attrs, dt=node.dtype)

    def _cat(self, node: Node, idx: tuple[E, ...]) -> E:
        d = node.attrs.dim
        offset: Any = sympy.Integer(0)
        pieces: list[tuple[E, E]] = []
        for part in node.tensors:
            hi = offset + part.shape[d]
            local = E("imax", (E("imin", (isub(idx[d], size(offset)), size(part.shape[d] - 1)), dt="i64"), ZERO), dt="i64")
            sub = (*idx[:d], local, *idx[d + 1:])
            val = self.value(part, tuple(sub))
            pieces.append((E("lt", (idx[d], size(hi)), dt="bool"), val if val.dt == node.dtype else E("cast", (val,), dt=node.dtype)))
            offset = hi
        result = pieces[-1][1]
        for cond, val in reversed(pieces[:-1]):
            result = E("where", (cond, val, result), dt=node.dtype)
        return result

    def _pad(self, node: Node, idx: tuple[E, ...]) -> E:
        (x,) = node.tensors
        pads = node.attrs.pads
        sub = list(idx)
        valid: E | None = None
        for k in range(len(pads) // 2):
            d = len(idx) - 1 - k
            lo = pads[2 * k]
            if lo == 0 and pads[2 * k + 1] == 0:
                continue
            raw = isub(idx[d], const(lo))
            ok = E("logical_and", (E("ge", (raw, ZERO), dt="bool"), E("lt", (raw, size(x.shape[d])), dt="bool")), dt="bool")
            valid = ok if valid is None else E("logical_and", (valid, ok), dt="bool")
            sub[d] = E("imax", (E("imin", (raw, size(x.shape[d] - 1)), dt="i64"), ZERO), dt="i64")
        val = self.value(x, tuple(sub))
        if valid is None:
            return val
        return E("where", (valid, val, const(float(node.attrs.value), node.dtype)), dt=node.dtype)


def _plain(expr: sympy.Expr) -> sympy.Expr:
    """Drop ``ToFloat`` wrappers (kernels cast sizes themselves)."""
    from torch.utils._sympy.functions import ToFloat

    return expr.replace(lambda e: isinstance(e, ToFloat), lambda e: e.args[0])
