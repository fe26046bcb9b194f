"""One handler per ATen / prims overload packet: fx node -> IR node(s) of the op table
(:mod:`.ops`), registered in :data:`~.handlers.HANDLERS`. The ops that are one ATen op each are
registered from the table's ``aten`` column; the rest (attributes to read, composites, views,
reductions, pools) have a handler of their own here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sympy
import torch

from kforge.agents.expert.errors import UnsupportedError
from kforge.agents.expert.ir.graph import Node, Scalar, dtype_of, numel, static_int
from kforge.agents.expert.ir.handlers import HANDLERS, Handler, handles
from kforge.agents.expert.ir.handlers import arg as _arg
from kforge.agents.expert.ir.ops import OPS

if TYPE_CHECKING:
    from kforge.agents.expert.ir.build import Builder


def _norm_dims(dims: Any, rank: int) -> list[int]:
    """Reduction dims as sorted non-negative indices (None or ``[]``: every dim)."""
    if dims is None or (isinstance(dims, list | tuple) and len(dims) == 0):
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % rank if rank else 0 for d in dims})


def _pointwise(op: str, nargs: int) -> Handler:
    def handler(b: Builder, fx: torch.fx.Node) -> Node:
        shape, dtype = b.meta(fx)
        args = [b.operand(_arg(fx, i, ""), dtype) for i in range(nargs)]
        if not any(isinstance(a, Node) for a in args):
            raise UnsupportedError(f"{fx.target} of numbers only")  # pragma: no cover - traced as Python
        return b.add(op, args, shape, dtype)
    return handler


for _op in OPS.values():  # the ATen ops that are one op of the table
    for _packet in _op.aten:
        HANDLERS[_packet] = _pointwise(_op.name, _op.arity or 0)


@handles("add", "sub")
def _add_sub(b: Builder, fx: torch.fx.Node) -> Node:
    shape, dtype = b.meta(fx)
    x, y = b.operand(fx.args[0], dtype), b.operand(fx.args[1], dtype)
    alpha = fx.kwargs.get("alpha", 1)
    if alpha != 1:
        y = b.add("mul", [y, Scalar(alpha, dtype)], shape, dtype) if isinstance(y, Node) else Scalar(y.value * alpha, dtype)
    return b.add(str(fx.target.overloadpacket.__name__), [x, y], shape, dtype)


@handles("div")
def _div(b: Builder, fx: torch.fx.Node) -> Node:
    shape, dtype = b.meta(fx)
    mode = fx.kwargs.get("rounding_mode")
    op = {None: "div", "floor": "floordiv", "trunc": "truncdiv"}[mode]
    return b.add(op, [b.operand(fx.args[0], dtype), b.operand(fx.args[1], dtype)], shape, dtype)


@handles("gelu")
def _gelu(b: Builder, fx: torch.fx.Node) -> Node:
    shape, dtype = b.meta(fx)
    return b.add("gelu", [b.tensor(fx.args[0])], shape, dtype, approximate=fx.kwargs.get("approximate", "none"))


@handles("leaky_relu")
def _leaky(b: Builder, fx: torch.fx.Node) -> Node:
    shape, dtype = b.meta(fx)
    return b.add("leaky_relu", [b.tensor(fx.args[0])], shape, dtype, slope=float(_arg(fx, 1, "negative_slope", 0.01)))


@handles("elu")
def _elu(b: Builder, fx: torch.fx.Node) -> Node:
    shape, dtype = b.meta(fx)
    return b.add("elu", [b.tensor(fx.args[0])], shape, dtype, alpha=float(_arg(fx, 1, "alpha", 1.0)),
                 scale=float(_arg(fx, 2, "scale", 1.0)), input_scale=float(_arg(fx, 3, "input_scale", 1.0)))


@handles("hardtanh", "clamp", "clamp_min", "clamp_max")
def _clamp(b: Builder, fx: torch.fx.Node) -> Node:
    shape, dtype = b.meta(fx)
    name = fx.target.overloadpacket.__name__
    if name == "hardtanh":
        lo, hi = _arg(fx, 1, "min_val", -1.0), _arg(fx, 2, "max_val", 1.0)
    elif name == "clamp_min":
        lo, hi = _arg(fx, 1, "min"), None
    elif name == "clamp_max":
        lo, hi = None, _arg(fx, 1, "max")
    else:
        lo, hi = _arg(fx, 1, "min"), _arg(fx, 2, "max")
    x: Node | Scalar = b.tensor(fx.args[0])
    for bound, op in ((lo, "maximum"), (hi, "minimum")):
        if isinstance(bound, torch.fx.Node):
            x = b.add(op, [x, b.operand(bound, dtype)], shape, dtype)
        elif bound is not None:
            x = b.add("clamp", [x], shape, dtype, **({"min": float(bound)} if op == "maximum" else {"max": float(bound)}))
    return x  # type: ignore[return-value]


@handles("_to_copy", "to", "prims.convert_element_type")
def _cast(b: Builder, fx: torch.fx.Node) -> Node:
    shape, dtype = b.meta(fx)
    x = b.tensor(fx.args[0])
    return x if x.dtype == dtype else b.add("cast", [x], shape, dtype)


@handles("alias", "clone", "detach", "lift_fresh_copy", "contiguous", "alias_copy", "view_copy_identity")
def _identity(b: Builder, fx: torch.fx.Node) -> Node:
    return b.tensor(fx.args[0])


@handles("view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "flatten", "view_copy", "unflatten")
def _view(b: Builder, fx: torch.fx.Node) -> Node:
    shape, dtype = b.meta(fx)
    x = b.tensor(fx.args[0])
    if tuple(b.cap.size_expr(s) for s in shape) == x.shape:
        return x
    return b.add("view", [x], shape, dtype)


@handles("repeat")
def _repeat(b: Builder, fx: torch.fx.Node) -> Node:
    """``x.repeat(r0, r1, ...)`` as index maps, no copy: x viewed as ``[1, s0, 1, s1, ...]``
    (leading ones where the repeats outnumber x's dims), broadcast to ``[r0, s0, r1, s1, ...]``,
    viewed as ``[r0 * s0, r1 * s1, ...]``: element i of a dim reads ``i % s``."""
    shape, dtype = b.meta(fx)
    x = b.tensor(fx.args[0])
    reps = [b.cap.size_expr(r) for r in fx.args[1]]
    sizes = [sympy.Integer(1)] * (len(reps) - len(x.shape)) + list(x.shape)
    split = [v for s in sizes for v in (sympy.Integer(1), s)]
    tiled = [v for r, s in zip(reps, sizes, strict=True) for v in (r, s)]
    view = b.add("view", [x], split, dtype)
    wide = b.add("broadcast", [view], tiled, dtype, bdims=list(range(len(tiled))))
    return b.add("view", [wide], shape, dtype)


@handles("permute", "t", "transpose", "permute_copy")
def _permute(b: Builder, fx: torch.fx.Node) -> Node:
    shape, dtype = b.meta(fx)
    x = b.tensor(fx.args[0])
    name = fx.target.overloadpacket.__name__
    rank = len(x.shape)
    if name.startswith("permute"):
        dims = [d % rank for d in fx.args[1]]
    else:
        d0, d1 = (0, 1) if name == "t" else (fx.args[1] % rank, fx.args[2] % rank)
        dims = list(range(rank))
        dims[d0], dims[d1] = dims[d1], dims[d0]
    if dims == list(range(rank)):
        return x
    return b.add("permute", [x], shape, dtype, dims=dims)


@handles("expand", "prims.broadcast_in_dim", "expand_copy")
def _broadcast(b: Builder, fx: torch.fx.Node) -> Node:
    shape, dtype = b.meta(fx)
    x = b.tensor(fx.args[0])
    if "broadcast_in_dim" in str(fx.target):
        bdims = list(fx.args[2])
    else:
        bdims = list(range(len(shape) - len(x.shape), len(shape)))
    out = tuple(b.cap.size_expr(s) for s in shape)
    if out == x.shape:
        return x
    return b.add("broadcast", [x], shape, dtype, bdims=bdims)


@handles("split_with_sizes", "split")
def _split(b: Builder, fx: torch.fx.Node) -> list[Node]:
    """The pieces as slices (a list that ``getitem`` indexes)."""
    x = b.tensor(fx.args[0])
    vals = fx.meta.get("val")
    if not isinstance(vals, list | tuple) or not all(isinstance(v, torch.Tensor) for v in vals):
        raise UnsupportedError(f"{fx.target} without tensor pieces")
    dim = _arg(fx, 2, "dim", 0) % len(x.shape)
    pieces, start = [], sympy.Integer(0)
    for v in vals:
        shape = tuple(b.cap.size_expr(s) for s in v.shape)
        pieces.append(x if shape == x.shape else
                      b.add("slice", [x], shape, dtype_of(v.dtype), dim=dim, start=start, step=1))
        start = start + shape[dim]
    return pieces


@handles("slice")
def _slice(b: Builder, fx: torch.fx.Node) -> Node:
    shape, dtype = b.meta(fx)
    x = b.tensor(fx.args[0])
    dim = _arg(fx, 1, "dim", 0) % len(x.shape)
    start = _arg(fx, 2, "start", 0) or 0
    step = _arg(fx, 4, "step", 1) or 1
    start_e = b.cap.size_expr(b.operand(start).value if isinstance(start, torch.fx.Node) else start)
    if start_e.is_number and int(start_e) < 0:
        start_e = x.shape[dim] + start_e
    out = tuple(b.cap.size_expr(s) for s in shape)
    if out == x.shape:
        return x
    return b.add("slice", [x], shape, dtype, dim=dim, start=sympy.Max(0, start_e) if not start_e.is_number else start_e,
                 step=static_int(step, "slice step"))


@handles("select")
def _select(b: Builder, fx: torch.fx.Node) -> Node:
    shape, dtype = b.meta(fx)
    x = b.tensor(fx.args[0])
    dim = fx.args[1] % len(x.shape)
    index = b.cap.size_expr(fx.args[2])
    if index.is_number and int(index) < 0:
        index = x.shape[dim] + index
    return b.add("select", [x], shape, dtype, dim=dim, index=index)


@handles("flip")
def _flip(b: Builder, fx: torch.fx.Node) -> Node:
    shape, dtype = b.meta(fx)
    x = b.tensor(fx.args[0])
    return b.add("flip", [x], shape, dtype, dims=_norm_dims(list(fx.args[1]), len(x.shape)))


@handles("unfold")
def _unfold(b: Builder, fx: torch.fx.Node) -> Node:
    """``x.unfold(dim, size, step)``: windows of ``dim`` as a new last dim (a convolution's im2col)."""
    shape, dtype = b.meta(fx)
    x = b.tensor(fx.args[0])
    return b.add("unfold", [x], shape, dtype, dim=fx.args[1] % len(x.shape), size=static_int(fx.args[2], "unfold size"),
                 step=static_int(fx.args[3], "unfold step"))


@handles("cat")
def _cat(b: Builder, fx: torch.fx.Node) -> Node:
    shape, dtype = b.meta(fx)
    parts = [b.tensor(t) for t in fx.args[0]]
    dim = _arg(fx, 1, "dim", 0) % len(shape)
    parts = [p for p in parts if not (p.shape[dim].is_number and int(p.shape[dim]) == 0)]
    if len(parts) == 1:
        return parts[0]
    return b.add("cat", parts, shape, dtype, dim=dim)


@handles("constant_pad_nd")
def _pad(b: Builder, fx: torch.fx.Node) -> Node:
    shape, dtype = b.meta(fx)
    pads = [static_int(p, "padding") for p in fx.args[1]]
    if any(p < 0 for p in pads):
        raise UnsupportedError("negative padding")
    return b.add("pad", [b.tensor(fx.args[0])], shape, dtype, pads=pads, value=float(_arg(fx, 2, "value", 0.0)))


@handles("gather")
def _gather(b: Builder, fx: torch.fx.Node) -> Node:
    shape, dtype = b.meta(fx)
    x, index = b.tensor(fx.args[0]), b.tensor(fx.args[2])
    return b.add("gather", [x, index], shape, dtype, dim=fx.args[1] % len(x.shape))


@handles("embedding")
def _embedding(b: Builder, fx: torch.fx.Node) -> Node:
    """``weight[indices]``: each index's row, as a gather of the rows (indices flattened to N,
    broadcast over the row's D columns) viewed back to ``indices.shape + [D]``."""
    shape, dtype = b.meta(fx)
    weight, indices = b.tensor(fx.args[0]), b.tensor(fx.args[1])
    if len(weight.shape) != 2:
        raise UnsupportedError("embedding of a weight that is not 2-D")
    n, d = numel(indices.shape), weight.shape[1]
    flat = b.add("view", [indices], (n, 1), indices.dtype)
    wide = b.add("broadcast", [flat], (n, d), indices.dtype, bdims=[0, 1])
    rows = b.add("gather", [weight, wide], (n, d), dtype, dim=0)
    return b.add("view", [rows], shape, dtype)


@handles("full", "scalar_tensor", "full_like", "zeros_like", "ones_like", "zeros", "ones")
def _full(b: Builder, fx: torch.fx.Node) -> Node:
    shape, dtype = b.meta(fx)
    name = fx.target.overloadpacket.__name__
    value = {"zeros_like": 0, "ones_like": 1, "zeros": 0, "ones": 1}.get(name)
    if value is None:
        value = fx.args[0] if name == "scalar_tensor" else fx.args[1]
    if isinstance(value, torch.fx.Node):
        value = b.operand(value).value
    return b.add("const", [], shape, dtype, value=value)


@handles("empty", "empty_like", "empty_permuted", "empty_strided")
def _empty(b: Builder, fx: torch.fx.Node) -> Node:
    """Uninitialised memory: fine while nothing reads it (BatchNorm's unused saved stats)."""
    return b.add("unsupported", [], fx.meta["val"].shape, "f32", reason=f"reads uninitialised memory ({fx.target})")


@handles("arange")
def _arange(b: Builder, fx: torch.fx.Node) -> Node:
    shape, dtype = b.meta(fx)
    args = list(fx.args)
    start, step = (args[0], args[2] if len(args) > 2 else 1) if len(args) > 1 else (0, 1)
    return b.add("iota", [], shape, dtype, start=b.cap.size_expr(start), step=b.cap.size_expr(step))


# ------------------------------------------------------------------ reductions and scans

@handles("sum", "prims.sum", "amax", "amin", "prod", "any", "all", "prims.amax", "prims.amin", "prims.prod")
def _reduce(b: Builder, fx: torch.fx.Node) -> Node:
    shape, dtype = b.meta(fx)
    x = b.tensor(fx.args[0])
    name = fx.target.overloadpacket.__name__
    kind = {"amax": "max", "amin": "min"}.get(name, name)
    dims = _norm_dims(_arg(fx, 1, "dim"), len(x.shape))
    keepdim = bool(_arg(fx, 2, "keepdim", False)) if "prims" not in str(fx.target) else False
    if not x.shape:
        return x
    if dtype != x.dtype and kind in ("sum", "prod"):
        x = b.add("cast", [x], x.shape, dtype)
    return b.reduce(x, kind, dims, keepdim, dtype)


@handles("mean")
def _mean(b: Builder, fx: torch.fx.Node) -> Node:
    x = b.tensor(fx.args[0])
    return b.mean(x, _norm_dims(_arg(fx, 1, "dim"), len(x.shape)), bool(_arg(fx, 2, "keepdim", False)))


@handles("prims.var", "var")
def _var(b: Builder, fx: torch.fx.Node) -> Node:
    x = b.tensor(fx.args[0])
    dims = _norm_dims(_arg(fx, 1, "dim"), len(x.shape))
    if "prims" in str(fx.target):
        return b.var(x, dims, float(_arg(fx, 2, "correction", 1.0)), False)
    correction = fx.kwargs.get("correction", 1)
    return b.var(x, dims, float(1 if correction is None else correction), bool(fx.kwargs.get("keepdim", False)))


@handles("max", "min")
def _max_min(b: Builder, fx: torch.fx.Node) -> Any:
    x = b.tensor(fx.args[0])
    name = fx.target.overloadpacket.__name__
    if len(fx.args) > 1 and isinstance(fx.args[1], torch.fx.Node):  # elementwise max(a, b)
        shape, dtype = b.meta(fx)
        return b.add("maximum" if name == "max" else "minimum", [x, b.tensor(fx.args[1])], shape, dtype)
    if len(fx.args) == 1 and "dim" not in fx.kwargs:
        return b.reduce(x, name, list(range(len(x.shape))), False)
    dims = _norm_dims(_arg(fx, 1, "dim"), len(x.shape))
    keepdim = bool(_arg(fx, 2, "keepdim", False))
    return (b.reduce(x, name, dims, keepdim), b.reduce(x, f"arg{name}", dims, keepdim))


@handles("argmax", "argmin")
def _argmax(b: Builder, fx: torch.fx.Node) -> Node:
    x = b.tensor(fx.args[0])
    dim = _arg(fx, 1, "dim")
    keepdim = bool(_arg(fx, 2, "keepdim", False))
    name = fx.target.overloadpacket.__name__
    if dim is None:
        flat = b.add("view", [x], (sympy.Mul(*x.shape),), x.dtype) if len(x.shape) != 1 else x
        r = b.reduce(flat, name, [0], False)
        if keepdim:
            return b.add("view", [r], (1,) * len(x.shape), r.dtype)
        return r
    return b.reduce(x, name, _norm_dims(dim, len(x.shape)), keepdim)


@handles("cumsum", "cumprod")
def _scan(b: Builder, fx: torch.fx.Node) -> Node:
    shape, dtype = b.meta(fx)
    x = b.tensor(fx.args[0])
    if x.dtype != dtype:
        x = b.add("cast", [x], x.shape, dtype)
    kind = "sum" if fx.target.overloadpacket.__name__ == "cumsum" else "prod"
    return b.add("scan", [x], shape, dtype, kind=kind, dim=fx.args[1] % max(1, len(shape)))


# ------------------------------------------------------------------ matmul and pooling

@handles("mm", "bmm")
def _mm(b: Builder, fx: torch.fx.Node) -> Node:
    shape, dtype = b.meta(fx)
    x, y = b.tensor(fx.args[0]), b.tensor(fx.args[1])
    if dtype != "f32":
        raise UnsupportedError(f"matmul in {dtype}")
    return b.add("matmul", [x, y], shape, dtype)


def _triple(value: Any, nd: int, default: int) -> list[int]:
    if value is None or (isinstance(value, list | tuple) and len(value) == 0):
        return [default] * nd
    if isinstance(value, int):
        return [value] * nd
    values = [static_int(v, "pooling size") for v in value]
    return values * nd if len(values) == 1 else values


@handles("max_pool2d_with_indices", "max_pool3d_with_indices", "max_pool1d_with_indices",
         "avg_pool2d", "avg_pool3d")
def _pool(b: Builder, fx: torch.fx.Node) -> Any:
    shape, dtype = b.meta(fx) if isinstance(fx.meta.get("val"), torch.Tensor) else (fx.meta["val"][0].shape, "f32")
    x = b.tensor(fx.args[0])
    name = fx.target.overloadpacket.__name__
    nd = int(name[name.index("pool") + 4])
    kernel = _triple(_arg(fx, 1, "kernel_size"), nd, 1)
    stride = _triple(_arg(fx, 2, "stride"), nd, 0)
    stride = [s or k for s, k in zip(stride, kernel, strict=True)]
    padding = _triple(_arg(fx, 3, "padding"), nd, 0)
    if name.startswith("max"):
        dilation = _triple(_arg(fx, 4, "dilation"), nd, 1)
        ceil_mode = bool(_arg(fx, 5, "ceil_mode", False))
        node = b.add("pool", [x], shape, x.dtype, kind="max", nd=nd, kernel=kernel, stride=stride,
                     padding=padding, dilation=dilation, ceil_mode=ceil_mode, count_include_pad=True,
                     divisor=None)
        indices = b.add("unsupported", [], fx.meta["val"][1].shape, "i64", reason="max-pool indices")
        return (node, indices)
    ceil_mode = bool(_arg(fx, 4, "ceil_mode", False))
    include = bool(_arg(fx, 5, "count_include_pad", True))
    divisor = _arg(fx, 6, "divisor_override")
    return b.add("pool", [x], shape, x.dtype, kind="avg", nd=nd, kernel=kernel, stride=stride,
                 padding=padding, dilation=[1] * nd, ceil_mode=ceil_mode, count_include_pad=include,
                 divisor=divisor)

