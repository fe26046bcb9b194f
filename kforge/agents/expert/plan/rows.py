"""The planner's row kernels: a reduction with the other reductions over the same rows and
their consumers, a pool (a reduction over its window) with its consumers, a scan alone."""

from __future__ import annotations

from typing import Any

import sympy

from kforge.agents.expert.errors import NotFusable, UnsupportedError
from kforge.agents.expert.ir.graph import Node, numel
from kforge.agents.expert.ir.ops import Pool, Reduce, Scan
from kforge.agents.expert.plan.expr import (
    ZERO,
    E,
    const,
    iadd,
    imul,
    index_terms,
    isub,
    linear,
    reshape_index,
    size,
    sizes_equal,
    var,
)
from kforge.agents.expert.plan.kernels import Reduction, RowKernel, ScanKernel, Store
from kforge.agents.expert.plan.lower import Lowerer
from kforge.agents.expert.plan.regions import Regions, loop_vars, same_shape

IDENTITY = {"sum": 0.0, "prod": 1.0, "max": float("-inf"), "min": float("inf"), "any": False,
            "all": True, "argmax": float("-inf"), "argmin": float("inf")}
KERNEL_OF_ITS_OWN = ("reduce", "matmul", "scan", "pool", "input", "param")


class RowPlanner:
    """Row kernels over the planner's state (:class:`~.regions.Regions`)."""

    def __init__(self, regions: Regions) -> None:
        self.r = regions
        self.g = regions.g
        self.claimed_passes: list[int] = []

    def row(self, root: Node) -> None:
        (src,) = root.tensors
        assert isinstance(root.attrs, Reduce)
        dims = root.attrs.dims
        S = src.shape
        outer = tuple(s for i, s in enumerate(S) if i not in dims)
        red = tuple(S[d] for d in dims)
        ov, rv = loop_vars("o", outer), loop_vars("r", red)
        full: list[E] = []
        oi = ri = 0
        for i in range(len(S)):
            if i in dims:
                full.append(rv[ri])
                ri += 1
            else:
                full.append(ov[oi])
                oi += 1
        full_idx = tuple(full)
        members: dict[int, Reduction] = {}
        order: list[Node] = []

        def canonical(node: Node) -> tuple[E, ...]:
            return reshape_index(ov, outer, node.shape) if node.shape else ()

        def claim(node: Node, at: tuple[E, ...]) -> E | None:
            if id(node) in members:
                if at != canonical(node):
                    raise NotFusable("reduction result at another row")
                r = members[id(node)]
                self.claimed_passes.append(r.pass_no)
                return E("acc", v=r.acc, dt=r.dt)
            return None

        def try_add(node: Node) -> bool:
            (x,) = node.tensors
            if not same_shape(x.shape, S) or node.attrs.dims != dims or node.attrs.kind not in IDENTITY:
                return False
            self.claimed_passes = []
            try:
                body = Lowerer(dict(self.r.buffers), claim).value(x, full_idx)
            except NotFusable as err:
                if node is not root:
                    self.r.refuse(root, node, f"a reduction over the same rows: {err}")
                return False
            pass_no = 1 + max(self.claimed_passes, default=0)
            members[id(node)] = Reduction(f"acc{len(members)}", node.attrs.kind, body, pass_no, node.dtype)
            order.append(node)
            return True

        self.claimed_passes: list[int] = []
        if not try_add(root):
            raise UnsupportedError(f"reduction {root.name} cannot be lowered")  # pragma: no cover
        for node in self.g.nodes:  # more reductions over the same rows
            if node is root or id(node) in self.r.done or node.op != "reduce":
                continue
            try_add(node)
        region = set(members)
        outer_nodes, full_nodes = self.grow_row(root, region, outer, S)
        outer_vals = self.r.trial(root, outer_nodes, region, outer, ov, claim)
        full_vals = self.r.trial(root, full_nodes, region, S, full_idx, claim)
        outer_stores = self.r.store_region(outer_nodes, outer_vals, region, outer, ov)
        full_stores = self.r.store_region(full_nodes, full_vals, region, S, full_idx)
        for node in order:  # reductions read from outside are stored as outer values
            self.r.done.add(id(node))
            if self.r.outside_users(node, region):
                value = E("acc", v=members[id(node)].acc, dt=node.dtype)
                name = self.r.new_buffer(node)
                outer_stores.append(Store(name, linear(canonical(node), node.shape), value))
        red_inner = reads_rows(list(members.values()), len(outer), len(red),
                                all(d >= len(S) - len(dims) for d in dims))
        self.r.emit(RowKernel, root, outer, red, list(members.values()), outer_stores, full_stores, red_inner)

    def grow_row(self, root: Node, region: set[int], outer: tuple[Any, ...],
                 S: tuple[Any, ...]) -> tuple[list[Node], list[Node]]:
        """Pointwise / view consumers of the reductions, in the outer space or the full space."""
        n_outer, n_full = numel(outer), numel(S)

        def place(node: Node) -> str | None:
            if node.op in KERNEL_OF_ITS_OWN:
                return f"a {node.op}: a kernel of its own"
            if sizes_equal(numel(node.shape), n_outer) or sizes_equal(numel(node.shape), n_full):
                return None
            return f"{list(node.shape)} is neither the kept dims {list(outer)} nor the whole row {list(S)}"

        joined = self.r.grow(root, region, place)
        outer_nodes = [n for n in joined if sizes_equal(numel(n.shape), n_outer)]
        return outer_nodes, [n for n in joined if not sizes_equal(numel(n.shape), n_outer)]

    def pool(self, node: Node) -> None:
        (x,) = node.tensors
        a = node.attrs
        assert isinstance(a, Pool)
        if a.ceil_mode and a.kind == "avg":  # its last window's divisor is clipped: not done here
            raise UnsupportedError("average pooling with ceil_mode=True")
        nd = a.nd
        ov = loop_vars("o", node.shape)
        rv = loop_vars("r", tuple(a.kernel))
        low = Lowerer(dict(self.r.buffers))
        lead = len(x.shape) - nd
        sub = list(ov[:lead])
        valid: E | None = None
        for d in range(nd):
            raw = iadd(isub(imul(ov[lead + d], const(a.stride[d])), const(a.padding[d])), imul(rv[d], const(a.dilation[d])))
            hi = size(x.shape[lead + d])
            if a.padding[d] or a.ceil_mode:  # a window may reach past the input
                ok = E("logical_and", (E("ge", (raw, ZERO), dt="bool"), E("lt", (raw, hi), dt="bool")), dt="bool")
                valid = ok if valid is None else E("logical_and", (valid, ok), dt="bool")
                raw = E("imax", (E("imin", (raw, isub(hi, const(1))), dt="i64"), ZERO), dt="i64")
            sub.append(raw)
        val = low.value(x, tuple(sub))
        kind = "max" if a.kind == "max" else "sum"
        if valid is not None:
            val = E("where", (valid, val, const(IDENTITY[kind], "f32")), dt="f32")
        reds = [Reduction("acc0", kind, val, 1, "f32")]
        result = E("acc", v="acc0", dt="f32")
        if a.kind == "avg":
            if a.divisor:
                result = E("div", (result, const(float(a.divisor), "f32")), dt="f32")
            elif valid is not None and not a.count_include_pad:
                reds.append(Reduction("acc1", "sum", E("cast", (valid,), dt="f32"), 1, "f32"))
                result = E("div", (result, E("acc", v="acc1", dt="f32")), dt="f32")
            else:
                count = 1
                for k in a.kernel:
                    count *= k
                result = E("div", (result, const(float(count), "f32")), dt="f32")

        def claim(n: Node, at: tuple[E, ...]) -> E | None:
            if n is node:
                if at != ov:
                    raise NotFusable("pool value at another window")
                return result
            return None

        region = {id(node)}  # pointwise consumers of the pooled value join the kernel
        outer_nodes, _ = self.grow_row(node, region, node.shape, node.shape)
        values = self.r.trial(node, outer_nodes, region, node.shape, ov, claim)
        stores = self.r.store_region(outer_nodes, values, region, node.shape, ov)
        self.r.done.add(id(node))
        if self.r.outside_users(node, region):
            stores.insert(0, Store(self.r.new_buffer(node), linear(ov, node.shape), result))
        self.r.emit(RowKernel, node, node.shape, tuple(sympy.Integer(k) for k in a.kernel), reds, stores, [], True)

    def scan(self, node: Node) -> None:
        (x,) = node.tensors
        assert isinstance(node.attrs, Scan)
        d = node.attrs.dim
        S = node.shape
        outer = tuple(s for i, s in enumerate(S) if i != d)
        ov = loop_vars("o", outer)
        s = var("s", S[d])
        full = (*ov[:d], s, *ov[d:])
        body = Lowerer(dict(self.r.buffers)).value(x, full)
        name = self.r.new_buffer(node)
        self.r.done.add(id(node))
        store = Store(name, linear(full, S), E("acc", v="scan", dt=node.dtype))
        self.r.emit(ScanKernel, node, outer, S[d], node.attrs.kind, body, store)



def reads_rows(reductions: list[Reduction], n_outer: int, n_red: int, default: bool) -> bool:
    """Is the reduced space contiguous in memory (a row reduction), judged by the loads: the
    innermost reduced index at unit stride in some load says yes, else the innermost outer
    index at unit stride says no (a column sum over a transposed weight reads columns even
    though its reduced dim is the view's last); neither: ``default`` (the view's dims)."""
    ol, rl = f"o{n_outer - 1}", f"r{n_red - 1}"
    unit_o = unit_r = False
    for r in reductions:
        for e in r.body.walk():
            if e.op == "load":
                terms = index_terms(e.args[0])
                unit_o |= n_outer > 0 and any(t.op == "var" and t.v[0] == ol for t in terms)
                unit_r |= n_red > 0 and any(t.op == "var" and t.v[0] == rl for t in terms)
    if unit_r:
        return True
    return False if unit_o else default


