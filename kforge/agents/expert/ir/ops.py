"""The op vocabulary, defined once: one :class:`OpDef` row per op of the IR and of the lowered
scalar expressions, with its arity, its typed attributes, its dtype rule and (for an op a
backend may not render itself) its decomposition into other ops of the table.

    kind        ops                                               made by
    leaf        input param const iota unsupported                the capture's placeholders, constants
    view        view permute broadcast slice select flip unfold   index maps: no kernel of their own
                cat gather pad
    root        reduce scan matmul pool                           always a kernel of their own
    pointwise   neg abs exp ... add sub ... where cast            ATen's elementwise ops (``aten``)
    index       iadd isub imul ifloordiv imod imin imax           lowering: integer index arithmetic

Every backend renders the pointwise and index ops through its own table, keyed by these
names (``codegen/<backend>/``: its table is its capability list); an op missing from a
backend's table is rendered through :attr:`OpDef.decomposition`, written against
:class:`OpBuilder` (any builder of values: the lowering's expressions, a test's numbers), so
adding an op is one row here and one rendering per backend (or none where the decomposition
serves). ``tests/test_expert_ops.py`` fails when a backend can render neither.

Attributes are frozen records (:class:`Gelu`, :class:`Reduce`...), never positional tuples:
``Node.attrs`` is one, and so is ``E.v`` of a pointwise op that has attributes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Protocol, TypeVar

# constants of the ops' definitions, shared by every backend's rendering
INV_SQRT_2 = 0.7071067811865476  # gelu: x * Phi(x) = x / 2 * (1 + erf(x / sqrt(2)))
SQRT_2_OVER_PI = 0.7978845608028654  # gelu (tanh): tanh(sqrt(2 / pi) * (x + 0.044715 x^3))
GELU_CUBIC = 0.044715
LN_2 = 0.6931471805599453
LOG2_E = 1.4426950408889634


# ------------------------------------------------------------------ attributes

@dataclass(frozen=True)
class Attrs:
    """An op's attributes; list-valued fields are kept as tuples (records are hashable)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):
                object.__setattr__(self, f.name, tuple(value))


@dataclass(frozen=True)
class NoAttrs(Attrs):
    pass


NONE = NoAttrs()


@dataclass(frozen=True)
class Placeholder(Attrs):
    index: int
    name: str  # the forward argument or state_dict name
    is_buffer: bool = False


@dataclass(frozen=True)
class Const(Attrs):
    value: Any  # a Python number or bool


@dataclass(frozen=True)
class Iota(Attrs):
    start: Any  # sympy size expressions
    step: Any


@dataclass(frozen=True)
class Unsupported(Attrs):
    reason: str  # raised as UnsupportedError if anything reads the node


@dataclass(frozen=True)
class Permute(Attrs):
    dims: tuple[int, ...]  # output dim j is input dim dims[j]


@dataclass(frozen=True)
class Broadcast(Attrs):
    bdims: tuple[int, ...]  # input dim j -> output dim bdims[j]; size-1 dims expand


@dataclass(frozen=True)
class Slice(Attrs):
    dim: int
    start: Any  # a size expression
    step: int


@dataclass(frozen=True)
class Select(Attrs):
    dim: int
    index: Any  # a size expression


@dataclass(frozen=True)
class Flip(Attrs):
    dims: tuple[int, ...]


@dataclass(frozen=True)
class Unfold(Attrs):
    dim: int  # windows of ``dim`` as a new last dim: element i * step + j
    size: int
    step: int


@dataclass(frozen=True)
class Cat(Attrs):
    dim: int


@dataclass(frozen=True)
class Gather(Attrs):
    dim: int


@dataclass(frozen=True)
class Pad(Attrs):
    pads: tuple[int, ...]  # (before, after) per dim, last dim first (``F.pad``'s order)
    value: float


@dataclass(frozen=True)
class Reduce(Attrs):
    kind: str  # sum prod max min argmax argmin any all
    dims: tuple[int, ...]
    keepdim: bool


@dataclass(frozen=True)
class Scan(Attrs):
    kind: str  # sum prod
    dim: int


@dataclass(frozen=True)
class Pool(Attrs):
    kind: str  # max avg
    nd: int
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    ceil_mode: bool
    count_include_pad: bool
    divisor: int | None


@dataclass(frozen=True)
class Gelu(Attrs):
    approximate: str = "none"  # "none" (erf) | "tanh"


@dataclass(frozen=True)
class LeakyRelu(Attrs):
    slope: float


@dataclass(frozen=True)
class Elu(Attrs):
    alpha: float
    scale: float
    input_scale: float


@dataclass(frozen=True)
class Clamp(Attrs):
    min: float | None = None  # either bound may be absent
    max: float | None = None


# ------------------------------------------------------------------ decompositions

V = TypeVar("V")


class OpBuilder(Protocol[V]):
    """What a decomposition builds with: ops of the table over values, and numbers (of the
    decomposed op's dtype)."""

    def op(self, name: str, *args: V, attrs: Attrs = NONE) -> V: ...

    def const(self, value: float) -> V: ...


