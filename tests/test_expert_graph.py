from __future__ import annotations

import pytest

from kforge.agents.expert.graph import (
    ElementwisePattern,
    GemmPattern,
    KernelGraph,
    RowReductionPattern,
    UnsupportedError,
    broadcast_kind,
    trace_problem,
)
from tests.test_expert_helpers import STARTER, STARTER_NAMES


def ops_of(graph: KernelGraph) -> list[str]:
    return [op.op for op in graph.chain()]


def trace(name: str) -> KernelGraph:
    return trace_problem((STARTER / f"{name}.py").read_text())


def test_elementwise_gelu_scale() -> None:
    g = trace("elementwise_gelu_scale")
    assert isinstance(g.pattern, ElementwisePattern)
    assert ops_of(g) == ["gelu_tanh", "mul", "add", "clamp"]
    assert g.chain()[3].attrs == {"min": -1.0, "max": 3.0}
    assert [c.value for c in g.chain()[1].args if c.kind == "const"] == [2.0]


def test_elementwise_swish_bias_broadcasts_param_per_column() -> None:
    g = trace("elementwise_swish_bias")
    assert ops_of(g) == ["sigmoid", "mul", "add", "tanh"]
    bias = [a for a in g.chain()[2].args if a.kind == "param"][0]
    assert (bias.name, bias.broadcast) == ("bias", "per_col")
    assert [p.name for p in g.params] == ["bias"]


@pytest.mark.parametrize(
    "name,op",
    [("softmax_rows", "softmax"), ("logsoftmax_rows", "log_softmax"), ("layernorm_rows", "layernorm"),
     ("reduce_mean_rows", "mean"), ("reduce_max_rows", "amax")],
)
def test_row_reductions(name: str, op: str) -> None:
    g = trace(name)
    assert isinstance(g.pattern, RowReductionPattern)
    assert g.pattern.op == op and g.pattern.input == "x" and not g.pattern.epilogue
    if op == "layernorm":
        assert (g.pattern.weight, g.pattern.bias, g.pattern.eps) == ("norm.weight", "norm.bias", 1e-5)


def test_gemm_bias_relu() -> None:
    g = trace("gemm_bias_relu")
    assert isinstance(g.pattern, GemmPattern)
    p = g.pattern
    assert (p.a, p.b, p.b_layout, p.bias) == ("x", "linear.weight", "nk", "linear.bias")
    assert ops_of(g) == ["relu"]


def test_gemm_gelu_scale_bakes_in_the_scale() -> None:
    g = trace("gemm_gelu_scale")
    assert ops_of(g) == ["gelu_tanh", "mul", "add"]
    consts = [a.value for op in g.chain() for a in op.args if a.kind == "const"]
    assert consts == [0.5, 1.0]


def test_matmul_sigmoid_scale_keeps_input_names_and_layout() -> None:
    g = trace("matmul_sigmoid_scale")
    assert isinstance(g.pattern, GemmPattern)
    assert (g.pattern.a, g.pattern.b, g.pattern.b_role, g.pattern.b_layout) == ("A", "B", "input", "kn")
    assert [i.name for i in g.inputs] == ["A", "B"]


@pytest.mark.parametrize("name", STARTER_NAMES)
def test_graph_round_trips_through_json(name: str) -> None:
    g = trace(name)
    assert KernelGraph.model_validate_json(g.model_dump_json()) == g


def _problem(forward: str, init: str = "pass", inputs: str = "[torch.randn(4, 8)]") -> str:
    return f"""
import torch
import torch.nn as nn
import torch.nn.functional as F
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        {init}
    def forward(self, x):
        {forward}
def get_inputs():
    return {inputs}
def get_init_inputs():
    return []
"""


@pytest.mark.parametrize(
    "forward,init,what",
    [
        ("return self.conv(x)", "self.conv = nn.Conv1d(4, 4, 3)", "Conv1d"),
        ("return x.sum(0)", "pass", "dim=0"),
        ("return torch.softmax(x * 2.0, dim=-1)", "pass", "prologue"),
        ("return x, x + 1", "pass", "tuple"),
        ("return torch.cumsum(x, -1)", "pass", "cumsum"),
        ("return x + 1 if x.sum() > 0 else x", "pass", "trace"),
        ("return x", "pass", "computes nothing"),
        ("return torch.softmax(torch.softmax(x, -1), -1)", "pass", "reduction"),
    ],
)
def test_unsupported_constructs_are_named(forward: str, init: str, what: str) -> None:
    with pytest.raises(UnsupportedError) as err:
        trace_problem(_problem(forward, init, "[torch.randn(4, 8, 6)]" if "Conv" in what else "[torch.randn(4, 8)]"))
    assert str(err.value).startswith("unsupported: ")
    assert what.lower() in str(err.value).lower()


def test_module_and_method_forms_normalise() -> None:
    g = trace_problem(_problem(
        "return self.act(x).clamp(min=0.0).pow(2.0).sqrt() - F.leaky_relu(x, 0.2) + F.hardtanh(x)",
        "self.act = nn.GELU()",
    ))
    assert ops_of(g) == ["gelu", "clamp", "pow", "sqrt", "leaky_relu", "sub", "clamp", "add"]


def test_broadcast_kinds() -> None:
    assert broadcast_kind([4, 8], [4, 8]) == "full"
    assert broadcast_kind([8], [4, 8]) == "per_col"
    assert broadcast_kind([1, 8], [4, 8]) == "per_col"
    assert broadcast_kind([4, 1], [4, 8]) == "per_row"
    assert broadcast_kind([1], [4, 8]) == "scalar"
    with pytest.raises(UnsupportedError):
        broadcast_kind([4], [4, 8])
