"""The fusion planner: an IR :class:`~.ir.Graph` -> a :class:`~.kernels.Program`.

Nodes are visited in topological order. Placeholders are buffers. Every *root* (matmul,
reduction, scan, pool) starts a kernel and the kernel grows a region around it:

* a GEMM absorbs the pointwise consumers of its output that have the output's shape and whose
  other operands are ready (bias, residual, scale...): its epilogue; operands that are plain
  (possibly transposed or broadcast) views of a buffer are read through strides, anything
  else (a prologue) is materialised first by a pointwise kernel;
* a reduction absorbs the other reductions over the same source shape and dims (one pass
  when independent, another pass when one reads another: softmax, LayerNorm, GroupNorm,
  BatchNorm's column statistics), then the pointwise consumers over the kept dims (outer
  stores: a mean, a logsumexp) and over the whole source (full stores: a normalised row);
* a pool is a reduction over its window; a scan stands alone.

A region stores only the nodes that something outside it reads (or that are outputs). Every
attempt to fuse is checked by lowering: a claim at an index the kernel does not hold raises
:class:`~.lower.NotFusable` and the node is left to a later kernel. Whatever is still needed
and unstored (an output that is a pure pointwise chain) gets a pointwise kernel.
"""

from __future__ import annotations

from typing import Any

import sympy

from kforge.agents.expert.errors import NotFusable, UnsupportedError
from kforge.agents.expert.ir.graph import POINTWISE, Graph, Node, numel
from kforge.agents.expert.plan.kernels import (
    Buffer,
    GemmKernel,
    Kernel,
    Operand,
    PointwiseKernel,
    Program,
    Reduction,
    RowKernel,
    ScanKernel,
    Store,
)
from kforge.agents.expert.plan.lower import (
    ZERO,
    E,
    Lowerer,
    const,
    iadd,
    imul,
    isub,
    linear,
    reshape_index,
    size,
    sizes_equal,
    var,
)

IDENTITY = {"sum": 0.0, "prod": 1.0, "max": float("-inf"), "min": float("inf"), "any": False,
            "all": True, "argmax": float("-inf"), "argmin": float("inf")}


def _vars(prefix: str, shape: tuple[Any, ...]) -> tuple[E, ...]:
    """Loop variables over ``shape``; a size-1 dimension's index is the constant 0."""
    return tuple(ZERO if sympy.sympify(s) == 1 else var(f"{prefix}{i}", s) for i, s in enumerate(shape))


