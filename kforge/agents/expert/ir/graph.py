"""The expert's op-graph IR, built from the captured ATen graph (:mod:`.capture`).

A :class:`Graph` is a list of :class:`Node` s in topological order. Every node has a
symbolic shape (sympy expressions over the size symbols of the capture) and a dtype::

    input / param     forward() argument / state_dict entry (attrs: index, name)
    const             a filled tensor (attrs: value)          iota   start + i * step
    pointwise         every op in POINTWISE (attrs for gelu, leaky_relu, elu, clamp, cast)
    view              reshape (row-major), incl. unsqueeze / squeeze / flatten
    permute  dims     broadcast  bdims (input dim j -> output dim bdims[j]; size-1 dims expand)
    slice  dim start step        select  dim index        flip  dims
    unfold dim size step (windows of dim as a new last dim: a convolution's im2col)
    cat  dim          gather  dim (operands: source, index)  pad  pads value
    reduce   kind (sum prod max min argmax argmin any all), dims, keepdim
    scan     kind (sum prod), dim
    matmul   [M, K] x [K, N] or batched [B, M, K] x [B, K, N]
    pool     kind (max avg), kernel, stride, padding, dilation, ceil_mode, count_include_pad,
             divisor

Operands are nodes or :class:`Scalar` s (Python numbers or sympy size expressions).
Composite ATen ops are rewritten here into these (``mean`` = sum / count, ``var`` = two-pass
sum of squared deviations, ``max.dim`` = max + argmax, ``addmm`` = matmul + add); anything
else is :class:`~.graph.UnsupportedError` naming the ATen op. ``mutations`` are the in-place
updates of parameter buffers (BatchNorm's running statistics in training mode).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from kforge.agents.expert.capture.trace import Captured
from kforge.agents.expert.errors import UnsupportedError

UNARY = ("neg", "abs", "exp", "exp2", "expm1", "log", "log1p", "log2", "sqrt", "rsqrt",
         "reciprocal", "sigmoid", "tanh", "relu", "erf", "sin", "cos", "sign", "floor", "ceil",
         "round", "trunc", "isnan", "logical_not", "gelu", "leaky_relu", "elu", "clamp", "cast",
         "softplus_raw")
BINARY = ("add", "sub", "mul", "div", "floordiv", "truncdiv", "pow", "maximum", "minimum",
          "remainder", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
          "logical_xor")
POINTWISE = (*UNARY, *BINARY, "where")
COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge", "isnan", "logical_not", "logical_and",
               "logical_or", "logical_xor")
VIEWS = ("view", "permute", "broadcast", "slice", "select", "flip", "unfold")
ROOTS = ("reduce", "scan", "matmul", "pool")  # always materialised by a kernel of their own

DTYPES = {torch.float32: "f32", torch.int64: "i64", torch.int32: "i32", torch.bool: "bool"}


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
    attrs: dict[str, Any] = field(default_factory=dict)
    users: list[Node] = field(default_factory=list)

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


def numel(shape: tuple[sympy.Expr, ...]) -> sympy.Expr:
    return sympy.Mul(*shape) if shape else sympy.Integer(1)


def dtype_of(value: Any) -> str:
    try:
        return DTYPES[value]
    except KeyError:
        raise UnsupportedError(f"dtype {value}") from None


def _norm_dims(dims: Any, rank: int) -> list[int]:
    if dims is None or (isinstance(dims, list | tuple) and len(dims) == 0):
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % rank if rank else 0 for d in dims})


class _Builder:
    """Walks the fx graph once; one handler per ATen overload packet."""

    def __init__(self, cap: Captured) -> None:
        self.cap = cap
        self.nodes: list[Node] = []
        self.env: dict[str, Any] = {}
        self.mutations: list[tuple[Node, Node]] = []

    # -------------------------------------------------------------- helpers
    def add(self, op: str, inputs: list[Node | Scalar], shape: Any, dtype: str, **attrs: Any) -> Node:
        node = Node(f"n{len(self.nodes)}", op, list(inputs), tuple(self.cap.size_expr(s) for s in shape), dtype, attrs)
        for t in node.tensors:
            t.users.append(node)
        self.nodes.append(node)
        return node

    def operand(self, a: Any, dtype: str = "f32") -> Node | Scalar:
        if isinstance(a, torch.fx.Node):
            v = self.env[a.name]
            if isinstance(v, Node | Scalar):
                return v
            raise UnsupportedError(f"operand {a.name} is a tuple")
        if isinstance(a, bool):
            return Scalar(a, "bool")
        if isinstance(a, int):
            return Scalar(a, "i64" if dtype != "f32" else "f32")
        if isinstance(a, float):
            return Scalar(a, "f32")
        raise UnsupportedError(f"operand {a!r}")

    def tensor(self, a: Any) -> Node:
        v = self.operand(a)
        if not isinstance(v, Node):
            raise UnsupportedError("a scalar where a tensor is expected")
        return v

    def meta(self, fx: torch.fx.Node) -> tuple[Any, str]:
        val = fx.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise UnsupportedError(f"{fx.target} returns no tensor")
        return val.shape, dtype_of(val.dtype)

    def reduce(self, x: Node, kind: str, dims: list[int], keepdim: bool, dtype: str | None = None) -> Node:
        shape = [1 if i in dims else s for i, s in enumerate(x.shape)] if keepdim else \
            [s for i, s in enumerate(x.shape) if i not in dims]
        out_dtype = dtype or ("i64" if kind in ("argmax", "argmin") else "bool" if kind in ("any", "all") else x.dtype)
        return self.add("reduce", [x], shape, out_dtype, kind=kind, dims=dims, keepdim=keepdim)

    def mean(self, x: Node, dims: list[int], keepdim: bool) -> Node:
        total = self.reduce(x, "sum", dims, keepdim)
        count = numel(tuple(x.shape[d] for d in dims))
        return self.add("div", [total, Scalar(count, "f32")], total.shape, "f32")

    def expand_back(self, r: Node, x: Node, dims: list[int], keepdim: bool) -> Node:
        """A reduction result broadcast back over the input's shape."""
        kept = [i for i in range(len(x.shape)) if i not in dims]
        bdims = list(range(len(x.shape))) if keepdim else kept
        return self.add("broadcast", [r], x.shape, r.dtype, bdims=bdims)

    def var(self, x: Node, dims: list[int], correction: float, keepdim: bool) -> Node:
        mean = self.mean(x, dims, keepdim)
        dev = self.add("sub", [x, self.expand_back(mean, x, dims, keepdim)], x.shape, "f32")
        sq = self.add("mul", [dev, dev], x.shape, "f32")
        total = self.reduce(sq, "sum", dims, keepdim)
        count = numel(tuple(x.shape[d] for d in dims)) - sympy.sympify(correction)
        return self.add("div", [total, Scalar(count, "f32")], total.shape, "f32")

    # -------------------------------------------------------------- walk
    def run(self) -> Graph:
        from kforge.agents.expert.ir.aten import HANDLERS

        outputs: list[Node] = []
        returns_tuple = False
        index = 0
        for fx in self.cap.gm.graph.nodes:
            if fx.op == "placeholder":
                if isinstance(fx.meta.get("val"), torch.SymInt | int):  # an init input (a size)
                    self.env[fx.name] = Scalar(self.cap.size_expr(fx.meta["val"]), "i64")
                    continue
                ph = self.cap.placeholders[index]
                shape, dtype = self.meta(fx)
                self.env[fx.name] = self.add(ph.role, [], shape, dtype, index=index, name=ph.name,
                                             is_buffer=ph.is_buffer)
                index += 1
            elif fx.op == "get_attr":  # a constant the forward made (``torch.tensor(0.5)``)
                value = getattr(self.cap.gm, str(fx.target), None)
                if not isinstance(value, torch.Tensor) or value.numel() != 1 or value.dtype not in DTYPES \
                        or value.is_meta:
                    raise UnsupportedError(f"a constant tensor {fx.target} that is not a single number")
                item = value.item()
                self.env[fx.name] = self.add("const", [], tuple(value.shape), DTYPES[value.dtype],
                                             value=float(item) if value.is_floating_point() else item)
            elif fx.op == "output":
                result = fx.args[0]
                returns_tuple = isinstance(result, list | tuple)
                for r in (result if returns_tuple else [result]):
                    if not isinstance(r, torch.fx.Node) or not isinstance(self.env.get(r.name), Node):
                        raise UnsupportedError("an output that is not a tensor")
                    outputs.append(self.env[r.name])
            elif fx.op == "call_function":
                val = fx.meta.get("val")
                if isinstance(val, torch.SymInt | torch.SymFloat | int | float) and not isinstance(val, bool) \
                        and fx.target not in (operator.getitem,):
                    self.env[fx.name] = Scalar(self.cap.size_expr(val), "f32" if isinstance(val, torch.SymFloat | float) else "i64")
                    continue
                if isinstance(val, list | tuple) and val and all(
                        isinstance(v, torch.SymInt | int) and not isinstance(v, bool) for v in val):
                    self.env[fx.name] = [Scalar(self.cap.size_expr(v), "i64") for v in val]  # x.size()
                    continue
                if fx.target is operator.getitem:
                    self.env[fx.name] = self.env[fx.args[0].name][fx.args[1]]
                    continue
                packet = getattr(fx.target, "overloadpacket", None)
                key = f"{getattr(packet, '__module__', '')}.{getattr(packet, '__name__', fx.target)}"
                key = key.replace("torch._ops.", "").replace("torch.ops.", "")
                name = getattr(packet, "__name__", str(fx.target))
                handler = HANDLERS.get(name) if "prims" not in key else HANDLERS.get(f"prims.{name}")
                if handler is None and name.endswith("_") and name[:-1] in HANDLERS:
                    from kforge.agents.expert.ir.inplace import inplace_on_computed

                    self.env[fx.name] = inplace_on_computed(self, fx, HANDLERS[name[:-1]])
                    continue
                if handler is None:
                    if "convolution" in name:
                        raise UnsupportedError("conv")
                    raise UnsupportedError(f"op {fx.target}")
                self.env[fx.name] = handler(self, fx)
            else:
                raise UnsupportedError(f"fx node kind {fx.op}")
        return Graph(self.nodes, outputs, returns_tuple, self.mutations, self.cap)


def build_graph(cap: Captured, rewrite: bool = True) -> Graph:
    """The IR of a capture: common values merged, then (``rewrite``) the algebraic rewrites of
    :mod:`.rewrites` (dead values dropped among them), else only the dead values dropped."""
    from kforge.agents.expert.ir.rewrites import apply_rewrites

    graph = cse(_Builder(cap).run())
    graph = apply_rewrites(graph) if rewrite else prune(graph)
    for node in graph.nodes:
        if node.op == "unsupported":
            raise UnsupportedError(node.attrs["reason"])
    return graph


def _key(node: Node) -> Any:
    args = tuple(("n", id(a)) if isinstance(a, Node) else ("s", str(a.value), a.dtype) for a in node.inputs)
    return (node.op, args, repr(sorted(node.attrs.items())), node.dtype, node.shape)


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