Decomposition = Callable[[OpBuilder[Any], Sequence[Any], Any], Any]


def _sigmoid(b: OpBuilder[V], a: Sequence[V], _: Any) -> V:
    return b.op("div", b.const(1.0), b.op("add", b.const(1.0), b.op("exp", b.op("neg", a[0]))))


def _gelu(b: OpBuilder[V], a: Sequence[V], attrs: Gelu) -> V:
    x = a[0]
    if attrs.approximate == "tanh":
        cubic = b.op("mul", b.op("mul", b.op("mul", b.const(GELU_CUBIC), x), x), x)
        inner = b.op("mul", b.const(SQRT_2_OVER_PI), b.op("add", x, cubic))
        return b.op("mul", b.op("mul", b.const(0.5), x), b.op("add", b.const(1.0), b.op("tanh", inner)))
    phi = b.op("add", b.const(1.0), b.op("erf", b.op("mul", x, b.const(INV_SQRT_2))))
    return b.op("mul", b.op("mul", b.const(0.5), x), phi)


def _elu(b: OpBuilder[V], a: Sequence[V], attrs: Elu) -> V:
    x = a[0]
    neg = b.op("mul", b.op("expm1", b.op("mul", x, b.const(attrs.input_scale))), b.const(attrs.alpha * attrs.scale))
    return b.op("where", b.op("gt", x, b.const(0.0)), b.op("mul", x, b.const(attrs.scale)), neg)


def _clamp(b: OpBuilder[V], a: Sequence[V], attrs: Clamp) -> V:
    x = a[0]
    if attrs.min is not None:
        x = b.op("maximum", x, b.const(attrs.min))
    if attrs.max is not None:
        x = b.op("minimum", x, b.const(attrs.max))
    return x


def _round(b: OpBuilder[V], a: Sequence[V], _: Any) -> V:
    """Half to even: a tie (floor(x) + 0.5 == x) goes to 2 * floor(x / 2 + 1 / 2)."""
    x = a[0]
    fl = b.op("floor", x)
    tie = b.op("eq", b.op("add", fl, b.const(0.5)), x)
    even = b.op("mul", b.const(2.0), b.op("floor", b.op("add", b.op("mul", x, b.const(0.5)), b.const(0.5))))
    return b.op("where", tie, even, b.op("floor", b.op("add", x, b.const(0.5))))


DECOMPOSITIONS: dict[str, Decomposition] = {
    "exp2": lambda b, a, _: b.op("exp", b.op("mul", a[0], b.const(LN_2))),
    "expm1": lambda b, a, _: b.op("sub", b.op("exp", a[0]), b.const(1.0)),
    "log1p": lambda b, a, _: b.op("log", b.op("add", b.const(1.0), a[0])),
    "log2": lambda b, a, _: b.op("mul", b.op("log", a[0]), b.const(LOG2_E)),
    "rsqrt": lambda b, a, _: b.op("div", b.const(1.0), b.op("sqrt", a[0])),
    "reciprocal": lambda b, a, _: b.op("div", b.const(1.0), a[0]),
    "sigmoid": _sigmoid,
    "tanh": lambda b, a, _: b.op("sub", b.op("mul", b.const(2.0), _sigmoid(b, [b.op("mul", b.const(2.0), a[0])], _)),
                                 b.const(1.0)),
    "relu": lambda b, a, _: b.op("maximum", a[0], b.const(0.0)),
    "sign": lambda b, a, _: b.op("where", b.op("gt", a[0], b.const(0.0)), b.const(1.0),
                                 b.op("where", b.op("lt", a[0], b.const(0.0)), b.const(-1.0), b.const(0.0))),
    "trunc": lambda b, a, _: b.op("where", b.op("lt", a[0], b.const(0.0)), b.op("ceil", a[0]), b.op("floor", a[0])),
    "round": _round,
    "isnan": lambda b, a, _: b.op("ne", a[0], a[0]),
    "gelu": _gelu,
    "leaky_relu": lambda b, a, attrs: b.op("where", b.op("gt", a[0], b.const(0.0)), a[0],
                                           b.op("mul", a[0], b.const(attrs.slope))),
    "elu": _elu,
    "clamp": _clamp,
    "logical_xor": lambda b, a, _: b.op("ne", a[0], a[1]),
}


# ------------------------------------------------------------------ the table

Kind = Literal["leaf", "view", "root", "pointwise", "index"]
# How a pointwise op's operands are typed: "result" (cast to the result's dtype), "compare"
# (their common type, f32 > i64 > bool, bool for the logical ops; the result is bool), "select"
# (a bool condition, then two values of the result's dtype); "none": not a pointwise op.
DtypeRule = Literal["result", "compare", "select", "none"]


@dataclass(frozen=True)
class OpDef:
    name: str
    kind: Kind
    arity: int | None  # tensor or scalar operands (None: any number)
    attrs: type[Attrs] = NoAttrs
    dtype: DtypeRule = "result"
    aten: tuple[str, ...] = ()  # ATen / prims overload packets that are this op one-to-one
    decomposition: Decomposition | None = field(default=None, compare=False)
    doc: str = ""
    transcendental: bool = False  # a polynomial / division per element: worth keeping, not recomputing


