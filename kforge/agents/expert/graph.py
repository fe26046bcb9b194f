"""The expert agent's kernel IR: a traced ``Model`` reduced to one matched *pattern*.

A KernelBench problem is executed (its ``Model`` built and its inputs made on the ``meta``
device, so no memory is allocated whatever the sizes), traced with ``torch.fx`` and shape-
propagated, then lowered (``kforge.agents.expert.fx_lower``) into a :class:`KernelGraph`::

    KernelGraph
      inputs   [TensorInfo]   forward() arguments, in order (name = argument name)
      params   [TensorInfo]   parameters/buffers used, by state_dict name ("linear.weight")
      output_shape [int]      shape of the single output tensor
      pattern  one of
        ElementwisePattern  ops: [PointwiseOp]  result: Operand
        RowReductionPattern op: softmax | log_softmax | sum | mean | amax | max
                                | layernorm | rmsnorm
                            input (name of the reduced tensor, an input), rows, cols,
                            weight/bias (param names or None), eps, keepdim,
                            epilogue: [PointwiseOp], result: Operand
        GemmPattern         a (input [.., K]), b (input or param), b_layout "nk" (nn.Linear
                            weight [N, K]) | "kn" (matmul right operand [K, N]), bias ([N]
                            param/input or None), m, n, k, epilogue: [PointwiseOp], result

Pointwise chains are in SSA form. Each :class:`PointwiseOp` names its result (``out``,
"v0", "v1", ...) and reads :class:`Operand` s:

    kind="value"  name="v3"          an earlier op's result
    kind="core"                      the result of the pattern's core op (reduction / GEMM)
    kind="input"  name="x"           a forward() argument   } with ``broadcast`` relative to
    kind="param"  name="bias"        a parameter or buffer  } the output (see below)
    kind="const"  value=2.0          a Python scalar baked in at trace time

``broadcast`` views the *output* (of the op chain) as a 2-D ``[rows, cols]`` matrix, with
``cols`` its last dimension and ``rows`` the product of the others:
``full`` (same shape), ``per_col`` (one value per column, e.g. a bias ``[N]``), ``per_row``
(one value per row, e.g. ``[B, 1]``), ``scalar`` (one element). Any other broadcast is
unsupported.

Pointwise vocabulary (``POINTWISE_OPS``; attrs in brackets): add sub mul div (binary),
neg relu sigmoid tanh gelu gelu_tanh silu exp log abs sqrt rsqrt square (unary),
clamp [min, max] (either may be absent: +-inf), leaky_relu [negative_slope],
pow [exponent] (scalar exponent only), maximum minimum (binary).

Reductions are over the last dimension of a contiguous fp32 input viewed as ``[rows, cols]``;
``layernorm`` uses the biased variance; ``max`` is ``torch.max(x, -1).values``.

Everything is fp32. Whatever the IR cannot express is an :class:`UnsupportedError` whose
message starts with ``"unsupported: "``; the expert never falls back to torch.

The whole graph is JSON-serialisable: ``graph.model_dump(mode="json")`` rides in
``GenerationResult.plan["graph"]`` and ``KernelGraph.model_validate`` reads it back.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from kforge.agents.expert.errors import UnsupportedError

Broadcast = Literal["full", "per_col", "per_row", "scalar"]

UNARY_OPS = (
    "neg", "relu", "sigmoid", "tanh", "gelu", "gelu_tanh", "silu", "exp", "log", "abs",
    "sqrt", "rsqrt", "square", "clamp", "leaky_relu", "pow",
)
BINARY_OPS = ("add", "sub", "mul", "div", "maximum", "minimum")
POINTWISE_OPS = UNARY_OPS + BINARY_OPS
REDUCTION_OPS = ("softmax", "log_softmax", "sum", "mean", "amax", "max", "layernorm", "rmsnorm")


class IRModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorInfo(IRModel):
    name: str
    shape: list[int]
    role: Literal["input", "param"]


class Operand(IRModel):
    kind: Literal["value", "core", "input", "param", "const"]
    name: str = ""
    value: float = 0.0
    broadcast: Broadcast = "full"


class PointwiseOp(IRModel):
    out: str
    op: str
    args: list[Operand]
    attrs: dict[str, float] = Field(default_factory=dict)


class ElementwisePattern(IRModel):
    kind: Literal["elementwise"] = "elementwise"
    ops: list[PointwiseOp]
    result: Operand


class RowReductionPattern(IRModel):
    kind: Literal["row_reduction"] = "row_reduction"
    op: Literal["softmax", "log_softmax", "sum", "mean", "amax", "max", "layernorm", "rmsnorm"]
    input: str
    rows: int
    cols: int
    weight: str | None = None
    bias: str | None = None
    eps: float = 0.0
    keepdim: bool = False
    epilogue: list[PointwiseOp] = Field(default_factory=list)
    result: Operand = Operand(kind="core")

    @property
    def keeps_row(self) -> bool:
        """True when the core result has the input's shape (softmax, norms)."""
        return self.op in ("softmax", "log_softmax", "layernorm", "rmsnorm")


class GemmPattern(IRModel):
    kind: Literal["gemm"] = "gemm"
    a: str
    b: str
    b_role: Literal["input", "param"]
    b_layout: Literal["nk", "kn"]
    bias: str | None = None
    bias_role: Literal["input", "param"] = "param"
    m: int
    n: int
    k: int
    epilogue: list[PointwiseOp] = Field(default_factory=list)
    result: Operand = Operand(kind="core")


Pattern = Annotated[
    ElementwisePattern | RowReductionPattern | GemmPattern, Field(discriminator="kind")
]


class KernelGraph(IRModel):
    inputs: list[TensorInfo]
    params: list[TensorInfo]
    output_shape: list[int]
    pattern: Pattern

    @property
    def kind(self) -> str:
        return self.pattern.kind

    def chain(self) -> list[PointwiseOp]:
        """The pattern's pointwise ops (the whole body, or the epilogue)."""
        pat = self.pattern
        return pat.ops if isinstance(pat, ElementwisePattern) else pat.epilogue

    def tensor(self, name: str) -> TensorInfo:
        for info in (*self.inputs, *self.params):
            if info.name == name:
                return info
        raise KeyError(name)


def broadcast_kind(shape: list[int], out_shape: list[int]) -> Broadcast:
    """How a tensor of ``shape`` broadcasts against ``out_shape`` viewed as [rows, cols]."""
    if list(shape) == list(out_shape):
        return "full"
    numel = 1
    for d in shape:
        numel *= d
    if numel == 1:
        return "scalar"
    s, o = _strip_ones(shape), _strip_ones(out_shape)
    if s == o:
        return "full"
    if not o or len(s) > len(o):
        raise UnsupportedError(f"broadcast of shape {list(shape)} against output {list(out_shape)}")
    if s == [o[-1]]:
        return "per_col"
    if s and s[-1] == 1 and _strip_ones(s[:-1]) == _strip_ones(o[:-1]):
        return "per_row"
    raise UnsupportedError(f"broadcast of shape {list(shape)} against output {list(out_shape)}")


def _strip_ones(shape: list[int]) -> list[int]:
    out = list(shape)
    while out and out[0] == 1:
        out = out[1:]
    return out


def trace_problem(problem_source: str) -> KernelGraph:
    """Execute a KernelBench problem's source (on the meta device) and lower its ``Model``.

    Raises :class:`UnsupportedError` for anything outside the IR, including sources that
    fail to execute or trace.
    """
    from kforge.agents.expert.fx_lower import lower_problem_source

    return lower_problem_source(problem_source)
