"""The planner's state and how a kernel's region grows: buffers, kernels in order, what is done,
consumers joined while their operands are ready, and every consumer left out recorded with the
reason (:class:`~.kernels.Refusal`) under the name of the kernel that refused it."""

from __future__ import annotations

from typing import Any

import sympy

from kforge.agents.expert.errors import NotFusable
from kforge.agents.expert.ir.graph import Graph, Node
from kforge.agents.expert.plan.expr import ZERO, E, linear, reshape_index, sizes_equal, var
from kforge.agents.expert.plan.kernels import Buffer, Kernel, Refusal, Store
from kforge.agents.expert.plan.lower import Claim, Lowerer


def loop_vars(prefix: str, shape: tuple[Any, ...]) -> tuple[E, ...]:
    """Loop variables over ``shape``; a size-1 dimension's index is the constant 0."""
    return tuple(ZERO if sympy.sympify(s) == 1 else var(f"{prefix}{i}", s) for i, s in enumerate(shape))


def same_shape(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(sizes_equal(x, y) for x, y in zip(a, b, strict=True))


class Regions:
    """The planner's state (buffers, kernels, what is done), region growth and the record of
    refused fusions; :class:`Planner` and :class:`~.rows.RowPlanner` build kernels with it."""

    def __init__(self, graph: Graph) -> None:
        self.g = graph
        self.buffers: dict[Node, str] = {}
        self.program_buffers: dict[str, Buffer] = {}
        self.kernels: list[Kernel] = []
        self.needed = {id(n) for n in graph.outputs} | {id(v) for _, v in graph.mutations}
        self.done: set[int] = set()  # nodes handled by some kernel (stored or fused away)
        self.refusals: list[Refusal] = []
        self._pending: list[tuple[Node, Node, str]] = []  # (root, node, reason) until the root's kernel exists

    # ------------------------------------------------------------------ buffers
    def new_buffer(self, node: Node, kind: str = "temp", source: str = "") -> str:
        for dst, value in self.g.mutations:  # a running-statistics update writes the buffer itself
            if value is node and dst in self.buffers and kind == "temp":
                self.buffers[node] = self.buffers[dst]
                return self.buffers[dst]
        name = f"buf{len(self.program_buffers)}" if kind == "temp" else (f"{kind}{len(self.program_buffers)}")
        self.program_buffers[name] = Buffer(name, node.shape, node.dtype, kind, source, node.storage)
        self.buffers[node] = name
        return name

    def outside_users(self, node: Node, region: set[int]) -> bool:
        return id(node) in self.needed or any(id(u) not in region for u in node.users)

    # ------------------------------------------------------------------ kernels and refusals
    def emit(self, make: Any, root: Node, *fields: Any) -> None:
        """Append ``make(<next kernel name>, *fields)``, the kernel of ``root``, and record the
        fusions its region refused under that name."""
        kernel = make(f"k{len(self.kernels)}", *fields)
        self.kernels.append(kernel)
        keep = []
        for r, node, reason in self._pending:
            if r is root:
                self.refusals.append(Refusal(kernel.name, node.name, node.op, reason))
            else:
                keep.append((r, node, reason))
        self._pending = keep

    def refuse(self, root: Node, node: Node, reason: str) -> None:
        if not any(r is root and n is node and why == reason for r, n, why in self._pending):
            self._pending.append((root, node, reason))

    def blocked(self, node: Node, region: set[int]) -> str | None:
        """Why ``node`` cannot join ``region`` yet: its first operand that is neither in the
        region nor computable from stored buffers alone (no claims); None when it can."""
        for t in node.tensors:
            if id(t) in region:
                continue
            try:
                Lowerer(self.buffers).value(t, loop_vars("t", t.shape))
            except NotFusable as err:
                return f"operand {t.name} ({t.op}) is not stored yet: {err}"
        return None

    def grow(self, root: Node, region: set[int], place: Any) -> list[Node]:
        """Consumers of the region joined until none is left; ``place(node)`` says whether a
        consumer whose operands are ready belongs in the kernel (None) or why not. The
        consumers left out are recorded as refusals of ``root``'s kernel."""
        joined: list[Node] = []
        refused: dict[int, tuple[Node, str]] = {}
        changed = True
        while changed:
            changed = False
            for node in self.g.nodes:
                if id(node) in region or id(node) in self.done or not any(id(t) in region for t in node.tensors):
                    continue
                why = place(node) or self.blocked(node, region)
                if why is not None:
                    refused[id(node)] = (node, why)
                    continue
                refused.pop(id(node), None)
                region.add(id(node))
                joined.append(node)
                changed = True
        for node, why in refused.values():
            self.refuse(root, node, why)
        return joined

    def trial(self, root: Node, nodes: list[Node], region: set[int], space: tuple[Any, ...],
              idx: tuple[E, ...], claim: Claim, at: dict[int, tuple[E, ...]] | None = None) -> dict[int, E]:
        """Each region node's value in the kernel (at ``at[id(node)]``, else the kernel's index
        reshaped to the node); one that needs a claim at another index leaves the region (so
        whatever it reads is stored for the kernel that computes it)."""
        values: dict[int, E] = {}
        for node in nodes:
            where = at.get(id(node)) if at is not None else None
            try:
                where = where if where is not None else reshape_index(idx, space, node.shape)
                values[id(node)] = Lowerer(dict(self.buffers), claim).value(node, where)
            except NotFusable as err:
                region.discard(id(node))
                self.refuse(root, node, str(err))
        return values

    def store_region(self, nodes: list[Node], values: dict[int, E], region: set[int],
                     space: tuple[Any, ...], idx: tuple[E, ...],
                     at: dict[int, tuple[E, ...]] | None = None) -> list[Store]:
        """Stores of the region nodes that something outside the region reads (each at its
        own index ``at[id(node)]`` in its own shape where given)."""
        stores: list[Store] = []
        for node in nodes:
            if id(node) not in values:
                continue
            self.done.add(id(node))
            if self.outside_users(node, region):
                name = self.new_buffer(node)
                where = at.get(id(node)) if at is not None else None
                index = linear(where, node.shape) if where is not None else linear(idx, space)
                stores.append(Store(name, index, values[id(node)]))
        return stores
