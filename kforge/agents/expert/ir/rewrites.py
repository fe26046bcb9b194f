"""Algebraic rewrites of the IR (:mod:`.graph`) that hold for every input, applied before planning.

Each rule is a named function over a :class:`~.graph.Graph`; :func:`apply_rewrites` runs them in
order and records on the graph the name of every rule that changed something
(``Graph.rewrites``, which reaches the candidate's plan as ``plan["rewrites"]``) and one line
per application (``Graph.rewrite_notes``). The verifier proves each result like any other
candidate; no rule looks at values, only at the graph.

``fold_scalar_chain``
    ``x * 1`` and ``x / 1`` are ``x`` (bit for bit). ``x * a * b``, ``x * a / b``,
    ``-(x * a)``... (one tensor scaled by numbers in a row) become one scaling, only where that
    is *exact* in fp32: at most one of the constants is not a power
    of two (scaling by ``2**e`` commutes with rounding), so both forms round once at the same
    real number (``x * 2 * 3`` -> ``x * 6``; ``(x * 3) / 2`` -> ``x * 1.5``; ``(x / 3) * 2`` ->
    ``x / 1.5``). The only inputs where the two differ are those whose intermediate leaves the
    normal fp32 range (``|x * a|`` above 3.4e38 or below 1.2e-38), where the folded form is the
    correctly rounded one. Folds this rule does **not** make, and why: two constants that are
    both not powers of two (``x * 3 * 5``: two roundings against one, <= 1 ulp apart, which
    would pass the strict policy's 1e-4 but is not the reference's value); any additive fold
    (``(x + 1) - 1`` -> ``x``: the reference rounds ``x + 1``, so the two differ by up to
    ``2**-24 * |x + 1|`` absolute, which a later cancellation can make arbitrarily large
    relative to the output, under any tolerance). Neither kind would make a kernel faster
    (a scalar op in a fused pointwise chain is free), so there is no reason to accept either.

``sum_through_linear``
    a sum over the output features (or the rows, or both) of a matmul, reached through a chain
    of linear steps (scaling by numbers or by tensors constant along the summed dims, negation,
    adding or subtracting any tensor: a bias, a residual), is moved through the matmul:
    ``sum_n (c * (x @ W^T) + b)[m, n] = c * (x @ (sum_n W^T[:, n]))[m] + sum_n b[n]``. The
    summed weight is a reduction of the parameter computed in the candidate at every call (a
    row kernel), never baked; the GEMM becomes a GEMV (and then a row reduction, below). A mean
    is a sum and a division in the IR, so it moves too. Exact in real arithmetic; in fp32 the
    two orders of summation differ by rounding only, like two GEMM tilings do.

``skinny_matmul_as_reduction``
    a matmul whose output has a dimension of 1 to 4 known elements (a GEMV, ``x @ w`` with
    ``w`` of shape ``[K, 1]``, or a single-row GEMM) becomes that many sums over K of a product
    (``reduce(sum, mul(A, b))``): the planner makes it a memory-bound row kernel (one pass over
    the matrix, the epilogue in its outer stores) instead of a GEMM tile of which all but one
    column would be padding.

``drop_dead``
    values no output or buffer update needs (left by the decompositions or by the rules above)
    are dropped.

:func:`work` is the FLOP estimate of a graph (2 per multiply-add of a matmul, one per element
of a pointwise op or of a reduction's input); :mod:`kforge.problem_cost` uses it to let the
roofline floor count the rewritten program's work.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import sympy

from kforge.agents.expert.ir.graph import Graph, Node, Scalar, checked_inputs, numel, prune
from kforge.agents.expert.ir.ops import NONE, POINTWISE, make_attrs

SKINNY = 4  # a matmul output dimension of at most this many known elements is "skinny"


# ------------------------------------------------------------------ editing helpers

class _Edit:
    """New nodes for one graph, inserted before an anchor node (their operands precede it)."""

    def __init__(self, graph: Graph, tag: str) -> None:
        self.g = graph
        self.tag = tag
        self.count = 0
        self.pending: list[Node] = []

    def add(self, op: str, inputs: list[Node | Scalar], shape: Any, dtype: str = "f32", **attrs: Any) -> Node:
        self.count += 1
        node = Node(f"{self.tag}{self.count}", op, checked_inputs(op, inputs), tuple(sympy.sympify(s) for s in shape),
                    dtype, make_attrs(op, **attrs))
        self.pending.append(node)
        return node

    def commit(self, anchor: Node, old: Node, new: Node) -> None:
        """Insert the new nodes before ``anchor`` and let every reader of ``old`` read ``new``."""
        at = self.g.nodes.index(anchor)
        self.g.nodes[at:at] = self.pending
        self.pending = []
        replace(self.g, old, new)


def replace(g: Graph, old: Node, new: Node) -> None:
    for node in g.nodes:
        if node is not new:
            node.inputs = [new if a is old else a for a in node.inputs]
    g.outputs = [new if n is old else n for n in g.outputs]
    g.mutations = [(d, new if v is old else v) for d, v in g.mutations]
    relink(g)


def relink(g: Graph) -> None:
    for node in g.nodes:
        node.users = []
    for node in g.nodes:
        for t in node.tensors:
            if node not in t.users:
                t.users.append(node)


def _needed(g: Graph) -> set[int]:
    return {id(n) for n in g.outputs} | {id(v) for _, v in g.mutations}


def _single_use(g: Graph, node: Node, user: Node) -> bool:
    """Is ``user`` the only reader of ``node`` (and ``node`` no output or buffer update)?"""
    return node.users == [user] and id(node) not in _needed(g) and node.op not in ("input", "param")


# ------------------------------------------------------------------ fold_scalar_chain

def _number(s: Node | Scalar) -> float | None:
    """A Scalar operand's value as the fp32 number the kernels use (None: not a finite,
    non-zero number)."""
    if not isinstance(s, Scalar) or isinstance(s.value, bool):
        return None
    v = s.value
    if isinstance(v, sympy.Basic):
        if not v.is_number:
            return None
        v = float(v)
    if not isinstance(v, int | float):
        return None
    f = float(np.float32(v))
    return f if math.isfinite(f) and f != 0.0 else None


def _pow2(c: float) -> bool:
    return math.frexp(abs(c))[0] == 0.5


def _normal32(c: float) -> bool:
    """``c`` is an fp32 normal number, held exactly."""
    return float(np.float32(c)) == c and 2.0 ** -126 <= abs(c) <= float(np.finfo(np.float32).max)


def _scaling(node: Node) -> tuple[Node, str, float] | None:
    """``node`` as (tensor, "mul" | "div", constant) when it scales one f32 tensor by a number."""
    if node.dtype != "f32":
        return None
    if node.op == "neg" and len(node.inputs) == 1:
        x = node.inputs[0]
        return (x, "mul", -1.0) if isinstance(x, Node) and x.shape == node.shape and x.dtype == "f32" else None
    if node.op not in ("mul", "div") or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    if isinstance(a, Node) and _number(b) is not None:
        x, c = a, _number(b)
    elif node.op == "mul" and isinstance(b, Node) and _number(a) is not None:
        x, c = b, _number(a)
    else:
        return None
    if x.shape != node.shape or x.dtype != "f32":
        return None
    return x, node.op, float(c)  # type: ignore[arg-type]


def _fold(inner: tuple[str, float], outer: tuple[str, float]) -> tuple[str, float] | None:
    """Two scalings in a row as one, when that is exact in fp32 (see the module docstring)."""
    (op1, c1), (op2, c2) = inner, outer
    if _pow2(c1) and _pow2(c2):
        k = (c1 if op1 == "mul" else 1.0 / c1) * (c2 if op2 == "mul" else 1.0 / c2)
        return ("mul", k) if _normal32(k) else None
    if _pow2(c1) == _pow2(c2):
        return None  # two inexact constants: two roundings, not one
    (op_i, c_i), (op_p, p) = ((op1, c1), (op2, c2)) if not _pow2(c1) else ((op2, c2), (op1, c1))
    # the power of two moves into the other constant: x * c * 2^e == x * (c * 2^e) and
    # x / c * 2^e == x / (c / 2^e), each one rounding of the same real number
    scale = p if op_p == "mul" else 1.0 / p
    k = c_i * scale if op_i == "mul" else c_i / scale
    return (op_i, k) if _normal32(k) else None


def fold_scalar_chain(g: Graph, notes: list[str]) -> bool:
    changed = False
    again = True
    while again:
        again = False
        needed = _needed(g)
        for q in g.nodes:
            outer = _scaling(q)
            if outer is None or not (q.users or id(q) in needed):
                continue
            p, op2, c2 = outer
            if c2 == 1.0:  # x * 1 and x / 1 are x, bit for bit (nan, inf and -0 included)
                notes.append(f"fold_scalar_chain: {q.name} = {p.name} {op2} 1 -> {p.name}")
                replace(g, q, p)
                g.nodes.remove(q)
                changed = again = True
                break
            inner = _scaling(p)
            if inner is None or not _single_use(g, p, q):
                continue
            x, op1, c1 = inner
            folded = _fold((op1, c1), (op2, c2))
            if folded is None:
                continue
            op, k = folded
            notes.append(f"fold_scalar_chain: {q.name} = {x.name} {op1} {c1:g} {op2} {c2:g} -> {x.name} {op} {k:g}")
            if op == "mul" and k == 1.0:
                replace(g, q, x)
                g.nodes.remove(q)
            else:
                q.op, q.inputs, q.attrs = op, [x, Scalar(k, "f32")], NONE
                relink(g)
            changed = again = True
            break
    return changed


# ------------------------------------------------------------------ sum_through_linear

Step = tuple[str, Any]  # (kind, operand): neg | mul_s | div_s | mul_t | div_t | add | sub | rsub


def _constant_along(t: Node | Scalar, rank: int, dims: list[int]) -> bool:
    """Does operand ``t`` (right-aligned to ``rank`` dims) not vary along ``dims``?"""
    if isinstance(t, Scalar):
        return True
    off = rank - len(t.shape)
    return all(d - off < 0 or sympy.sympify(t.shape[d - off]) == 1 for d in dims)


def _chain(g: Graph, node: Node, user: Node, dims: list[int], steps: list[Step]) -> Node | None:
    """Walk from ``node`` (read only by ``user``) down to a matmul through linear steps; the
    matmul, with ``steps`` from it outwards, or None."""
    if not _single_use(g, node, user) or node.dtype != "f32":
        return None
    if node.op == "matmul":
        return node
    rank = len(node.shape)
    ins = node.inputs
    options: list[tuple[Node, Step]] = []
    if node.op == "neg":
        options = [(ins[0], ("neg", None))] if isinstance(ins[0], Node) else []
    elif node.op in ("mul", "div") and len(ins) == 2:
        for i in (0, 1) if node.op == "mul" else (0,):
            z, t = ins[i], ins[1 - i]
            if isinstance(z, Node) and _constant_along(t, rank, dims):
                kind = ("mul" if node.op == "mul" else "div") + ("_s" if isinstance(t, Scalar) else "_t")
                if isinstance(t, Scalar) and isinstance(t.value, bool):
                    continue
                options.append((z, (kind, t)))
    elif node.op in ("add", "sub") and len(ins) == 2:
        for i in (0, 1):
            z, t = ins[i], ins[1 - i]
            if isinstance(z, Node) and not (isinstance(t, Scalar) and isinstance(t.value, bool)):
                kind = "add" if node.op == "add" else ("sub" if i == 0 else "rsub")
                options.append((z, (kind, t)))
    for z, step in options:
        if z.shape != node.shape:
            continue
        found = _chain(g, z, node, dims, steps)
        if found is not None:
            steps.append(step)
            return found
    return None


def _summed(e: _Edit, t: Node | Scalar, shape: tuple[Any, ...], dims: list[int]) -> Node | Scalar:
    """``sum over dims`` of operand ``t`` broadcast to ``shape``, keeping the summed dims."""
    count = numel(tuple(shape[d] for d in dims))
    if isinstance(t, Scalar):
        return Scalar(sympy.sympify(t.value) * count, "f32")
    off = len(shape) - len(t.shape)
    own = [d - off for d in dims if d - off >= 0 and sympy.sympify(t.shape[d - off]) != 1]
    factor = numel(tuple(shape[d] for d in dims if d - off < 0 or sympy.sympify(t.shape[d - off]) == 1))
    out: Node = t
    if own:
        kshape = tuple(1 if j in own else s for j, s in enumerate(t.shape))
        out = e.add("reduce", [t if t.dtype == "f32" else e.add("cast", [t], t.shape)], kshape,
                    kind="sum", dims=own, keepdim=True)
    elif t.dtype != "f32":
        out = e.add("cast", [t], t.shape)
    if sympy.sympify(factor) != 1:
        out = e.add("mul", [out, Scalar(factor, "f32")], out.shape)
    return out


def _bshape(a: tuple[Any, ...], b: tuple[Any, ...]) -> tuple[Any, ...]:
    """The broadcast of two shapes (the operand shapes of one pointwise op)."""
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    return tuple(y if sympy.sympify(x) == 1 else x for x, y in zip(a, b, strict=True))


def sum_through_linear(g: Graph, notes: list[str]) -> bool:
    changed = False
    for r in list(g.nodes):
        if r not in g.nodes or r.op != "reduce" or r.attrs.kind != "sum" or r.dtype != "f32":
            continue
        (y,) = r.tensors
        dims = list(r.attrs.dims)
        steps: list[Step] = []
        mm = _chain(g, y, r, dims, steps)
        if mm is None:
            continue
        rank = len(mm.shape)
        if not dims or not set(dims) <= {rank - 2, rank - 1}:
            continue  # a batch sum does not factor through a per-batch matmul
        a, b = mm.tensors
        e = _Edit(g, f"{r.name}_lin")
        # the sums of the added terms first: the planner visits nodes in order, so the kernel
        # of the matmul's reduction finds them stored and takes the whole tail as its epilogue
        summed = {i: _summed(e, t, mm.shape, dims) for i, (kind, t) in enumerate(steps)
                  if kind in ("add", "sub", "rsub")}
        if rank - 1 in dims:  # the sum of W's rows: a reduction of the parameter, every call
            b = e.add("reduce", [b], (*b.shape[:-1], 1), kind="sum", dims=[rank - 1], keepdim=True)
        if rank - 2 in dims:
            a = e.add("reduce", [a], (*a.shape[:-2], 1, a.shape[-1]), kind="sum", dims=[rank - 2], keepdim=True)
        kshape = tuple(1 if d in dims else s for d, s in enumerate(mm.shape))
        value: Node = e.add("matmul", [a, b], kshape)
        for i, (kind, t) in enumerate(steps):
            if kind == "neg":
                value = e.add("neg", [value], value.shape)
            elif kind in ("mul_s", "div_s", "mul_t", "div_t"):
                shape = value.shape if isinstance(t, Scalar) else _bshape(value.shape, t.shape)
                value = e.add(kind[:3], [value, t], shape)
            else:
                st = summed[i]
                shape = value.shape if isinstance(st, Scalar) else _bshape(value.shape, st.shape)
                args = [st, value] if kind == "rsub" else [value, st]
                value = e.add("add" if kind == "add" else "sub", args, shape)
        if tuple(value.shape) != tuple(kshape):
            continue  # pragma: no cover - every step keeps the kept-dims shape
        if not r.attrs.keepdim:
            value = e.add("view", [value], r.shape)
        notes.append(f"sum_through_linear: {r.name} = sum over dims {dims} of {mm.name} "
                     f"(through {', '.join(k for k, _ in steps) or 'nothing'}) -> {value.name}: "
                     f"a matmul with the summed {'columns' if rank - 1 in dims else ''}"
                     f"{' and ' if len(dims) == 2 else ''}{'rows' if rank - 2 in dims else ''} of its operand")
        e.commit(r, r, value)
        changed = True
    return changed


# ------------------------------------------------------------------ skinny_matmul_as_reduction

def _literal(size: Any) -> int | None:
    s = sympy.sympify(size)
    return int(s) if s.is_number else None


def skinny_matmul_as_reduction(g: Graph, notes: list[str]) -> bool:
    changed = False
    for mm in [n for n in g.nodes if n.op == "matmul"]:
        a, b = mm.tensors
        rank = len(mm.shape)
        n, m = _literal(mm.shape[-1]), _literal(mm.shape[-2])
        k = a.shape[-1]
        e = _Edit(g, f"{mm.name}_dot")
        parts: list[Node] = []
        if n is not None and n <= SKINNY:  # column j: sum_k A[.., m, k] * B[.., k, j]
            for j in range(n):
                col = b if n == 1 else e.add("select", [b], b.shape[:-1], dim=rank - 1, index=sympy.Integer(j))
                row = e.add("view", [col], (*b.shape[:-2], 1, k))
                prod = e.add("mul", [a, row], a.shape)
                parts.append(e.add("reduce", [prod], (*a.shape[:-1], 1), kind="sum", dims=[rank - 1], keepdim=True))
            cat_dim, what = rank - 1, f"{n} column(s)"
        elif m is not None and m <= SKINNY:  # row i: sum_k A[.., i, k] * B[.., k, n]
            for i in range(m):
                row = a if m == 1 else e.add("select", [a], (*a.shape[:-2], k), dim=rank - 2, index=sympy.Integer(i))
                col = e.add("view", [row], (*a.shape[:-2], k, 1))
                prod = e.add("mul", [col, b], b.shape)
                parts.append(e.add("reduce", [prod], (*b.shape[:-2], 1, b.shape[-1]), kind="sum",
                                   dims=[rank - 2], keepdim=True))
            cat_dim, what = rank - 2, f"{m} row(s)"
        else:
            continue
        value = parts[0] if len(parts) == 1 else e.add("cat", parts, mm.shape, dim=cat_dim)
        notes.append(f"skinny_matmul_as_reduction: {mm.name} {list(mm.shape)} -> {what} of sum over K of a product")
        e.commit(mm, mm, value)
        changed = True
    return changed


# ------------------------------------------------------------------ drop_dead and the driver

def drop_dead(g: Graph, notes: list[str]) -> Graph:
    before = len(g.nodes)
    out = prune(g)
    if len(out.nodes) < before:
        notes.append(f"drop_dead: {before - len(out.nodes)} value(s) nothing reads")
    return out


RULES: list[tuple[str, Callable[[Graph, list[str]], bool]]] = [
    ("fold_scalar_chain", fold_scalar_chain),
    ("sum_through_linear", sum_through_linear),
    ("skinny_matmul_as_reduction", skinny_matmul_as_reduction),
]


def apply_rewrites(g: Graph) -> Graph:
    """Every rule in order, then ``drop_dead``; the graph records what was applied."""
    applied: list[str] = list(g.rewrites)
    notes: list[str] = list(g.rewrite_notes)

    def dead(g: Graph) -> Graph:
        count = len(notes)
        g = drop_dead(g, notes)
        relink(g)
        if len(notes) > count and "drop_dead" not in applied:
            applied.append("drop_dead")
        return g

    g = dead(g)  # the decompositions' leftovers (unused saved statistics, pool indices)
    for name, rule in RULES:
        if rule(g, notes):
            applied.append(name)
            g = dead(g)  # a rule's leftovers must not block the next rule's single-use checks
    g.rewrites, g.rewrite_notes = applied, notes
    return g


# ------------------------------------------------------------------ work

def work(g: Graph) -> float:
    """FLOPs of one forward of the graph at the traced sizes (see the module docstring)."""
    total = sympy.Integer(0)
    for node in g.nodes:
        if node.op == "matmul":
            a, _ = node.tensors
            total += 2 * numel(node.shape) * a.shape[-1]
        elif node.op == "reduce":
            total += numel(node.tensors[0].shape)
        elif node.op == "pool":
            total += numel(node.shape) * math.prod(node.attrs.kernel)
        elif node.op == "scan" or node.op in POINTWISE:
            total += numel(node.shape)
    return float(g.hint(total))
