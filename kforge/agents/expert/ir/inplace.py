"""In-place ATen ops in a captured forward, seen as new values: updates of parameters and
buffers (BatchNorm's running statistics: ``Program.mutations``), and in-place ops on tensors
the forward computed, which replace the tensor for every later use unless a tensor sharing its
storage is read afterwards. Registered into :data:`~.handlers.HANDLERS` when :mod:`.build` loads."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch

from kforge.agents.expert.errors import UnsupportedError
from kforge.agents.expert.ir.graph import Node
from kforge.agents.expert.ir.handlers import HANDLERS, Handler, handles

if TYPE_CHECKING:
    from kforge.agents.expert.ir.build import Builder


@handles("copy_", "add_", "mul_", "copy")
def _inplace(b: Builder, fx: torch.fx.Node) -> Node:
    dst = b.tensor(fx.args[0])
    name = fx.target.overloadpacket.__name__
    if name == "copy":
        shape, dtype = b.meta(fx)
        src = b.tensor(fx.args[1])
        return src if src.dtype == dtype else b.add("cast", [src], shape, dtype)
    if dst.op != "param":
        if name in ("add_", "mul_"):
            return inplace_on_computed(b, fx, HANDLERS["add" if name == "add_" else "mul"])
        return inplace_on_computed(b, fx, _copied_value)  # copy_: what an in-place op decomposes into
    if name == "copy_":
        value = b.tensor(fx.args[1])
        if value.dtype != dst.dtype or value.shape != dst.shape:
            value = b.add("cast" if value.dtype != dst.dtype else "broadcast", [value], dst.shape, dst.dtype,
                          **({} if value.dtype != dst.dtype else {"bdims": list(range(len(dst.shape) - len(value.shape), len(dst.shape)))}))
    else:
        other = b.operand(fx.args[1], dst.dtype)
        value = b.add("add" if name == "add_" else "mul", [dst, other], dst.shape, dst.dtype)
    b.mutations = [(d, v) for d, v in b.mutations if d is not dst] + [(dst, value)]
    return value


def _copied_value(b: Builder, fx: Any) -> Node:
    """``dst.copy_(src)`` seen out of place: ``src`` cast and broadcast to ``dst``'s shape and
    dtype (the core ATen decompositions write ``hardtanh_(t)`` as ``t.copy_(clamp(t))``)."""
    dst, value = b.tensor(fx.args[0]), b.tensor(fx.args[1])
    if value.dtype != dst.dtype:
        value = b.add("cast", [value], value.shape, dst.dtype)
    if value.shape != dst.shape:
        value = b.add("broadcast", [value], dst.shape, dst.dtype,
                      bdims=list(range(len(dst.shape) - len(value.shape), len(dst.shape))))
    return value


# ATen ops whose result shares storage with an operand: an in-place update through one of
# them (or of a tensor one of them was taken from) changes another tensor too
VIEW_OPS = frozenset({"view", "_unsafe_view", "reshape", "slice", "select", "permute", "transpose", "t",
                      "expand", "unsqueeze", "squeeze", "as_strided", "alias", "diagonal", "narrow",
                      "unfold", "split", "split_with_sizes", "chunk", "unbind", "detach", "view_as",
                      "expand_as", "movedim", "swapaxes", "flatten", "unflatten", "_reshape_alias"})


class _OutOfPlace:
    """The in-place fx node seen as its out-of-place op (what the handlers read of a node)."""

    def __init__(self, fx: torch.fx.Node, base: str) -> None:
        self.args, self.kwargs, self.meta, self.name = fx.args, fx.kwargs, fx.meta, fx.name
        self.target = SimpleNamespace(overloadpacket=SimpleNamespace(__name__=base))


def _op_name(node: Any) -> str:
    packet = getattr(getattr(node, "target", None), "overloadpacket", None)
    return str(getattr(packet, "__name__", ""))


def _aliased_reader_after(dst: torch.fx.Node, update: torch.fx.Node) -> bool:
    """Does a tensor sharing ``dst``'s storage (its view chain's base and every view taken from
    that base, ``dst`` itself excepted) have a reader after ``update`` in the graph, or is
    the base a placeholder (an input or parameter)?"""
    base = dst
    while _op_name(base) in VIEW_OPS and base.args and isinstance(base.args[0], torch.fx.Node):
        base = base.args[0]
    if base.op == "placeholder":
        return True
    order = {n: i for i, n in enumerate(dst.graph.nodes)}
    after = order[update]
    group, todo = {base}, [base]
    while todo:
        for user in todo.pop().users:
            if _op_name(user) in VIEW_OPS and user not in group:
                group.add(user)
                todo.append(user)
    return any(order[user] > after for node in group if node is not dst  # views are in the group:
               for user in node.users if user is not update and user not in group)  # their readers count


def inplace_on_computed(b: Builder, fx: torch.fx.Node, handler: Handler) -> Node:
    """``relu_(t)``, ``t.add_(u)``... on a tensor the forward computed (not an input, not a
    parameter): the new value replaces ``t`` for every later use, as functionalisation would.
    Refused where ``t`` shares storage with another tensor (the tensor it is a view of, or
    another view of that) that is read after the update, since the update would show through
    that one too (:func:`_aliased_reader_after`); a view nobody reads afterwards (the unread
    ``alias`` that ``nn.ReLU(inplace=True)`` leaves in the trace, the GEMM result a conv output
    is a view of) is no such reader."""
    dst_fx = fx.args[0]
    dst = b.tensor(dst_fx)
    name = _op_name(fx)
    if dst.op in ("input", "param") or not isinstance(dst_fx, torch.fx.Node):
        raise UnsupportedError(f"in-place {name} on a forward input")
    if _aliased_reader_after(dst_fx, fx):
        raise UnsupportedError(f"in-place {name} on a computed tensor that shares storage")
    shape, dtype = b.meta(fx)
    if tuple(b.cap.size_expr(s) for s in shape) != dst.shape or dtype != dst.dtype:
        raise UnsupportedError(f"in-place {name} that changes its operand's shape or dtype")
    value = handler(b, _OutOfPlace(fx, name[:-1]))  # type: ignore[arg-type]
    b.env[dst_fx.name] = value  # later uses of t see the update
    return value
