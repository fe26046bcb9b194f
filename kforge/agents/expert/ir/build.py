"""The IR of a capture: one walk over the fx graph, one handler per ATen overload packet
(:data:`~.handlers.HANDLERS`, filled by :mod:`.aten` and :mod:`.inplace`), then common values
merged and the algebraic rewrites applied (:mod:`.rewrites`).

Composite ATen ops become ops of the table here (``mean`` = sum / count, ``var`` = two-pass
sum of squared deviations, ``max.dim`` = max + argmax, ``addmm`` = matmul + add); anything
else is :class:`~kforge.agents.expert.errors.UnsupportedError` naming the ATen op.
"""

from __future__ import annotations

import operator
from typing import Any

import sympy
import torch

from kforge.agents.expert.capture.trace import Captured
from kforge.agents.expert.errors import UnsupportedError
from kforge.agents.expert.ir import aten  # noqa: F401  (its handlers fill HANDLERS)
from kforge.agents.expert.ir.graph import (
    DTYPES,
    STORAGE_DTYPES,
    Graph,
    Node,
    Scalar,
    checked_inputs,
    cse,
    dtype_of,
    numel,
    prune,
    storage_of,
)
from kforge.agents.expert.ir.handlers import HANDLERS
from kforge.agents.expert.ir.inplace import inplace_on_computed
from kforge.agents.expert.ir.ops import make_attrs
from kforge.agents.expert.ir.rewrites import apply_rewrites


class Builder:
    """Walks the fx graph once; one handler per ATen overload packet."""

    def __init__(self, cap: Captured) -> None:
        self.cap = cap
        self.nodes: list[Node] = []
        self.env: dict[str, Any] = {}
        self.mutations: list[tuple[Node, Node]] = []
        self.output_storage: list[str] = []  # per output, the type it is returned in (``Node.storage``)

    # -------------------------------------------------------------- helpers
    def add(self, op: str, inputs: list[Node | Scalar], shape: Any, dtype: str, **attrs: Any) -> Node:
        """A new node of ``op`` (a row of the op table) with its typed attributes ``attrs``."""
        node = Node(f"n{len(self.nodes)}", op, checked_inputs(op, inputs), tuple(self.cap.size_expr(s) for s in shape),
                    dtype, make_attrs(op, **attrs))
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
                self.env[fx.name].storage = storage_of(fx.meta["val"].dtype)
                index += 1
            elif fx.op == "get_attr":  # a constant the forward made (``torch.tensor(0.5)``)
                value = getattr(self.cap.gm, str(fx.target), None)
                if not isinstance(value, torch.Tensor) or value.numel() != 1 or value.is_meta \
                        or (value.dtype not in DTYPES and value.dtype not in STORAGE_DTYPES):
                    raise UnsupportedError(f"a constant tensor {fx.target} that is not a single number")
                item = value.item()
                self.env[fx.name] = self.add("const", [], tuple(value.shape), dtype_of(value.dtype),
                                             value=float(item) if value.is_floating_point() else item)
            elif fx.op == "output":
                result = fx.args[0]
                returns_tuple = isinstance(result, list | tuple)
                for r in (result if returns_tuple else [result]):
                    if not isinstance(r, torch.fx.Node) or not isinstance(self.env.get(r.name), Node):
                        raise UnsupportedError("an output that is not a tensor")
                    outputs.append(self.env[r.name])
                    self.output_storage.append(storage_of(r.meta["val"].dtype))
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
    builder = Builder(cap)
    graph = cse(builder.run())
    graph = apply_rewrites(graph) if rewrite else prune(graph)
    for out, storage in zip(graph.outputs, builder.output_storage, strict=True):  # after the rewrites
        if out.op in ("input", "param") or out.storage:  # its type in memory is set already
            if out.storage != storage:
                raise UnsupportedError(f"a value held as {out.storage or out.dtype} returned as {storage or out.dtype}")
        else:
            out.storage = storage
    for node in graph.nodes:
        if node.op == "unsupported":
            raise UnsupportedError(node.attrs.reason)  # type: ignore[attr-defined]
    return graph


