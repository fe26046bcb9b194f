"""Lower a traced ``torch.fx`` graph to the expert IR (:mod:`kforge.agents.expert.graph`).

Every module call, functional call and tensor method is normalised to one canonical name
(``_canonical``) with its tensor arguments and scalar attributes; the node walk then checks
the IR's shape: leaves -> at most one core op (reduction or GEMM) on leaves -> a pointwise
chain. Anything else raises :class:`UnsupportedError` naming the construct.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.passes.shape_prop import ShapeProp

from kforge.agents.expert.graph import (
    ElementwisePattern,
    GemmPattern,
    KernelGraph,
    Operand,
    PointwiseOp,
    RowReductionPattern,
    TensorInfo,
    UnsupportedError,
    broadcast_kind,
)


@dataclass(frozen=True)
class Sym:
    """A traced value: a leaf tensor, an op result, or the core result."""

    kind: str  # "input" | "param" | "value" | "core"
    name: str
    shape: tuple[int, ...]
    transposed: bool = False  # a 2-D leaf seen through .t()


Val = Sym | float

_FUNC: dict[Any, str] = {
    operator.add: "add", torch.add: "add", operator.sub: "sub", torch.sub: "sub",
    operator.mul: "mul", torch.mul: "mul", operator.truediv: "div", torch.div: "div",
    torch.true_divide: "div", operator.neg: "neg", torch.neg: "neg",
    torch.relu: "relu", F.relu: "relu", torch.sigmoid: "sigmoid", F.sigmoid: "sigmoid",
    torch.tanh: "tanh", F.tanh: "tanh", F.gelu: "gelu", F.silu: "silu", torch.exp: "exp",
    torch.log: "log", torch.abs: "abs", torch.clamp: "clamp", torch.clip: "clamp",
    torch.clamp_min: "clamp_min", torch.clamp_max: "clamp_max", F.hardtanh: "hardtanh",
    F.relu6: "relu6", F.leaky_relu: "leaky_relu", torch.pow: "pow", operator.pow: "pow",
    torch.sqrt: "sqrt", torch.rsqrt: "rsqrt", torch.square: "square",
    torch.maximum: "maximum", torch.minimum: "minimum",
    torch.softmax: "softmax", F.softmax: "softmax", torch.log_softmax: "log_softmax",
    F.log_softmax: "log_softmax", torch.sum: "sum", torch.mean: "mean", torch.amax: "amax",
    torch.max: "max", F.layer_norm: "layernorm", F.linear: "linear",
    torch.matmul: "matmul", torch.mm: "matmul", operator.matmul: "matmul",
    operator.getitem: "getitem", getattr: "getattr", torch.t: "t",
}
if hasattr(F, "rms_norm"):
    _FUNC[F.rms_norm] = "rmsnorm"

_METHODS = {
    "add": "add", "sub": "sub", "mul": "mul", "div": "div", "neg": "neg", "relu": "relu",
    "sigmoid": "sigmoid", "tanh": "tanh", "exp": "exp", "log": "log", "abs": "abs",
    "clamp": "clamp", "clip": "clamp", "clamp_min": "clamp_min", "clamp_max": "clamp_max",
    "pow": "pow", "sqrt": "sqrt", "rsqrt": "rsqrt", "square": "square",
    "softmax": "softmax", "log_softmax": "log_softmax", "sum": "sum", "mean": "mean",
    "amax": "amax", "max": "max", "matmul": "matmul", "mm": "matmul", "t": "t",
    "contiguous": "identity", "float": "identity",
}

_UNARY_SIMPLE = {"neg", "relu", "sigmoid", "tanh", "silu", "exp", "log", "abs", "sqrt",
                 "rsqrt", "square"}
_BINARY = {"add", "sub", "mul", "div", "maximum", "minimum"}


def _arg(node: torch.fx.Node, idx: int, name: str, default: Any = None) -> Any:
    if len(node.args) > idx:
        return node.args[idx]
    return node.kwargs.get(name, default)


def _qualname(node: torch.fx.Node) -> str:
    target = node.target
    return getattr(target, "__name__", None) or str(target)


class _Lowerer:
    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm
        self.env: dict[str, Val] = {}
        self.inputs: list[TensorInfo] = []
        self.params: dict[str, TensorInfo] = {}
        self.ops: list[tuple[str, str, list[Val], dict[str, float]]] = []  # out, op, args, attrs
        self.core: dict[str, Any] | None = None
        self.core_shape: tuple[int, ...] = ()
        self.output: Val | None = None
        self.output_shape: tuple[int, ...] = ()

    # ------------------------------------------------------------------ helpers
    def val(self, a: Any) -> Val:
        if isinstance(a, torch.fx.Node):
            return self.env[a.name]
        if isinstance(a, bool) or not isinstance(a, int | float):
            raise UnsupportedError(f"non-scalar constant argument {a!r}")
        return float(a)

    def tensor(self, a: Any, what: str) -> Sym:
        v = self.val(a)
        if not isinstance(v, Sym):
            raise UnsupportedError(f"{what} of a scalar")
        return v

    def leaf(self, a: Any, what: str) -> Sym:
        v = self.tensor(a, what)
        if v.kind not in ("input", "param"):
            raise UnsupportedError(f"{what} of a computed tensor (a prologue before the reduction/GEMM)")
        return v

    def add_param(self, name: str) -> Sym:
        t = self.gm.get_parameter(name) if name in dict(self.gm.named_parameters()) else self.gm.get_buffer(name)
        if t.dtype != torch.float32:
            raise UnsupportedError(f"parameter {name} of dtype {t.dtype}")
        info = TensorInfo(name=name, shape=list(t.shape), role="param")
        self.params[name] = info
        return Sym("param", name, tuple(t.shape))

    def pointwise(self, node: torch.fx.Node, op: str, args: list[Val], attrs: dict[str, float]) -> Sym:
        out = f"v{len(self.ops)}"
        self.ops.append((out, op, args, attrs))
        shape = tuple(node.meta["tensor_meta"].shape)
        return Sym("value", out, shape)

    def set_core(self, node: torch.fx.Node, core: dict[str, Any]) -> Sym:
        if self.core is not None:
            raise UnsupportedError("more than one reduction/GEMM in one problem")
        if self.ops:
            raise UnsupportedError("pointwise ops before a reduction/GEMM (prologue)")
        self.core = core
        self.core_shape = tuple(node.meta["tensor_meta"].shape)
        return Sym("core", "core", self.core_shape)

    # ------------------------------------------------------------------ node kinds
    def run(self) -> None:
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                meta = node.meta.get("tensor_meta")
                if meta is None:
                    raise UnsupportedError(f"non-tensor input {node.target}")
                if meta.dtype != torch.float32:
                    raise UnsupportedError(f"input {node.target} of dtype {meta.dtype}")
                self.inputs.append(TensorInfo(name=str(node.target), shape=list(meta.shape), role="input"))
                self.env[node.name] = Sym("input", str(node.target), tuple(meta.shape))
            elif node.op == "get_attr":
                self.env[node.name] = self.add_param(str(node.target))
            elif node.op == "output":
                result = node.args[0]
                if not isinstance(result, torch.fx.Node):
                    raise UnsupportedError("outputs other than one tensor (tuples, lists)")
                self.output = self.env[result.name]
                self.output_shape = tuple(result.meta["tensor_meta"].shape)
            else:
                self.env[node.name] = self.call(node)

    def call(self, node: torch.fx.Node) -> Val:
        if node.op == "call_module":
            return self.call_module(node)
        if node.op == "call_method":
            name = _METHODS.get(str(node.target))
            if name is None:
                raise UnsupportedError(f"tensor method .{node.target}()")
        else:
            name = _FUNC.get(node.target)
            if name is None:
                raise UnsupportedError(f"function {_qualname(node)}")
        return self.apply(node, name, list(node.args), dict(node.kwargs))

    def call_module(self, node: torch.fx.Node) -> Val:
        target = str(node.target)
        mod = self.gm.get_submodule(target)
        x = node.args[0] if node.args else None
        if isinstance(mod, nn.Linear):
            a = self.leaf(x, "nn.Linear")
            w = self.add_param(f"{target}.weight")
            b = self.add_param(f"{target}.bias") if mod.bias is not None else None
            return self.gemm(node, a, w, "nk", b, True)
        if isinstance(mod, nn.LayerNorm | nn.RMSNorm):
            is_ln = isinstance(mod, nn.LayerNorm)
            if len(mod.normalized_shape) != 1:
                raise UnsupportedError(f"{type(mod).__name__} over more than the last dimension")
            w = self.add_param(f"{target}.weight").name if mod.weight is not None else None
            b = None
            if is_ln and mod.bias is not None:
                b = self.add_param(f"{target}.bias").name
            eps = mod.eps if mod.eps is not None else torch.finfo(torch.float32).eps
            return self.reduction(node, "layernorm" if is_ln else "rmsnorm", x, -1, False, w, b, eps)
        if isinstance(mod, nn.Softmax | nn.LogSoftmax):
            op = "softmax" if isinstance(mod, nn.Softmax) else "log_softmax"
            return self.reduction(node, op, x, mod.dim, False)
        simple = {nn.ReLU: "relu", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh", nn.SiLU: "silu"}
        for cls, op in simple.items():
            if type(mod) is cls:
                return self.pointwise(node, op, [self.tensor(x, op)], {})
        if isinstance(mod, nn.GELU):
            op = "gelu_tanh" if mod.approximate == "tanh" else "gelu"
            return self.pointwise(node, op, [self.tensor(x, op)], {})
        if isinstance(mod, nn.LeakyReLU):
            return self.pointwise(node, "leaky_relu", [self.tensor(x, "leaky_relu")],
                                  {"negative_slope": float(mod.negative_slope)})
        if isinstance(mod, nn.Hardtanh):
            return self.pointwise(node, "clamp", [self.tensor(x, "clamp")],
                                  {"min": float(mod.min_val), "max": float(mod.max_val)})
        if isinstance(mod, nn.Identity) or (isinstance(mod, nn.Dropout) and mod.p == 0.0):
            return self.val(x)
        raise UnsupportedError(f"module {type(mod).__name__} ({target})")

    def apply(self, node: torch.fx.Node, name: str, args: list[Any], kw: dict[str, Any]) -> Val:
        if name == "identity":
            return self.val(args[0])
        if name == "t":
            v = self.leaf(args[0], ".t()")
            if len(v.shape) != 2:
                raise UnsupportedError(".t() of a tensor that is not 2-D")
            return Sym(v.kind, v.name, (v.shape[1], v.shape[0]), not v.transposed)
        if name in _BINARY:
            if kw.get("alpha", 1) != 1 or kw.get("rounding_mode") is not None:
                raise UnsupportedError(f"{name} with alpha/rounding_mode")
            a, b = self.val(_arg(node, 0, "input")), self.val(_arg(node, 1, "other"))
            return self.pointwise(node, name, [a, b], {})
        x = _arg(node, 0, "input")
        if name in _UNARY_SIMPLE:
            return self.pointwise(node, name, [self.tensor(x, name)], {})
        if name == "gelu":
            approx = kw.get("approximate", "none")
            return self.pointwise(node, "gelu_tanh" if approx == "tanh" else "gelu", [self.tensor(x, name)], {})
        if name in ("clamp", "clamp_min", "clamp_max", "hardtanh", "relu6"):
            return self.pointwise(node, "clamp", [self.tensor(x, name)], self.clamp_attrs(node, name))
        if name == "leaky_relu":
            slope = float(_arg(node, 1, "negative_slope", 0.01))
            return self.pointwise(node, name, [self.tensor(x, name)], {"negative_slope": slope})
        if name == "pow":
            exponent = _arg(node, 1, "exponent")
            if isinstance(exponent, torch.fx.Node) or not isinstance(x, torch.fx.Node):
                raise UnsupportedError("pow with a tensor exponent or a scalar base")
            return self.pointwise(node, "pow", [self.tensor(x, name)], {"exponent": float(exponent)})
        if name in ("softmax", "log_softmax"):
            if kw.get("dtype") is not None:
                raise UnsupportedError(f"{name} with a dtype")
            return self.reduction(node, name, x, _arg(node, 1, "dim"), False)
        if name in ("sum", "mean", "amax", "max"):
            return self.reduce_call(node, name, x)
        if name in ("getitem", "getattr"):
            src = self.env.get(x.name) if isinstance(x, torch.fx.Node) else None
            key = args[1]
            if isinstance(src, Sym) and src.kind == "core" and self.core and self.core.get("op") == "max" \
                    and self.core.get("tuple") and key in (0, "values"):
                self.core["tuple"] = False
                return Sym("core", "core", tuple(node.meta["tensor_meta"].shape))
            raise UnsupportedError(f"indexing/attribute access {key!r}")
        if name == "layernorm":
            shape = _arg(node, 1, "normalized_shape")
            if len(shape) != 1:
                raise UnsupportedError("layer_norm over more than the last dimension")
            w, b = _arg(node, 2, "weight"), _arg(node, 3, "bias")
            eps = float(_arg(node, 4, "eps", 1e-5))
            return self.reduction(node, "layernorm", x, -1, False, self.opt_leaf(w), self.opt_leaf(b), eps)
        if name == "rmsnorm":
            shape = _arg(node, 1, "normalized_shape")
            if len(shape) != 1:
                raise UnsupportedError("rms_norm over more than the last dimension")
            eps = _arg(node, 3, "eps")
            eps = torch.finfo(torch.float32).eps if eps is None else float(eps)
            return self.reduction(node, "rmsnorm", x, -1, False, self.opt_leaf(_arg(node, 2, "weight")), None, eps)
        if name == "linear":
            a = self.leaf(x, "linear")
            w = self.leaf(_arg(node, 1, "weight"), "linear weight")
            b_node = _arg(node, 2, "bias")
            b = self.leaf(b_node, "linear bias") if b_node is not None else None
            return self.gemm(node, a, w, "kn" if w.transposed else "nk", b, True)
        if name == "matmul":
            a = self.leaf(x, "matmul")
            b = self.leaf(_arg(node, 1, "other"), "matmul")
            return self.gemm(node, a, b, "nk" if b.transposed else "kn", None, False)
        raise UnsupportedError(f"operation {name}")

    def opt_leaf(self, a: Any) -> str | None:
        return None if a is None else self.leaf(a, "normalisation weight/bias").name

    def clamp_attrs(self, node: torch.fx.Node, name: str) -> dict[str, float]:
        if name == "relu6":
            return {"min": 0.0, "max": 6.0}
        if name == "hardtanh":
            return {"min": float(_arg(node, 1, "min_val", -1.0)), "max": float(_arg(node, 2, "max_val", 1.0))}
        lo = hi = None
        if name == "clamp":
            lo, hi = _arg(node, 1, "min"), _arg(node, 2, "max")
        elif name == "clamp_min":
            lo = _arg(node, 1, "min")
        else:
            hi = _arg(node, 1, "max")
        attrs: dict[str, float] = {}
        for key, v in (("min", lo), ("max", hi)):
            if isinstance(v, torch.fx.Node):
                raise UnsupportedError("clamp with tensor bounds")
            if v is not None:
                attrs[key] = float(v)
        return attrs

    # ------------------------------------------------------------------ cores
    def reduce_call(self, node: torch.fx.Node, name: str, x: Any) -> Val:
        dim = _arg(node, 1, "dim")
        if dim is None:
            raise UnsupportedError(f"{name} over all dimensions")
        keepdim = bool(_arg(node, 2, "keepdim", False))
        if node.kwargs.get("dtype") is not None:
            raise UnsupportedError(f"{name} with a dtype")
        return self.reduction(node, name, x, dim, keepdim)

    def reduction(self, node: torch.fx.Node, op: str, x: Any, dim: Any, keepdim: bool,
                  weight: str | None = None, bias: str | None = None, eps: float = 0.0) -> Sym:
        src = self.leaf(x, op)
        if src.kind != "input":
            raise UnsupportedError(f"{op} of a parameter")
        if isinstance(dim, list | tuple):
            if len(dim) != 1:
                raise UnsupportedError(f"{op} over several dimensions")
            dim = dim[0]
        ndim = len(src.shape)
        if dim is None or ndim == 0 or int(dim) not in (-1, ndim - 1):
            raise UnsupportedError(f"{op} over dim={dim} (only the last dimension)")
        cols = src.shape[-1]
        rows = math.prod(src.shape[:-1])
        core = {"op": op, "input": src.name, "rows": rows, "cols": cols, "weight": weight,
                "bias": bias, "eps": eps, "keepdim": keepdim, "tuple": op == "max"}
        return self.set_core(node, core)

    def gemm(self, node: torch.fx.Node, a: Sym, b: Sym, layout: str, bias: Sym | None,
             linear: bool) -> Sym:
        if a.kind != "input" or a.transposed:
            raise UnsupportedError("GEMM whose left operand is not a plain input")
        if len(b.shape) != 2 or len(a.shape) < 1:
            raise UnsupportedError("batched GEMM (right operand not 2-D)")
        k = a.shape[-1]
        n = b.shape[0] if linear else b.shape[1]  # b.shape is the logical (maybe .t()) shape
        if bias is not None and list(bias.shape) != [n]:
            raise UnsupportedError(f"GEMM bias of shape {list(bias.shape)}")
        core = {"op": "gemm", "a": a.name, "b": b.name, "b_role": b.kind, "b_layout": layout,
                "bias": bias.name if bias else None, "bias_role": bias.kind if bias else "param",
                "m": math.prod(a.shape[:-1]), "n": n, "k": k}
        return self.set_core(node, core)

    # ------------------------------------------------------------------ assembly
    def operand(self, v: Val) -> Operand:
        if isinstance(v, float):
            return Operand(kind="const", value=v)
        if v.kind == "value":
            return Operand(kind="value", name=v.name)
        if v.kind == "core":
            return Operand(kind="core")
        return Operand(kind=v.kind, name=v.name, broadcast=broadcast_kind(list(v.shape), list(self.output_shape)))

    def graph(self) -> KernelGraph:
        if self.output is None or not isinstance(self.output, Sym):
            raise UnsupportedError("the model returns no tensor")
        if self.core is not None and self.core.get("tuple"):
            raise UnsupportedError("torch.max returning (values, indices)")
        ops = [PointwiseOp(out=o, op=op, args=[self.operand(a) for a in args], attrs=attrs)
               for o, op, args, attrs in self.ops]
        result = self.operand(self.output)
        out_shape = list(self.output_shape)
        if self.core is None:
            if not ops:
                raise UnsupportedError("the model computes nothing (returns an input)")
            pattern: Any = ElementwisePattern(ops=ops, result=result)
        else:
            if broadcast_kind(list(self.core_shape), out_shape) != "full":
                raise UnsupportedError("an epilogue that broadcasts the reduction/GEMM result")
            core = dict(self.core)
            op = core.pop("op")
            core.pop("tuple", None)
            if op == "gemm":
                pattern = GemmPattern(epilogue=ops, result=result, **core)
            else:
                pattern = RowReductionPattern(op=op, epilogue=ops, result=result, **core)
        used = list(self.params.values())
        return KernelGraph(inputs=self.inputs, params=used, output_shape=out_shape, pattern=pattern)


def lower_module(model: nn.Module, example_inputs: list[Any]) -> KernelGraph:
    """Trace ``model`` (ideally on the meta device) and lower it to a :class:`KernelGraph`."""
    try:
        gm = torch.fx.symbolic_trace(model)
    except Exception as err:  # fx raises many kinds for untraceable Python
        raise UnsupportedError(f"torch.fx cannot trace Model: {type(err).__name__}: {err}") from None
    try:
        ShapeProp(gm).propagate(*example_inputs)
    except Exception as err:
        raise UnsupportedError(f"shape propagation failed: {type(err).__name__}: {err}") from None
    lowerer = _Lowerer(gm)
    lowerer.run()
    return lowerer.graph()


def load_problem_namespace(source: str) -> dict[str, Any]:
    """Execute a problem's source in a fresh namespace (:func:`.capture.load_namespace`)."""
    from kforge.agents.expert.capture.trace import load_namespace

    return load_namespace(source)


def lower_problem_source(source: str) -> KernelGraph:
    ns = load_problem_namespace(source)
    try:
        with torch.device("meta"):
            model = ns["Model"](*ns["get_init_inputs"]())
            inputs = list(ns["get_inputs"]())
    except Exception as err:
        raise UnsupportedError(f"building Model on the meta device failed: {type(err).__name__}: {err}") from None
    return lower_module(model, inputs)
