"""The fusion planner: an IR :class:`~kforge.agents.expert.ir.graph.Graph` -> a :class:`~.kernels.Program`.

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
:class:`~kforge.agents.expert.errors.NotFusable` and the node is left to a later kernel.
Whatever is still needed and unstored (an output that is a pure pointwise chain) gets a
pointwise kernel. Every consumer a kernel's region does not take is recorded with the reason
(``Program.refusals``: the plan record's ``refusals``). Reductions, pools and scans:
:mod:`.rows`.
"""

from __future__ import annotations

from kforge.agents.expert.errors import NotFusable, UnsupportedError
from kforge.agents.expert.ir.graph import Graph, Node, numel
from kforge.agents.expert.ir.ops import POINTWISE
from kforge.agents.expert.plan.expr import E, affine, linear, reshape_index, sizes_equal
from kforge.agents.expert.plan.gather import index_map
from kforge.agents.expert.plan.kernels import (
    GemmKernel,
    Operand,
    PointwiseKernel,
    Program,
    Store,
)
from kforge.agents.expert.plan.lower import Lowerer
from kforge.agents.expert.plan.regions import Regions, loop_vars, same_shape
from kforge.agents.expert.plan.rows import RowPlanner


class Planner(Regions):
    """The IR in topological order, each root a kernel grown around it (module docstring)."""

    def plan(self) -> Program:
        rows = RowPlanner(self)
        placeholders = []
        for node in self.g.nodes:
            if node.op in ("input", "param"):
                placeholders.append(self.new_buffer(node, node.op, node.attrs.name))  # type: ignore[attr-defined]
                self.done.add(id(node))
        for node in self.g.nodes:
            if id(node) in self.done:
                continue
            if node.op == "matmul":
                self.gemm(node)
            elif node.op == "reduce":
                rows.row(node)
            elif node.op == "pool":
                rows.pool(node)
            elif node.op == "scan":
                rows.scan(node)
            elif id(node) in self.needed and node not in self.buffers:
                self.pointwise([node])
        # the inputs' names before an output copy rebinds a returned input's node to its copy
        names = [self.program_buffers[self.buffers[n]].source for n in self.g.placeholders() if n.op == "input"]
        outputs = []
        for out in self.g.outputs:
            if self.program_buffers[self.buffers[out]].kind in ("input", "param"):
                self.pointwise([out], force_copy=True)  # never return an input (an alias)
            outputs.append(self.buffers[out])
        cap = self.g.captured
        return Program(self.program_buffers, self.kernels, names, outputs, self.g.returns_tuple,
                       dict(cap.sources), placeholders, dict(cap.hints), fixed_init=dict(cap.fixed_init),
                       init_sources=dict(cap.init_sources), derived=dict(cap.derived),
                       rewrites=list(self.g.rewrites), rewrite_notes=list(self.g.rewrite_notes),
                       refusals=list(self.refusals))

    # ------------------------------------------------------------------ pointwise
    def pointwise(self, nodes: list[Node], force_copy: bool = False) -> None:
        space = nodes[0].shape
        idx = loop_vars("p", space)
        low = Lowerer(dict(self.buffers) if not force_copy else {k: v for k, v in self.buffers.items() if k is not nodes[0]} | ({nodes[0]: self.buffers[nodes[0]]}))
        stores = []
        for node in nodes:
            value = low.value(node, idx)
            name = self.new_buffer(node)
            stores.append(Store(name, linear(idx, space), value))
            self.done.add(id(node))
        self.emit(PointwiseKernel, nodes[0], space, stores)

    # ------------------------------------------------------------------ GEMM
    def operand(self, mm: Node, node: Node, batched: bool) -> Operand:
        """(buffer, strides) of a matmul operand; materialised first when not a strided view."""
        idx = loop_vars("g", node.shape if batched else (1, *node.shape))
        sub = idx if batched else idx[1:]
        gather: E | None = None
        for attempt in range(2):
            why = "not a strided view of one buffer"
            try:
                e: E | None = Lowerer(self.buffers).value(node, sub)
            except NotFusable as err:
                e, why = None, str(err)
            if e is not None and e.op == "load":
                coeffs = affine(e.args[0], ["g0", "g1", "g2"])
                if coeffs is not None:
                    strides, offset = coeffs
                    return Operand(e.v, (strides["g0"], strides["g1"], strides["g2"]), offset, gather)
            if attempt == 0:
                gather = e if e is not None and index_map(e) else None
                self.refuse(mm, node, f"a matmul operand that is {why}: a pointwise prologue kernel stores it first"
                            + ("; an index map a backend may read inside the GEMM" if gather is not None else ""))
                self.pointwise([node])
        raise UnsupportedError(f"matmul operand {node.name} could not be laid out")  # pragma: no cover

    def gemm(self, mm: Node) -> None:
        a, b = mm.tensors
        batched = len(mm.shape) == 3
        opa = self.operand(mm, a, batched)
        opb = self.operand(mm, b, batched)
        region = {id(mm)}

        def place(node: Node) -> str | None:  # the epilogue: pointwise over the output, or a reshape / permute of it
            if node.op in ("view", "permute"):
                return None
            if node.op not in POINTWISE:
                return f"a {node.op} of the GEMM's output: a kernel of its own"
            if not sizes_equal(numel(node.shape), numel(mm.shape)):
                return f"{list(node.shape)} is not the GEMM's output shape {list(mm.shape)}"
            return None

        self.grow(mm, region, place)
        idx = loop_vars("e", mm.shape if batched else (1, *mm.shape))
        idx = idx if batched else idx[1:]
        expected = idx
        at = self.epilogue_index(mm, region, idx)

        def claim(node: Node, at: tuple[E, ...]) -> E | None:
            if node is mm:
                if at != expected:
                    raise NotFusable("matmul output at another index")
                return E("acc", v="acc", dt="f32")
            return None

        members = [n for n in self.g.nodes if id(n) in region and n is not mm]
        values = self.trial(mm, members, region, mm.shape, idx, claim, at)
        stores = self.store_region(members, values, region, mm.shape, idx, at)
        self.done.add(id(mm))
        if self.outside_users(mm, region):
            stores.insert(0, Store(self.new_buffer(mm), linear(idx, mm.shape), E("acc", v="acc", dt="f32")))
        batch = mm.shape[0] if batched else None
        m, n = mm.shape[-2], mm.shape[-1]
        kdim = a.shape[-1]
        self.emit(GemmKernel, mm, batch, m, n, kdim, opa, opb, stores)

    def epilogue_index(self, mm: Node, region: set[int], idx: tuple[E, ...]) -> dict[int, tuple[E, ...]]:
        """Where the GEMM's element ``idx`` lands in each epilogue node: through a reshape or a
        permute of the output (a conv's ``[N*L, CO]`` tile is ``[N, CO, *out]``), so the tail
        is computed and stored in the tile's own pass. A node whose operands from the region
        disagree (a broadcast, a transposed copy) leaves the region."""
        at: dict[int, tuple[E, ...]] = {id(mm): idx}
        for node in self.g.nodes:
            if id(node) not in region or node is mm:
                continue
            inside = [t for t in node.tensors if id(t) in at]
            if node.op == "view" and inside:
                at[id(node)] = reshape_index(at[id(inside[0])], inside[0].shape, node.shape)
            elif node.op == "permute" and inside:
                src = at[id(inside[0])]
                at[id(node)] = tuple(src[d] for d in node.attrs.dims)
            else:
                same = [at[id(t)] for t in inside if same_shape(t.shape, node.shape)]
                if same and all(s == same[0] for s in same) and len(same) == len(inside):
                    at[id(node)] = same[0]
                elif same_shape(node.shape, mm.shape) and not inside:
                    at[id(node)] = idx
                else:
                    region.discard(id(node))
                    self.refuse(mm, node, "its operands from the GEMM's tile sit at different indices")
        return at


def plan_graph(graph: Graph) -> Program:
    return Planner(graph).plan()


def plan_problem(problem_source: str) -> Program:
    """Capture, build the IR and plan: a problem's source -> its kernel program."""
    from kforge.agents.expert.capture.trace import capture_problem
    from kforge.agents.expert.ir.build import build_graph

    return plan_graph(build_graph(capture_problem(problem_source)))
