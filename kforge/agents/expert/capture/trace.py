"""Capture a problem's ``Model`` as an ATen graph with PyTorch's own machinery.

The problem source runs in a fresh namespace; ``Model(*get_init_inputs())`` and the inputs
are built on the ``meta`` device (nothing is allocated, whatever the sizes), then
``make_fx`` traces ``functional_call(model, state, inputs)`` under a fake-tensor mode whose
every dimension is *symbolic* (no duck sizing: two sizes that happen to be equal stay two
symbols unless the model forces them equal). The decomposition table is core ATen plus the
composite ops whose decompositions are plain arithmetic (norms, softmax, logsumexp, mish,
var, addmm), so ``nn.GroupNorm``, ``BatchNorm1d`` in training mode, ``F.mish`` and friends
arrive as a small set of primitive ops instead of one hand-written lowering per module.

The model is traced in the mode its constructor leaves it in (KernelBench never calls
``eval()``): BatchNorm in training mode normalises with batch statistics and writes its
running buffers, which appear in the graph as in-place updates of parameter placeholders.
A reference that draws random numbers (Dropout with p > 0 in training mode) is refused with
:class:`NondeterministicReference`: no kernel can be asked to match random numbers.

Integer init inputs are size symbols passed to the trace as arguments of their own, so a
forward that uses one as a number (InstanceNorm's feature check, GroupNorm's group count,
``x * self.k``) keeps it symbolic: ``ModelNew`` reads it back from its own constructor
arguments (``init_sources``). Two ATen ops would still specialise what they are given
(``group_norm``'s ``int num_groups`` and ``max_pool1d``'s C++ shape arithmetic over the input
length): :class:`~.sizes.GenericSizes` routes them, during the trace only, to the same math over
symbolic sizes (a GroupNorm over a ``[N, G, -1]`` view; a 1-d max pool as the 2-d pool over an
unsqueezed row, whose Python meta keeps the pooled length a floor-division of the input
length). An init symbol that the trace still pins to its value (a pooling window handed to an
``int[]`` argument) is recorded in ``fixed_init``: ``ModelNew`` refuses other values.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from kforge.agents.expert.capture.sizes import GenericSizes
from kforge.agents.expert.errors import NondeterministicReference, UnsupportedError

RANDOM_OPS = ("bernoulli", "rand", "randn", "randint", "native_dropout", "uniform", "normal",
              "exponential", "multinomial", "randperm", "rrelu")


InitKey = int | tuple[int, int]  # an init input, or one element of a tuple init input


@dataclass
class Placeholder:
    """One traced argument: a state_dict entry (``param``) or a forward() argument (``input``)."""

    name: str
    role: str  # "param" | "input"
    is_buffer: bool
    dtype: torch.dtype
    shape_hint: tuple[int, ...]
    scalar: bool = False  # a Python number in get_inputs(), passed to the kernels as a 0-d tensor


@dataclass
class Captured:
    gm: torch.fx.GraphModule
    placeholders: list[Placeholder]
    hints: dict[sympy.Symbol, int]  # each size symbol's value at the traced sizes
    env: Any  # the ShapeEnv: ``size_expr`` applies its replacements (guards like s1 == s2)
    # symbol -> (placeholder index, dim, c) where a dim is c * symbol: how ModelNew reads it back
    sources: dict[sympy.Symbol, tuple[int, int, int]] = field(default_factory=dict)
    unsourced: dict[sympy.Symbol, int] = field(default_factory=dict)
    # init inputs the trace had to take as plain numbers (index -> value): the kernels are only
    # right for these values, so ModelNew refuses others with a clear error
    fixed_init: dict[int, Any] = field(default_factory=dict)
    # symbol -> init input index: a size only the constructor's arguments carry (num_groups)
    init_sources: dict[sympy.Symbol, InitKey] = field(default_factory=dict)
    # a size the trace proved divisible (GroupNorm's channels by groups): a -> b * q, and the
    # quotient q -> (a, b), read as ``a // b``; so ``b * (a // b)`` simplifies back to ``a``
    divisions: dict[sympy.Symbol, sympy.Expr] = field(default_factory=dict)
    derived: dict[sympy.Symbol, tuple[sympy.Symbol, sympy.Symbol]] = field(default_factory=dict)

    def size_expr(self, size: Any) -> sympy.Expr:
        """A traced size (int, SymInt, SymFloat) as a sympy expression over canonical symbols
        (a symbol no tensor shape carries, such as an init-only integer, at its value)."""
        if isinstance(size, torch.SymInt | torch.SymFloat | torch.SymBool):
            expr = sympy.sympify(self.env.simplify(size.node.expr))
            expr = expr.subs(self.unsourced) if self.unsourced else expr
            return expr.xreplace(self.divisions) if self.divisions else expr
        return sympy.sympify(size)

    @property
    def inputs(self) -> list[Placeholder]:
        return [p for p in self.placeholders if p.role == "input"]

    @property
    def params(self) -> list[Placeholder]:
        return [p for p in self.placeholders if p.role == "param"]


def decomposition_table() -> dict[Any, Any]:
    from torch._decomp import core_aten_decompositions, get_decompositions

    aten = torch.ops.aten
    table = dict(core_aten_decompositions())
    table.update(get_decompositions([
        aten.native_layer_norm, aten.native_group_norm, aten.native_batch_norm,
        aten._native_batch_norm_legit_functional, aten._native_batch_norm_legit,
        aten._native_batch_norm_legit_no_training, aten.var_mean, aten.var, aten.std,
        aten._softmax, aten._log_softmax, aten.logsumexp, aten.mish, aten.addmm,
        aten.linalg_vector_norm, aten.norm, aten.softplus, aten.hardswish, aten.hardsigmoid,
        aten.silu, aten.native_dropout, aten.smooth_l1_loss, aten.huber_loss, aten.mse_loss,
        aten.nll_loss_forward, aten.binary_cross_entropy, aten.avg_pool1d,
        aten.adaptive_avg_pool1d, aten.adaptive_avg_pool2d, aten._adaptive_avg_pool2d,
        aten.frobenius_norm, aten.kl_div,
    ]))
    for op in (aten.max_pool2d_with_indices, aten.max_pool3d_with_indices, aten.avg_pool2d,
               aten.avg_pool3d, aten.gelu, aten.hardtanh, aten.leaky_relu, aten.elu):
        for overload in list(table):
            if getattr(overload, "overloadpacket", None) is op:
                del table[overload]
    return table


def load_namespace(source: str) -> dict[str, Any]:
    """Execute a problem's source in a fresh namespace (trusted reference code)."""
    namespace: dict[str, Any] = {"__name__": "kforge_expert_problem"}
    try:
        exec(compile(source, "<problem>", "exec"), namespace)
    except Exception as err:
        raise UnsupportedError(f"the problem source does not run: {type(err).__name__}: {err}") from None
    for needed in ("Model", "get_inputs", "get_init_inputs"):
        if needed not in namespace:
            raise UnsupportedError(f"the problem defines no {needed}")
    return namespace


