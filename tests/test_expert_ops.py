"""The op table (``kforge/agents/expert/ir/ops.py``) against every backend's op table: each
backend renders every pointwise and index op, itself or through the op's decomposition into
ops it renders; every rendering a backend has is of an op of the table and produces code; and
every decomposition computes what PyTorch computes for that op."""

from __future__ import annotations

import math

import pytest
import torch

from kforge.agents.expert.codegen.backend import BACKENDS, get_backend
from kforge.agents.expert.codegen.optable import OpTable, missing
from kforge.agents.expert.ir.ops import (
    DECOMPOSITIONS,
    NONE,
    OPS,
    RENDERED,
    Attrs,
    Clamp,
    Elu,
    Gelu,
    LeakyRelu,
)
from kforge.agents.expert.plan.expr import E

ATTRS: dict[str, list[Attrs]] = {
    "gelu": [Gelu("none"), Gelu("tanh")], "leaky_relu": [LeakyRelu(0.2)], "elu": [Elu(1.5, 1.0507, 0.5)],
    "clamp": [Clamp(-0.5, 0.75), Clamp(min=0.0), Clamp(max=1.0)],
}


def probe(op: str, dt: str = "f32", attrs: Attrs = NONE) -> E:
    """``op`` over loop variables (operands of the op's dtype rule)."""
    spec = OPS[op]
    arity = spec.arity or 0
    dts = ["bool", dt, dt] if spec.dtype == "select" else [("bool" if op.startswith("logical") else dt)] * arity
    args = tuple(E("cast", (E("var", v=(f"v{i}", 8), dt="i64"),), dt=d) if d != "i64" else E("var", v=(f"v{i}", 8), dt="i64")
                 for i, d in enumerate(dts))
    out = "bool" if spec.dtype == "compare" else ("i64" if spec.kind == "index" else dt)
    return E(op, args, v=None if attrs is NONE else attrs, dt=out)


@pytest.mark.parametrize("platform", sorted(BACKENDS))
def test_every_backend_renders_every_op_of_the_table(platform: str) -> None:
    """What fails here is an op of the table that a backend claiming the IR cannot render:
    no row in its table and no decomposition into rows it has."""
    for table in get_backend(platform).op_tables():
        assert missing(table, RENDERED) == {}, f"{platform} cannot render these ops"
        stale = [op for op in table if op not in OPS or OPS[op].kind not in ("pointwise", "index")]
        assert not stale, f"{platform} renders ops the table does not have: {stale}"


@pytest.mark.parametrize("platform", sorted(BACKENDS))
def test_every_op_renders_to_code_in_every_backend(platform: str) -> None:
    for table in get_backend(platform).op_tables():
        for op in RENDERED:
            for code in _renderings(platform, table, op):
                assert code and "None" not in code, (platform, op, code)


def _renderings(platform: str, table: OpTable, op: str) -> list[str]:
    """``op`` rendered for each of its attribute records, over floats and (where the op is
    defined for them) integers."""
    integer_ok = OPS[op].attrs is type(NONE) and (op not in DECOMPOSITIONS or op in INTEGER_DECOMPOSED)
    dts = ("i64",) if OPS[op].kind == "index" else (("f32", "i64") if integer_ok else ("f32",))
    return [get_backend(platform).render_expr(probe(op, dt, attrs), table) for attrs in ATTRS.get(op, [NONE]) for dt in dts]


INTEGER_DECOMPOSED = ("relu", "isnan", "logical_xor", "sign")


class TorchBuilder:
    """Builds a decomposition's value with PyTorch, one op of the table at a time."""

    PRIMITIVE = {
        "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "neg": torch.neg,
        "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "erf": torch.erf, "tanh": torch.tanh,
        "floor": torch.floor, "ceil": torch.ceil, "maximum": torch.maximum, "minimum": torch.minimum,
        "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "gt": torch.gt, "expm1": torch.expm1,
        "where": torch.where,
    }

    def op(self, name: str, *args: torch.Tensor, attrs: Attrs = NONE) -> torch.Tensor:
        if name in self.PRIMITIVE:
            return self.PRIMITIVE[name](*args)
        return OPS[name].decomposition(self, list(args), attrs)  # type: ignore[misc]

    def const(self, value: float) -> torch.Tensor:
        return torch.tensor(value, dtype=torch.float64)


F = torch.nn.functional
REFERENCE = {
    "exp2": torch.exp2, "expm1": torch.expm1, "log1p": torch.log1p, "log2": torch.log2, "rsqrt": torch.rsqrt,
    "reciprocal": torch.reciprocal, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "relu": torch.relu,
    "sign": torch.sign, "trunc": torch.trunc, "round": torch.round, "isnan": torch.isnan,
    "gelu": lambda x, a: F.gelu(x, approximate=a.approximate), "leaky_relu": lambda x, a: F.leaky_relu(x, a.slope),
    "elu": lambda x, a: torch.where(x > 0, x * a.scale, a.alpha * a.scale * torch.expm1(x * a.input_scale)),
    "clamp": lambda x, a: torch.clamp(x, a.min, a.max), "logical_xor": torch.logical_xor,
}


@pytest.mark.parametrize("op", sorted(DECOMPOSITIONS))
def test_decompositions_compute_what_torch_computes(op: str) -> None:
    assert op in REFERENCE, f"give {op}'s decomposition a torch reference here"
    x = torch.cat([torch.linspace(-6, 6, 97, dtype=torch.float64), torch.tensor([-2.5, -0.5, 0.5, 1.5, 2.5, 0.0])])
    for attrs in ATTRS.get(op, [NONE]):
        if op == "logical_xor":
            a, b = x > 0, x.abs() > 3
            got, want = TorchBuilder().op(op, a, b), REFERENCE[op](a, b)
        elif op in ("log1p", "log2", "rsqrt"):
            got, want = TorchBuilder().op(op, x.abs() + 0.01), REFERENCE[op](x.abs() + 0.01)
        else:
            got = TorchBuilder().op(op, x, attrs=attrs)
            want = REFERENCE[op](x, attrs) if attrs is not NONE else REFERENCE[op](x)
        assert torch.allclose(got.to(torch.float64), want.to(torch.float64), atol=1e-12, rtol=1e-9), op


def test_the_cuda_backend_renders_the_activations_by_their_decompositions() -> None:
    cuda = get_backend("cuda")
    (table,) = cuda.op_tables()
    assert not {"gelu", "elu", "leaky_relu"} & set(table)
    code = cuda.render_expr(probe("gelu", attrs=Gelu("none")), table)
    assert "std::erf(" in code and "0.7071067811865476f" in code


def test_the_op_constants_are_the_definitions() -> None:
    from kforge.agents.expert.ir import ops

    for value, exact in ((ops.INV_SQRT_2, math.sqrt(0.5)), (ops.SQRT_2_OVER_PI, math.sqrt(2 / math.pi)),
                         (ops.LN_2, math.log(2)), (ops.LOG2_E, 1 / math.log(2))):
        assert value == pytest.approx(exact, rel=1e-15)
