"""The expert's op-graph IR: a :class:`Graph` of :class:`Node` s in topological order, built
from the captured ATen graph by :mod:`.build`. Every node has an op of the table
(:data:`~.ops.OPS`: its kind, arity, dtype rule), typed attributes (``Node.attrs``, that op's
record), a symbolic shape (sympy expressions over the capture's size symbols) and a dtype.

Operands are nodes or :class:`Scalar` s (Python numbers or sympy size expressions).
``mutations`` are the in-place updates of parameter buffers (BatchNorm's running statistics in
training mode). :func:`cse` merges nodes that compute the same thing, :func:`prune` drops the
ones nothing reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from kforge.agents.expert.capture.trace import Captured
from kforge.agents.expert.errors import UnsupportedError
from kforge.agents.expert.ir.ops import NONE, OPS, Attrs

DTYPES = {torch.float32: "f32", torch.int64: "i64", torch.int32: "i32", torch.bool: "bool"}
# Floating types a tensor may be *stored* in: their values compute in f32 (a node's dtype), are
# loaded as f32 and rounded once where a buffer of that type is written (``Node.storage``), as
# Inductor computes bf16 models. Casts between them and f32 are therefore no-ops in the IR.
STORAGE_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}


@dataclass(frozen=True)
class Scalar:
    value: Any  # float | int | bool | sympy.Expr (a size)
    dtype: str


@dataclass(eq=False)
class Node:
    name: str
    op: str
    inputs: list[Node | Scalar]
    shape: tuple[sympy.Expr, ...]
    dtype: str
    attrs: Attrs = NONE
    users: list[Node] = field(default_factory=list)
    storage: str = ""  # a placeholder's or an output's type in memory where not ``dtype`` (bf16, f16)

    @property
    def tensors(self) -> list[Node]:
        return [a for a in self.inputs if isinstance(a, Node)]

    def __repr__(self) -> str:
        return f"Node({self.name}: {self.op} {list(self.shape)} {self.dtype})"


@dataclass
class Graph:
    nodes: list[Node]
    outputs: list[Node]
    returns_tuple: bool
    mutations: list[tuple[Node, Node]]  # (param buffer, new value)
    captured: Captured
    rewrites: list[str] = field(default_factory=list)  # rule names applied (:mod:`.rewrites`)
    rewrite_notes: list[str] = field(default_factory=list)

    def placeholders(self) -> list[Node]:
        return [n for n in self.nodes if n.op in ("input", "param")]

    def hint(self, expr: Any) -> int:
        """The value of a size expression at the traced sizes."""
        value = sympy.sympify(expr).subs(self.captured.hints)
        return int(value)


def checked_inputs(op: str, inputs: list[Node | Scalar]) -> list[Node | Scalar]:
    """``inputs`` as many as the op table says ``op`` takes."""
    arity = OPS[op].arity
    if arity is not None and len(inputs) != arity:
        raise ValueError(f"{op} takes {arity} operands, got {len(inputs)}")
    return list(inputs)


def numel(shape: tuple[sympy.Expr, ...]) -> sympy.Expr:
    return sympy.Mul(*shape) if shape else sympy.Integer(1)


def dtype_of(value: Any) -> str:
    """The IR dtype values of torch dtype ``value`` compute in (f32 for the storage types)."""
    if value in STORAGE_DTYPES:
        return "f32"
    try:
        return DTYPES[value]
    except KeyError:
        raise UnsupportedError(f"dtype {value}") from None


def storage_of(value: Any) -> str:
    """A ``Node.storage`` for torch dtype ``value``: its name where it is only stored, else ''."""
    return STORAGE_DTYPES.get(value, "")


def _key(node: Node) -> Any:
    args = tuple(("n", id(a)) if isinstance(a, Node) else ("s", str(a.value), a.dtype) for a in node.inputs)
    return (node.op, args, repr(node.attrs), node.dtype, node.shape)


def cse(graph: Graph) -> Graph:
    """Merge nodes that compute the same thing from the same operands (a decomposition's
    repeated ``sum(x)``), redirecting their users and the outputs."""
    seen: dict[Any, Node] = {}
    alias: dict[int, Node] = {}
    kept: list[Node] = []
    for node in graph.nodes:
        node.inputs = [alias.get(id(a), a) if isinstance(a, Node) else a for a in node.inputs]
        if node.op in ("input", "param"):
            kept.append(node)
            continue
        key = _key(node)
        if key in seen:
            alias[id(node)] = seen[key]
            continue
        seen[key] = node
        kept.append(node)
    for node in kept:
        node.users = []
    for node in kept:
        for t in node.tensors:
            if node not in t.users:
                t.users.append(node)
    outputs = [alias.get(id(n), n) for n in graph.outputs]
    mutations = [(d, alias.get(id(v), v)) for d, v in graph.mutations]
    return Graph(kept, outputs, graph.returns_tuple, mutations, graph.captured, graph.rewrites, graph.rewrite_notes)


def prune(graph: Graph) -> Graph:
    """Drop nodes no output or mutation needs (dead values), keeping placeholders."""
    live: set[int] = set()
    stack = [*graph.outputs, *(v for _, v in graph.mutations)]
    while stack:
        node = stack.pop()
        if id(node) in live:
            continue
        live.add(id(node))
        stack.extend(node.tensors)
    kept = [n for n in graph.nodes if id(n) in live or n.op in ("input", "param")]
    for n in kept:
        n.users = [u for u in n.users if id(u) in live]
    return Graph(kept, graph.outputs, graph.returns_tuple, graph.mutations, graph.captured, graph.rewrites,
                 graph.rewrite_notes)


def static_int(value: Any, what: str) -> int:
    """An attribute that must be a concrete integer (kernel sizes, dims)."""
    try:
        return int(value)
    except TypeError:
        raise UnsupportedError(f"symbolic {what}") from None


def prod_int(values: list[int]) -> int:
    return math.prod(values)
