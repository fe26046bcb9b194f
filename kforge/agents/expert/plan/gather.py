"""GEMM operands read through their index map inside the K loop: an implicit GEMM.

A convolution arrives as a GEMM whose A operand is an index map over the input (the padded
input's windows, ``capture/conv.py``). The planner stores such an operand first with a
prologue kernel (every backend can read a strided buffer) and keeps its value as an
:class:`~.expr.E` over (g0, g1, g2) on the :class:`~.kernels.Operand` (``gather``) when it is
an *index map*: loads, integer index arithmetic, comparisons and selects, no float math. A
backend that can evaluate the map per tile (Triton, knob ``gather``) asks :func:`inline_gathers`
for the program without the prologue: the kernel that stores it and its buffer are dropped
where nothing else reads it, so the im2col buffer (``prod(kernel)`` times the input) is never
allocated and the input is read straight from the GEMM's tiles.

:func:`invariant_parts` splits a map into the parts that do not depend on the K loop's
variable (a conv's output position: its divisions by the spatial sizes), which a renderer
computes once per tile before the loop.
"""

from __future__ import annotations

import dataclasses

from kforge.agents.expert.plan.expr import E
from kforge.agents.expert.plan.kernels import GemmKernel, Kernel, Operand, Program

# what an index map may hold besides loads: index arithmetic, comparisons, selects
MAP_OPS = frozenset({"var", "size", "const", "load", "cast", "where", "eq", "ne", "lt", "le", "gt", "ge",
                     "logical_and", "logical_or", "logical_not", "iadd", "isub", "imul", "ifloordiv", "imod",
                     "imin", "imax"})


def index_map(e: E) -> bool:
    """``e`` reads buffers through index arithmetic only (no float math to recompute per tile)."""
    nodes = e.walk()
    return any(x.op == "load" for x in nodes) and all(x.op in MAP_OPS for x in nodes) \
        and all(x.op != "cast" or x.dt == "i64" or x.args[0].dt == x.dt for x in nodes)


def reads(kernel: Kernel) -> set[str]:
    """The buffers ``kernel`` loads."""
    roots: list[E] = []
    names: set[str] = set()
    if isinstance(kernel, GemmKernel):
        for op in (kernel.a, kernel.b):
            if op.gather is not None and not op.buffer:
                roots.append(op.gather)
            else:
                names.add(op.buffer)
        roots += [x for st in kernel.stores for x in (st.index, st.value)]
    elif kernel.kind == "row":
        roots += [r.body for r in kernel.reductions]  # type: ignore[union-attr]
        roots += [x for st in (*kernel.outer_stores, *kernel.full_stores) for x in (st.index, st.value)]  # type: ignore[union-attr]
    elif kernel.kind == "scan":
        roots += [kernel.body, kernel.store.index, kernel.store.value]  # type: ignore[union-attr]
    else:
        roots += [x for st in kernel.stores for x in (st.index, st.value)]  # type: ignore[union-attr]
    names |= {x.v for root in roots for x in root.walk() if x.op == "load"}
    return names


def inline_gathers(program: Program, gemms: set[str]) -> Program:
    """``program`` with the A operand of each GEMM named in ``gemms`` read through its index
    map, and each prologue that nothing else reads (kernel and buffer) dropped."""
    kernels: list[Kernel] = []
    dropped: set[str] = set()
    for k in program.kernels:
        if isinstance(k, GemmKernel) and k.name in gemms and k.a.gather is not None and k.a.buffer:
            dropped.add(k.a.buffer)
            k = dataclasses.replace(k, a=Operand("", k.a.strides, k.a.offset, k.a.gather))
        kernels.append(k)
    users = {name: [k.name for k in kernels if name in reads(k)] for name in dropped}
    dropped = {b for b in dropped if not users[b] and b not in program.outputs
               and program.buffers[b].kind == "temp"}
    kept = [k for k in kernels if not (k.kind == "pointwise" and {st.buffer for st in k.stores} <= dropped)]  # type: ignore[union-attr]
    buffers = {n: b for n, b in program.buffers.items() if n not in dropped}
    return dataclasses.replace(program, kernels=kept, buffers=buffers)


def invariant_parts(e: E, inner: str) -> list[E]:
    """The largest subexpressions of ``e`` that read a loop variable but not ``inner`` and no
    buffer: values a renderer may compute once, outside the loop over ``inner``."""
    found: dict[E, None] = {}
    memo: dict[E, tuple[bool, bool]] = {}

    def deps(x: E) -> tuple[bool, bool]:  # (reads inner or a buffer, reads some loop variable)
        hit = memo.get(x)
        if hit is None:
            if x.op == "var":
                hit = (x.v[0] == inner, True)
            elif x.op == "load":
                hit = (True, True)
            else:
                parts = [deps(a) for a in x.args]
                hit = (any(p[0] for p in parts), any(p[1] for p in parts))
            memo[x] = hit
        return hit

    def visit(x: E) -> None:
        variant, has_var = deps(x)
        if not has_var:
            return
        if not variant:
            if x.op != "var":
                found[x] = None
            return
        for a in x.args:
            visit(a)

    visit(e)
    return list(found)