# ops a backend computes with a polynomial or a division (tens of operations an element)
TRANSCENDENTAL = frozenset({"exp", "exp2", "expm1", "log", "log1p", "log2", "sigmoid", "tanh", "erf", "sin",
                            "cos", "gelu", "elu", "pow"})


def _pointwise(name: str, arity: int, aten: tuple[str, ...] | None = None, attrs: type[Attrs] = NoAttrs,
               dtype: DtypeRule = "result", doc: str = "") -> OpDef:
    return OpDef(name, "pointwise", arity, attrs, dtype, (name,) if aten is None else aten,
                 DECOMPOSITIONS.get(name), doc, name in TRANSCENDENTAL)


_ROWS: list[OpDef] = [
    OpDef("input", "leaf", 0, Placeholder, "none", doc="a forward() argument"),
    OpDef("param", "leaf", 0, Placeholder, "none", doc="a parameter or buffer (state_dict entry)"),
    OpDef("const", "leaf", 0, Const, "none", doc="a tensor filled with one number"),
    OpDef("iota", "leaf", 0, Iota, "none", doc="start + i * step"),
    OpDef("unsupported", "leaf", 0, Unsupported, "none", doc="a value nothing may read (pool indices)"),
    OpDef("view", "view", 1, NoAttrs, "none", doc="a row-major reshape"),
    OpDef("permute", "view", 1, Permute, "none"),
    OpDef("broadcast", "view", 1, Broadcast, "none"),
    OpDef("slice", "view", 1, Slice, "none"),
    OpDef("select", "view", 1, Select, "none"),
    OpDef("flip", "view", 1, Flip, "none"),
    OpDef("unfold", "view", 1, Unfold, "none", doc="windows as a new last dim (a convolution's im2col)"),
    OpDef("cat", "view", None, Cat, "none"),
    OpDef("gather", "view", 2, Gather, "none", doc="operands: source, index"),
    OpDef("pad", "view", 1, Pad, "none"),
    OpDef("reduce", "root", 1, Reduce, "none", doc="mean and var arrive as sums"),
    OpDef("scan", "root", 1, Scan, "none", doc="an inclusive cumsum / cumprod"),
    OpDef("matmul", "root", 2, NoAttrs, "none", doc="[M, K] x [K, N], or batched [B, M, K] x [B, K, N]"),
    OpDef("pool", "root", 1, Pool, "none", doc="a reduction over a window"),
    *(_pointwise(n, 1) for n in ("neg", "abs", "exp", "exp2", "expm1", "log", "log1p", "log2", "sqrt",
                                 "rsqrt", "reciprocal", "sigmoid", "tanh", "relu", "erf", "sin", "cos",
                                 "sign", "floor", "ceil", "round", "trunc")),
    _pointwise("isnan", 1, dtype="compare"),
    _pointwise("logical_not", 1, ("logical_not", "bitwise_not"), dtype="compare"),
    _pointwise("gelu", 1, (), attrs=Gelu),
    _pointwise("leaky_relu", 1, (), attrs=LeakyRelu),
    _pointwise("elu", 1, (), attrs=Elu),
    _pointwise("clamp", 1, (), attrs=Clamp, doc="hardtanh and clamp with number bounds"),
    _pointwise("cast", 1, (), doc="to the node's dtype"),
    _pointwise("add", 2, ("prims.add",), doc="aten.add's alpha is a multiply first"),
    _pointwise("sub", 2, ("prims.sub",)),
    _pointwise("mul", 2, ("mul", "prims.mul")),
    _pointwise("div", 2, ("prims.div",), doc="aten.div's rounding modes are floordiv / truncdiv"),
    _pointwise("floordiv", 2, ()),
    _pointwise("truncdiv", 2, ()),
    *(_pointwise(n, 2) for n in ("pow", "maximum", "minimum", "remainder")),
    *(_pointwise(n, 2, dtype="compare") for n in ("eq", "ne", "lt", "le", "gt", "ge")),
    _pointwise("logical_and", 2, ("logical_and", "bitwise_and"), dtype="compare"),
    _pointwise("logical_or", 2, ("logical_or", "bitwise_or"), dtype="compare"),
    _pointwise("logical_xor", 2, dtype="compare"),
    _pointwise("where", 3, dtype="select"),
    *(OpDef(n, "index", 2, doc="integer index arithmetic") for n in ("iadd", "isub", "imul", "ifloordiv", "imod",
                                                                      "imin", "imax")),
]

OPS: dict[str, OpDef] = {op.name: op for op in _ROWS}


def ops_of(*kinds: Kind) -> tuple[str, ...]:
    return tuple(op.name for op in _ROWS if op.kind in kinds)


POINTWISE = ops_of("pointwise")
VIEWS = ops_of("view")
ROOTS = ops_of("root")  # always materialised by a kernel of their own
RENDERED = ops_of("pointwise", "index")  # what every backend renders, itself or by decomposition


def make_attrs(op: str, **values: Any) -> Attrs:
    """The typed attributes of ``op`` (a TypeError names a field the op does not have)."""
    return OPS[op].attrs(**values)