def forward_arg_names(model_cls: type, count: int) -> list[str]:
    """forward()'s argument names (``x0, x1, ...`` for ``*args`` or clashes)."""
    try:
        params = list(inspect.signature(model_cls.forward).parameters.values())[1:]
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(names) < count or len(set(names)) != len(names) or any(n == "self" for n in names):
        return [f"x{i}" for i in range(count)]
    return [n if n.isidentifier() else f"x{i}" for i, n in enumerate(names[:count])]


def _size_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 2


def _build_symbolic(model_cls: type, init_inputs: list[Any], env: Any, mode: Any, concrete: set[int],
                    symints: dict[InitKey, Any]) -> Any:
    """``Model`` built under the fake mode with every integer init input a size symbol, so
    sizes that come from the constructor (``nn.LayerNorm(dim)``, ``num_groups``) stay
    symbolic (``symints``: init index -> the SymInt it was given); ``None`` when the
    constructor cannot take symbolic ints."""
    import numbers

    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    def symbolic(value: int, key: InitKey) -> Any:
        # nn.LayerNorm and friends test ``isinstance(n, numbers.Integral)``: a SymInt is
        # one (registered once, in a process that builds a model with symbolic ints only)
        numbers.Integral.register(torch.SymInt)
        name = f"init{key}" if isinstance(key, int) else f"init{key[0]}_{key[1]}"
        sym = env.create_symbol(value, ConstantSource(name), dynamic_dim=DimDynamic.DYNAMIC)
        symints[key] = env.create_symintnode(sym, hint=value)
        return symints[key]

    args: list[Any] = []
    for i, value in enumerate(init_inputs):
        if i in concrete:
            args.append(value)
        elif _size_int(value):
            args.append(symbolic(value, i))
        elif isinstance(value, tuple) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            # a shape tuple (KernelBench's ``bias_shape = (out_channels, 1, 1)``): each size
            # its own symbol, so a broadcast against a computed size unifies the two
            args.append(tuple(symbolic(v, (i, j)) if _size_int(v) else v for j, v in enumerate(value)))
        else:
            args.append(value)
    # Initialisers compute with the sizes (kaiming's fan-in under a sqrt) and would bake them
    # in; the values do not matter here (only shapes are traced), so they are skipped.
    init = torch.nn.init
    saved = {name: fn for name, fn in vars(init).items() if name.endswith("_") and callable(fn)
             and not name.startswith("_")}
    saved["_calculate_fan_in_and_fan_out"] = init._calculate_fan_in_and_fan_out
    try:
        for name in saved:
            setattr(init, name, lambda tensor, *a, **k: tensor)
        init._calculate_fan_in_and_fan_out = lambda tensor: (1, 1)  # type: ignore[assignment]
        with torch.device("meta"), mode:
            return model_cls(*args)
    except Exception:  # noqa: BLE001 - any constructor error means: build it concretely
        return None
    finally:
        for name, fn in saved.items():
            setattr(init, name, fn)


