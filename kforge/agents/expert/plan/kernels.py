"""The loop-level program a fusion plan becomes: buffers and kernels over :class:`~.expr.E`.

Every backend renders the same four kernel kinds::

    PointwiseKernel   space [d0..dn]: stores, each E over vars p0..pn
    RowKernel         outer [o..] x reduced [r..]: reductions in passes (a pass may read the
                      accumulators of earlier passes), then outer stores (E over o vars and
                      accumulators) and full stores (E over o and r vars, one more pass)
    GemmKernel        [batch] x M x N x K: operands as (buffer, affine index over b, m, k /
                      b, k, n), fp32 accumulation, epilogue stores over vars b, m, n and ``acc``
    ScanKernel        outer [o..] x length: an inclusive scan (sum, prod) of an E over o vars
                      and ``s``, stored along the scanned dim

All sizes are sympy expressions over the capture's size symbols: ModelNew computes them from
its tensors' shapes at run time, so one candidate serves every size of the problem.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sympy

from kforge.agents.expert.plan.expr import E


@dataclass
class Buffer:
    name: str
    shape: tuple[sympy.Expr, ...]
    dtype: str
    kind: str  # "input" | "param" | "temp" | "output"
    source: str = ""  # forward argument or state_dict name for inputs / params
    storage: str = ""  # its type in memory where not ``dtype`` (``Node.storage``: bf16, f16)

    @property
    def stored(self) -> str:
        """The type its elements have in memory."""
        return self.storage or self.dtype


@dataclass
class Store:
    buffer: str
    index: E
    value: E


@dataclass
class Reduction:
    acc: str
    kind: str  # sum prod max min argmax argmin any all
    body: E
    pass_no: int
    dt: str


@dataclass
class PointwiseKernel:
    name: str
    space: tuple[sympy.Expr, ...]
    stores: list[Store]
    kind: str = "pointwise"

    @property
    def vars(self) -> list[str]:
        return [f"p{i}" for i in range(len(self.space))]

    def work_dims(self) -> tuple[sympy.Expr, ...]:
        return self.space


@dataclass
class RowKernel:
    name: str
    outer: tuple[sympy.Expr, ...]
    red: tuple[sympy.Expr, ...]
    reductions: list[Reduction]
    outer_stores: list[Store] = field(default_factory=list)
    full_stores: list[Store] = field(default_factory=list)
    red_inner: bool = True  # the reduced dims are the source's innermost (row, not column)
    kind: str = "row"

    @property
    def passes(self) -> int:
        return max((r.pass_no for r in self.reductions), default=0)

    def work_dims(self) -> tuple[sympy.Expr, ...]:
        return (*self.outer, *self.red)


@dataclass
class Operand:
    buffer: str
    strides: tuple[E, E, E]  # element strides along (batch, rows, cols) of the operand
    offset: E
    # an operand stored first by a prologue kernel: its value at (g0, g1, g2) as an index map
    # over other buffers (a conv's im2col), for a backend that reads it inside the GEMM instead
    # (:mod:`.gather`); None for a strided view
    gather: E | None = None


@dataclass
class GemmKernel:
    name: str
    batch: sympy.Expr | None
    m: sympy.Expr
    n: sympy.Expr
    k: sympy.Expr
    a: Operand  # rows = m, cols = k
    b: Operand  # rows = k, cols = n
    stores: list[Store]
    kind: str = "gemm"


@dataclass
class ScanKernel:
    name: str
    outer: tuple[sympy.Expr, ...]
    length: sympy.Expr
    op: str  # sum | prod
    body: E  # over vars o.. and s
    store: Store  # the scan value is E("acc", v="scan")
    kind: str = "scan"

    def work_dims(self) -> tuple[sympy.Expr, ...]:
        return (*self.outer, self.length)


Kernel = PointwiseKernel | RowKernel | GemmKernel | ScanKernel


@dataclass(frozen=True)
class Refusal:
    """A value the planner did not fuse into a kernel, and the reason (``NotFusable``'s)."""

    kernel: str  # the kernel that tried (the one being grown)
    node: str  # the IR node left out: stored for, or computed by, a later kernel
    op: str
    reason: str


@dataclass
class Program:
    buffers: dict[str, Buffer]
    kernels: list[Kernel]
    inputs: list[str]  # forward() argument names, in order
    outputs: list[str]  # buffer names returned, in order
    returns_tuple: bool
    sources: dict[Any, tuple[int, int, int]]  # size symbol -> (placeholder index, dim, c): dim = c * symbol
    placeholders: list[str]  # buffer name of each placeholder, in capture order
    hints: dict[Any, int]
    notes: list[str] = field(default_factory=list)
    fixed_init: dict[int, Any] = field(default_factory=dict)  # init inputs baked into the kernels (ints, shape tuples)
    init_sources: dict[Any, Any] = field(default_factory=dict)  # size symbol -> init input index (or (index, element))
    derived: dict[Any, tuple[Any, Any]] = field(default_factory=dict)  # quotient q -> (a, b): q = a // b
    rewrites: list[str] = field(default_factory=list)  # names of the rewrite rules applied (rewrites.py)
    rewrite_notes: list[str] = field(default_factory=list)  # what each application did
    refusals: list[Refusal] = field(default_factory=list)  # every fusion the planner refused

    def hint(self, expr: Any) -> int:
        return int(sympy.sympify(expr).subs(self.hints))

    def summary(self) -> str:
        kinds = [k.kind for k in self.kernels]
        return ", ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds)) or "no kernel"