def same_shape(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(sizes_equal(x, y) for x, y in zip(a, b, strict=True))


class Planner:
    def __init__(self, graph: Graph) -> None:
        self.g = graph
        self.buffers: dict[Node, str] = {}
        self.program_buffers: dict[str, Buffer] = {}
        self.kernels: list[Kernel] = []
        self.needed = {id(n) for n in graph.outputs} | {id(v) for _, v in graph.mutations}
        self.done: set[int] = set()  # nodes handled by some kernel (stored or fused away)

    # ------------------------------------------------------------------ buffers
    def new_buffer(self, node: Node, kind: str = "temp", source: str = "") -> str:
        for dst, value in self.g.mutations:  # a running-statistics update writes the buffer itself
            if value is node and dst in self.buffers and kind == "temp":
                self.buffers[node] = self.buffers[dst]
                return self.buffers[dst]
        name = f"buf{len(self.program_buffers)}" if kind == "temp" else (f"{kind}{len(self.program_buffers)}")
        self.program_buffers[name] = Buffer(name, node.shape, node.dtype, kind, source)
        self.buffers[node] = name
        return name

    def outside_users(self, node: Node, region: set[int]) -> bool:
        return id(node) in self.needed or any(id(u) not in region for u in node.users)

    def ready(self, node: Node) -> bool:
        """Can ``node`` be computed now from stored buffers alone (no claims)?"""
        try:
            Lowerer(self.buffers).value(node, _vars("t", node.shape))
            return True
        except NotFusable:
            return False

    # ------------------------------------------------------------------ main loop
    def plan(self) -> Program:
        placeholders = []
        for node in self.g.nodes:
            if node.op in ("input", "param"):
                placeholders.append(self.new_buffer(node, node.op, node.attrs["name"]))
                self.done.add(id(node))
        for node in self.g.nodes:
            if id(node) in self.done:
                continue
            if node.op == "matmul":
                self.gemm(node)
            elif node.op in ("reduce", "pool"):
                self.row(node)
            elif node.op == "scan":
                self.scan(node)
            elif id(node) in self.needed and node not in self.buffers:
                self.pointwise([node])
        outputs = []
        for out in self.g.outputs:
            if self.program_buffers[self.buffers[out]].kind in ("input", "param"):
                self.pointwise([out], force_copy=True)  # never return an input (an alias)
            outputs.append(self.buffers[out])
        names = [self.program_buffers[self.buffers[n]].source for n in self.g.placeholders() if n.op == "input"]
        cap = self.g.captured
        return Program(self.program_buffers, self.kernels, names, outputs, self.g.returns_tuple,
                       dict(cap.sources), placeholders, dict(cap.hints), fixed_init=dict(cap.fixed_init),
                       init_sources=dict(cap.init_sources), derived=dict(cap.derived),
                       rewrites=list(self.g.rewrites), rewrite_notes=list(self.g.rewrite_notes))

    # ------------------------------------------------------------------ pointwise
    def pointwise(self, nodes: list[Node], force_copy: bool = False) -> None:
        space = nodes[0].shape
        idx = _vars("p", space)
        low = Lowerer(dict(self.buffers) if not force_copy else {k: v for k, v in self.buffers.items() if k is not nodes[0]} | ({nodes[0]: self.buffers[nodes[0]]}))
        stores = []
        for node in nodes:
            value = low.value(node, idx)
            name = self.new_buffer(node)
            stores.append(Store(name, linear(idx, space), value))
            self.done.add(id(node))
        self.kernels.append(PointwiseKernel(f"k{len(self.kernels)}", space, stores))

    # ------------------------------------------------------------------ GEMM
    def operand(self, node: Node, names: tuple[str, str, str], batched: bool) -> Operand:
        """(buffer, strides) of a matmul operand; materialised first when not a strided view."""
        idx = _vars("g", node.shape if batched else (1, *node.shape))
        sub = idx if batched else idx[1:]
        for attempt in range(2):
            try:
                e = Lowerer(self.buffers).value(node, sub)
            except NotFusable:
                e = None
            if e is not None and e.op == "load":
                coeffs = affine(e.args[0], ["g0", "g1", "g2"])
                if coeffs is not None:
                    strides, offset = coeffs
                    return Operand(e.v, (strides["g0"], strides["g1"], strides["g2"]), offset)
            if attempt == 0:
                self.pointwise([node])
        raise UnsupportedError(f"matmul operand {node.name} could not be laid out")  # pragma: no cover

    def gemm(self, mm: Node) -> None:
        a, b = mm.tensors
        batched = len(mm.shape) == 3
        opa = self.operand(a, ("b", "m", "k"), batched)
        opb = self.operand(b, ("b", "k", "n"), batched)
        region = self.grow_pointwise({id(mm)}, mm.shape, claim_root=mm)
        idx = _vars("e", mm.shape if batched else (1, *mm.shape))
        idx = idx if batched else idx[1:]
        expected = idx

        def claim(node: Node, at: tuple[E, ...]) -> E | None:
            if node is mm:
                if at != expected:
                    raise NotFusable("matmul output at another index")
                return E("acc", v="acc", dt="f32")
            return None

        members = [n for n in self.g.nodes if id(n) in region and n is not mm]
        values = self.trial(members, region, mm.shape, idx, claim)
        stores = self.store_region(members, values, region, mm.shape, idx)
        self.done.add(id(mm))
        if self.outside_users(mm, region):
            stores.insert(0, Store(self.new_buffer(mm), linear(idx, mm.shape), E("acc", v="acc", dt="f32")))
        batch = mm.shape[0] if batched else None
        m, n = mm.shape[-2], mm.shape[-1]
        kdim = a.shape[-1]
        self.kernels.append(GemmKernel(f"k{len(self.kernels)}", batch, m, n, kdim, opa, opb, stores))

    # ------------------------------------------------------------------ regions
    def grow_pointwise(self, region: set[int], shape: tuple[Any, ...], claim_root: Node) -> set[int]:
        """Add same-shape pointwise users whose other operands are ready, until none is left."""
        nodes = {id(n): n for n in self.g.nodes}
        changed = True
        while changed:
            changed = False
            for node in self.g.nodes:
                if id(node) in region or id(node) in self.done or node.op not in POINTWISE:
                    continue
                if not same_shape(node.shape, shape):
                    continue
                ins = node.tensors
                if not any(id(t) in region for t in ins):
                    continue
                if all(id(t) in region or self.ready(t) for t in ins):
                    region.add(id(node))
                    changed = True
        del nodes
        return region

    # ------------------------------------------------------------------ reductions
    def row(self, root: Node) -> None:
        if root.op == "pool":
            self.pool(root)
            return
        (src,) = root.tensors
        dims = root.attrs["dims"]
        S = src.shape
        outer = tuple(s for i, s in enumerate(S) if i not in dims)
        red = tuple(S[d] for d in dims)
        ov, rv = _vars("o", outer), _vars("r", red)
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
            if not same_shape(x.shape, S) or node.attrs["dims"] != dims or node.attrs["kind"] not in IDENTITY:
                return False
            self.claimed_passes = []
            try:
                body = Lowerer(dict(self.buffers), claim).value(x, full_idx)
            except NotFusable:
                return False
            pass_no = 1 + max(self.claimed_passes, default=0)
            members[id(node)] = Reduction(f"acc{len(members)}", node.attrs["kind"], body, pass_no, node.dtype)
            order.append(node)
            return True

        self.claimed_passes: list[int] = []
        if not try_add(root):
            raise UnsupportedError(f"reduction {root.name} cannot be lowered")  # pragma: no cover
        for node in self.g.nodes:  # more reductions over the same rows
            if node is root or id(node) in self.done or node.op != "reduce":
                continue
            try_add(node)
        region = set(members)
        outer_nodes, full_nodes = self.grow_row(region, outer, S)
        outer_vals = self.trial(outer_nodes, region, outer, ov, claim)
        full_vals = self.trial(full_nodes, region, S, full_idx, claim)
        outer_stores = self.store_region(outer_nodes, outer_vals, region, outer, ov)
        full_stores = self.store_region(full_nodes, full_vals, region, S, full_idx)
        for node in order:  # reductions read from outside are stored as outer values
            self.done.add(id(node))
            if self.outside_users(node, region):
                value = E("acc", v=members[id(node)].acc, dt=node.dtype)
                name = self.new_buffer(node)
                outer_stores.append(Store(name, linear(canonical(node), node.shape), value))
        red_inner = _reads_rows(list(members.values()), len(outer), len(red),
                                all(d >= len(S) - len(dims) for d in dims))
        self.kernels.append(RowKernel(f"k{len(self.kernels)}", outer, red, list(members.values()),
                                      outer_stores, full_stores, red_inner))

    def grow_row(self, region: set[int], outer: tuple[Any, ...], S: tuple[Any, ...]) -> tuple[list[Node], list[Node]]:
        """Pointwise / view consumers of the reductions, in the outer space or the full space."""
        n_outer, n_full = numel(outer), numel(S)
        outer_nodes: list[Node] = []
        full_nodes: list[Node] = []
        changed = True
        while changed:
            changed = False
            for node in self.g.nodes:
                if id(node) in region or id(node) in self.done or node.op in ("reduce", "matmul", "scan", "pool", "input", "param"):
                    continue
                if not any(id(t) in region for t in node.tensors):
                    continue
                if not all(id(t) in region or self.ready(t) for t in node.tensors):
                    continue
                if sizes_equal(numel(node.shape), n_outer):
                    outer_nodes.append(node)
                elif sizes_equal(numel(node.shape), n_full):
                    full_nodes.append(node)
                else:
                    continue
                region.add(id(node))
                changed = True
        return outer_nodes, full_nodes

    def trial(self, nodes: list[Node], region: set[int], space: tuple[Any, ...],
              idx: tuple[E, ...], claim: Any) -> dict[int, E]:
        """Each region node's value in the kernel; one that needs a claim at another index
        leaves the region (so whatever it reads is stored for the kernel that computes it)."""
        values: dict[int, E] = {}
        for node in nodes:
            try:
                values[id(node)] = Lowerer(dict(self.buffers), claim).value(node, reshape_index(idx, space, node.shape))
            except NotFusable:
                region.discard(id(node))
        return values

    def store_region(self, nodes: list[Node], values: dict[int, E], region: set[int],
                     space: tuple[Any, ...], idx: tuple[E, ...]) -> list[Store]:
        """Stores of the region nodes that something outside the region reads."""
        stores: list[Store] = []
        for node in nodes:
            if id(node) not in values:
                continue
            self.done.add(id(node))
            if self.outside_users(node, region):
                name = self.new_buffer(node)
                stores.append(Store(name, linear(idx, space), values[id(node)]))
        return stores

    # ------------------------------------------------------------------ pools and scans
    def pool(self, node: Node) -> None:
        (x,) = node.tensors
        a = node.attrs
        nd = a["nd"]
        ov = _vars("o", node.shape)
        rv = _vars("r", tuple(a["kernel"]))
        low = Lowerer(dict(self.buffers))
        lead = len(x.shape) - nd
        sub = list(ov[:lead])
        valid: E | None = None
        for d in range(nd):
            raw = iadd(isub(imul(ov[lead + d], const(a["stride"][d])), const(a["padding"][d])), imul(rv[d], const(a["dilation"][d])))
            hi = size(x.shape[lead + d])
            if a["padding"][d]:
                ok = E("logical_and", (E("ge", (raw, ZERO), dt="bool"), E("lt", (raw, hi), dt="bool")), dt="bool")
                valid = ok if valid is None else E("logical_and", (valid, ok), dt="bool")
                raw = E("imax", (E("imin", (raw, isub(hi, const(1))), dt="i64"), ZERO), dt="i64")
            sub.append(raw)
        val = low.value(x, tuple(sub))
        kind = "max" if a["kind"] == "max" else "sum"
        if valid is not None:
            val = E("where", (valid, val, const(IDENTITY[kind], "f32")), dt="f32")
        reds = [Reduction("acc0", kind, val, 1, "f32")]
        result = E("acc", v="acc0", dt="f32")
        if a["kind"] == "avg":
            if a["divisor"]:
                result = E("div", (result, const(float(a["divisor"]), "f32")), dt="f32")
            elif valid is not None and not a["count_include_pad"]:
                reds.append(Reduction("acc1", "sum", E("cast", (valid,), dt="f32"), 1, "f32"))
                result = E("div", (result, E("acc", v="acc1", dt="f32")), dt="f32")
            else:
                count = 1
                for k in a["kernel"]:
                    count *= k
                result = E("div", (result, const(float(count), "f32")), dt="f32")
        def claim(n: Node, at: tuple[E, ...]) -> E | None:
            if n is node:
                if at != ov:
                    raise NotFusable("pool value at another window")
                return result
            return None

        region = {id(node)}  # pointwise consumers of the pooled value join the kernel
        outer_nodes, _ = self.grow_row(region, node.shape, node.shape)
        values = self.trial(outer_nodes, region, node.shape, ov, claim)
        stores = self.store_region(outer_nodes, values, region, node.shape, ov)
        self.done.add(id(node))
        if self.outside_users(node, region):
            stores.insert(0, Store(self.new_buffer(node), linear(ov, node.shape), result))
        self.kernels.append(RowKernel(f"k{len(self.kernels)}", node.shape, tuple(sympy.Integer(k) for k in a["kernel"]),
                                      reds, stores, [], True))

    def scan(self, node: Node) -> None:
        (x,) = node.tensors
        d = node.attrs["dim"]
        S = node.shape
        outer = tuple(s for i, s in enumerate(S) if i != d)
        ov = _vars("o", outer)
        s = var("s", S[d])
        full = (*ov[:d], s, *ov[d:])
        body = Lowerer(dict(self.buffers)).value(x, full)
        name = self.new_buffer(node)
        self.done.add(id(node))
        store = Store(name, linear(full, S), E("acc", v="scan", dt=node.dtype))
        self.kernels.append(ScanKernel(f"k{len(self.kernels)}", outer, S[d], node.attrs["kind"], body, store))


def _reads_rows(reductions: list[Reduction], n_outer: int, n_red: int, default: bool) -> bool:
    """Is the reduced space contiguous in memory (a row reduction), judged by the loads: the
    innermost reduced index at unit stride in some load says yes, else the innermost outer
    index at unit stride says no (a column sum over a transposed weight reads columns even
    though its reduced dim is the view's last); neither: ``default`` (the view's dims)."""
    ol, rl = f"o{n_outer - 1}", f"r{n_red - 1}"
    unit_o = unit_r = False
    for r in reductions:
        for e in r.body.walk():
            if e.op == "load":
                terms = _index_terms(e.args[0])
                unit_o |= n_outer > 0 and any(t.op == "var" and t.v[0] == ol for t in terms)
                unit_r |= n_red > 0 and any(t.op == "var" and t.v[0] == rl for t in terms)
    if unit_r:
        return True
    return False if unit_o else default


def _index_terms(e: E) -> list[E]:
    return [*_index_terms(e.args[0]), *_index_terms(e.args[1])] if e.op == "iadd" else [e]


def affine(e: E, names: list[str]) -> tuple[dict[str, E], E] | None:
    """``e`` as ``offset + sum(coeff[v] * v)`` with coefficients free of the variables."""
    coeffs: dict[str, E] = {n: ZERO for n in names}

    def walk(x: E, scale: E) -> E | None:
        if x.op == "var":
            if x.v[0] not in coeffs:
                return None
            coeffs[x.v[0]] = iadd(coeffs[x.v[0]], scale)
            return ZERO
        if x.op in ("const", "size"):
            return imul(x, scale)
        if x.op == "iadd":
            a, b = walk(x.args[0], scale), walk(x.args[1], scale)
            return None if a is None or b is None else iadd(a, b)
        if x.op == "imul":
            a, b = x.args
            if not _has_var(a):
                return walk(b, imul(scale, a))
            if not _has_var(b):
                return walk(a, imul(scale, b))
        return None

    offset = walk(e, const(1))
    return None if offset is None else (coeffs, offset)


def _has_var(e: E) -> bool:
    return any(x.op == "var" for x in e.walk())


def plan_graph(graph: Graph) -> Program:
    return Planner(graph).plan()


def plan_problem(problem_source: str) -> Program:
    """Capture, build the IR and plan: a problem's source -> its kernel program."""
    from kforge.agents.expert.capture.trace import capture_problem
    from kforge.agents.expert.ir.graph import build_graph

    return plan_graph(build_graph(capture_problem(problem_source)))