def capture_problem(source: str) -> Captured:
    """Trace a KernelBench problem's ``Model`` to a symbolic-shape ATen graph.

    Integer init inputs start symbolic; one that the forward uses as a plain Python number
    (``make_fx`` cannot trace it: "not tracked with proxy") is made concrete and the trace
    retried, and a constructor that rejects symbolic ints gets concrete ones throughout."""
    return capture_namespace(load_namespace(source))


def capture_namespace(ns: dict[str, Any], symbolic_init: bool = True) -> Captured:
    """:func:`capture_problem` of a problem already executed (its module's namespace, with
    whatever sizes it holds: :mod:`kforge.problem_cost` counts at the effective sizes). With
    ``symbolic_init=False`` the init inputs are taken as they are (enough to count work at one
    size, and no ``numbers.Integral`` registration of ``SymInt`` in the caller's process)."""
    try:
        init_inputs = list(ns["get_init_inputs"]())
        with torch.device("meta"):
            raw_inputs = list(ns["get_inputs"]())
    except Exception as err:
        raise UnsupportedError(f"get_inputs()/get_init_inputs() failed: {type(err).__name__}: {err}") from None
    concrete: set[int] = set() if symbolic_init else set(range(len(init_inputs)))
    for _ in range(len(init_inputs) + 2):
        try:
            return _capture(ns, init_inputs, list(raw_inputs), concrete)
        except _Untracked as err:
            found = {int(i) for i in re.findall(r"init(\d+)", err.sources)} - concrete
            concrete |= found or set(range(len(init_inputs)))
    raise UnsupportedError("make_fx cannot trace Model with symbolic or concrete init inputs")


class _Untracked(Exception):
    def __init__(self, sources: str) -> None:
        super().__init__(sources)
        self.sources = sources


def _capture(ns: dict[str, Any], init_inputs: list[Any], raw_inputs: list[Any], concrete: set[int]) -> Captured:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.func import functional_call
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    env = ShapeEnv(duck_shape=False)
    mode = FakeTensorMode(shape_env=env, allow_non_fake_inputs=True)
    model = None
    symints: dict[InitKey, Any] = {}
    if len(concrete) < len(init_inputs) or not init_inputs:
        model = _build_symbolic(ns["Model"], init_inputs, env, mode, concrete, symints)
    if model is None:  # a constructor that needs concrete ints: sizes it reads are baked in
        symints = {}
        concrete |= set(range(len(init_inputs)))
        try:
            with torch.device("meta"):
                model = ns["Model"](*init_inputs)
        except Exception as err:
            raise UnsupportedError(f"building Model on the meta device failed: {type(err).__name__}: {err}") from None
    if not isinstance(model, torch.nn.Module):
        raise UnsupportedError("Model(...) is not an nn.Module")
    scalars = set()
    for i, value in enumerate(raw_inputs):
        if isinstance(value, float | int) and not isinstance(value, bool):
            # a Python number argument: traced as a 0-d tensor, which ModelNew makes of it
            raw_inputs[i] = torch.tensor(float(value), device="meta")
            scalars.add(i)
        elif not isinstance(value, torch.Tensor):
            raise UnsupportedError(f"get_inputs()[{i}] is a {type(value).__name__}, not a tensor")
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    names = list(state)
    arg_names = forward_arg_names(type(model), len(raw_inputs))
    placeholders = [
        Placeholder(n, "param", n not in dict(model.named_parameters()), t.dtype,
                    tuple(d.node.hint if isinstance(d, torch.SymInt) else int(d) for d in t.shape))
        for n, t in state.items()
    ] + [Placeholder(n, "input", False, t.dtype, tuple(t.shape), i in scalars)
         for i, (n, t) in enumerate(zip(arg_names, raw_inputs, strict=True))]

    def fake(t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, torch._subclasses.fake_tensor.FakeTensor):
            return t
        ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * t.dim())
        return mode.from_tensor(t, symbolic_context=ctx)

    args = [fake(t) for t in [*state.values(), *raw_inputs]]
    n_tensors = len(args)

    def run(*flat: Any) -> Any:
        # the init SymInts come last: as arguments of the trace they are tracked (a forward
        # that computes with one records the arithmetic instead of failing or baking it)
        with GenericSizes():
            return functional_call(model, dict(zip(names, flat[: len(names)], strict=True)),
                                   tuple(flat[len(names):n_tensors]))

    try:
        with mode:
            gm = make_fx(run, decomposition_table=decomposition_table())(*args, *symints.values())
    except Exception as err:  # data-dependent control flow, unsupported ops in tracing, ...
        text = str(err)
        if "not tracked with proxy" in text and len(concrete) < len(init_inputs):
            syms = set(re.findall(r"\b(s\d+)\b", text))
            sources = " ".join(str(src.name) for sym, srcs in env.var_to_sources.items()
                               if str(sym) in syms for src in srcs)
            raise _Untracked(sources) from None
        raise UnsupportedError(f"make_fx cannot trace Model: {type(err).__name__}: {text[:300]}") from None
    for node in gm.graph.nodes:
        if node.op == "call_function" and any(r in str(node.target) for r in RANDOM_OPS):
            raise NondeterministicReference(f"the reference draws random numbers ({node.target})")
    hints = {sym: int(val) for sym, val in env.backed_var_to_val.items()}
    captured = Captured(gm=gm, placeholders=placeholders, hints=hints, env=env)
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"][:n_tensors]
    scaled: dict[sympy.Symbol, tuple[int, int, int]] = {}
    for index, node in enumerate(phs):
        for dim, size in enumerate(node.meta["val"].shape):
            expr = captured.size_expr(size)
            if isinstance(expr, sympy.Symbol) and expr not in captured.sources:
                captured.sources[expr] = (index, dim, 1)
            elif isinstance(expr, sympy.Mul) and len(expr.args) == 2 and expr.args[0].is_Integer \
                    and isinstance(expr.args[1], sympy.Symbol):  # a dim of c * s (GLU's 2 * out)
                scaled.setdefault(expr.args[1], (index, dim, int(expr.args[0])))
    for sym, src in scaled.items():
        captured.sources.setdefault(sym, src)
    for key, symint in symints.items():
        expr = captured.size_expr(symint)
        if expr.is_number:  # the trace pinned it (a pooling window): built for this value only
            concrete.add(key if isinstance(key, int) else key[0])
        elif isinstance(expr, sympy.Symbol) and expr not in captured.sources:
            captured.init_sources[expr] = key
    captured.unsourced = {s: v for s, v in hints.items() if s not in captured.sources
                          and s not in captured.init_sources}
    captured.fixed_init = {i: v for i, v in enumerate(init_inputs) if i in concrete
                           and (_size_int(v) or (isinstance(v, tuple) and any(_size_int(x) for x in v)))}
    _divisions(captured)
    return captured


def _divisions(cap: Captured) -> None:
    """Each guard ``a % b == 0`` of two read-back symbols (a GroupNorm's channels and groups)
    makes ``a`` the product ``b * q`` of a new quotient symbol: ``G * (C // G)`` is then ``C``
    to the planner, so a group view and its source still fuse."""
    from torch.utils._sympy.functions import Mod, PythonMod

    known = set(cap.sources) | set(cap.init_sources)
    for guard in cap.env.guards:
        e = guard.expr
        if not isinstance(e, sympy.Eq) or sympy.Integer(0) not in e.args:
            continue
        mod = e.args[0] if e.args[1] == 0 else e.args[1]
        if not isinstance(mod, Mod | PythonMod | sympy.Mod) or not all(isinstance(x, sympy.Symbol) for x in mod.args):
            continue
        a, b = mod.args
        if a == b or not {a, b} <= known or a in cap.divisions or b in cap.divisions \
                or any(a in (x, y) or b in (x, y) for x, y in cap.derived.values()):
            continue
        q = sympy.Symbol(f"q_{a}_{b}", integer=True, positive=True)
        cap.divisions[a] = b * q
        cap.derived[q] = (a, b)
        cap.hints[q] = cap.hints[a] // cap.hints[b]
