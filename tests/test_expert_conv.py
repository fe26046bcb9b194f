"""Convolutions in the expert compiler: the implicit-GEMM decomposition equals PyTorch's own
convolutions (every dim count, stride, padding, dilation, groups, output padding), and a
traced convolution keeps its batch, channels and spatial sizes symbolic (only the window,
stride and similar integers are pinned, and ``ModelNew`` refuses other values)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from kforge.agents.expert.capture.conv import conv, conv_transpose
from kforge.agents.expert.capture.trace import capture_problem
from kforge.agents.expert.ir.build import build_graph
from kforge.agents.expert.plan.planner import plan_graph

F = torch.nn.functional
FORWARD = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
TRANSPOSED = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
CASES = [  # stride, padding, dilation, groups, window
    (1, 0, 1, 1, 3), (2, 1, 1, 1, 3), (2, 1, 2, 2, 3), (1, 2, 1, 4, 5), (3, 0, 1, 1, 2), (1, 1, 1, 2, 1),
]


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_the_decomposition_is_pytorchs_convolution(nd: int) -> None:
    gen = torch.Generator().manual_seed(nd)
    x = torch.randn(2, 8, *[9, 8, 7][:nd], generator=gen, dtype=torch.float64)
    checked = 0
    for s, p, d, g, k in CASES:
        w = torch.randn(12, 8 // g, *[k] * nd, generator=gen, dtype=torch.float64)
        b = torch.randn(12, generator=gen, dtype=torch.float64)
        want = FORWARD[nd](x, w, b, s, p, d, g)
        torch.testing.assert_close(conv(x, w, b, s, p, d, g), want, rtol=1e-12, atol=1e-12)
        checked += 1
        for op in range(max(s, d)):
            wt = torch.randn(8, 12 // g, *[k] * nd, generator=gen, dtype=torch.float64)
            want = TRANSPOSED[nd](x, wt, b, s, p, op, g, d)
            got = conv_transpose(x, wt, b, s, p, op, g, d)
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
            checked += 1
    assert checked >= 14


def test_transposed_convs_over_random_settings() -> None:
    """Stride above the window (phases without taps), padding beyond the window (crops),
    dilation and stride sharing a factor, output padding, groups: equal to PyTorch's."""
    rng = torch.Generator().manual_seed(7)
    checked = 0
    for trial in range(60):
        s, p, d, k, g = (int(torch.randint(lo, hi, (1,), generator=rng)) for lo, hi in
                         ((1, 4), (0, 4), (1, 4), (1, 5), (1, 3)))
        op = int(torch.randint(0, max(s, d), (1,), generator=rng))
        nd = 1 + trial % 2
        x = torch.randn(2, 4, *[7, 6][:nd], generator=rng, dtype=torch.float64)
        w = torch.randn(4, 6 // g, *[k] * nd, generator=rng, dtype=torch.float64)
        try:
            want = TRANSPOSED[nd](x, w, None, s, p, op, g, d)
        except RuntimeError:  # PyTorch refuses the setting (output padding too large, empty output)
            continue
        got = conv_transpose(x, w, None, s, p, op, g, d)
        assert got.shape == want.shape, (s, p, d, k, g, op)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=str((s, p, d, k, g, op)))
        checked += 1
    assert checked >= 30


def test_string_padding_and_an_unbatched_input() -> None:
    x = torch.randn(3, 10, 9, dtype=torch.float64)
    w = torch.randn(4, 3, 3, 2, dtype=torch.float64)
    for pad in ("same", "valid"):
        torch.testing.assert_close(conv(x, w, None, 1, pad, 2), F.conv2d(x, w, None, 1, pad, 2))
    wt = torch.randn(3, 5, 3, 3, dtype=torch.float64)
    torch.testing.assert_close(conv_transpose(x, wt, None, 2, 1, 1), F.conv_transpose2d(x, wt, None, 2, 1, 1))


PROBLEM = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, output_padding, bias_shape):
        super(Model, self).__init__()
        self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding, output_padding=output_padding)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        x = self.conv_transpose(x) + self.bias
        x = torch.min(x, torch.tensor(0.25, device=x.device))
        return torch.nn.functional.adaptive_avg_pool2d(torch.relu(x), 1)


batch_size = 16
in_channels, out_channels = 32, 64
height = width = 24
kernel_size, stride, padding, output_padding = 3, 2, 1, 1
bias_shape = (out_channels, 1, 1)


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding, output_padding, bias_shape]
'''


def test_a_traced_convolution_keeps_its_sizes_symbolic() -> None:
    cap = capture_problem(PROBLEM)
    # the window and the stride are baked in; channels, batch, height, width and the bias
    # tuple's size stay symbols that ModelNew reads back from its tensors
    assert cap.fixed_init == {2: 3, 3: 2}
    assert not any(expr.is_number for expr in cap.env.replacements.values() if expr != 3 and expr != 2)
    inputs = [p for p in cap.placeholders if p.role == "input"]
    assert inputs[0].shape_hint == (16, 32, 24, 24)
    graph = build_graph(cap)
    ops = {n.op for n in graph.nodes}
    assert {"matmul", "const", "reduce"} <= ops  # the GEMM, torch.tensor(0.25), the global pool
    program = plan_graph(graph)
    assert "gemm" in program.summary()


def test_modelnew_refuses_another_window(tmp_path: Path) -> None:
    from kforge.agents.expert.codegen.candidate import reference_init

    _, init = reference_init(PROBLEM, capture_problem(PROBLEM).fixed_init)
    assert "kernel_size != 3" in init and "stride != 2" in init and "in_channels !=" not in init


@pytest.mark.parametrize("nd,stride", list(itertools.product([2, 3], [1, 2])))
def test_the_trace_of_a_decomposed_conv_runs(nd: int, stride: int) -> None:
    """The decomposition under the capture's fake symbolic tensors: no size but the window pinned."""
    conv_cls = {2: "Conv2d", 3: "ConvTranspose3d"}[nd]
    spatial = ", ".join(["8"] * nd)
    source = f'''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, c_in, c_out, k):
        super(Model, self).__init__()
        self.conv = nn.{conv_cls}(c_in, c_out, k, stride={stride}, padding=1)

    def forward(self, x):
        return torch.sigmoid(self.conv(x))

def get_inputs():
    return [torch.randn(4, 6, {spatial})]

def get_init_inputs():
    return [6, 10, 3]
'''
    cap = capture_problem(source)
    assert cap.fixed_init == {2: 3}
    assert "gemm" in plan_graph(build_graph(cap)).summary()


def test_a_depthwise_conv_keeps_its_channels_symbolic() -> None:
    """``groups=in_channels``: the group count is the channel symbol, not a pinned integer."""
    source = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, in_channels, kernel_size):
        super(Model, self).__init__()
        self.conv = nn.Conv2d(in_channels, in_channels, kernel_size, padding=1, groups=in_channels)

    def forward(self, x):
        return self.conv(x)

def get_inputs():
    return [torch.randn(2, 16, 10, 12)]

def get_init_inputs():
    return [16, 3]
'''
    cap = capture_problem(source)
    assert cap.fixed_init == {1: 3}  # the window only
    plan_graph(build_graph(cap))


def test_a_shape_tuple_init_input_is_read_back_per_element() -> None:
    """Sizes that only a tuple init input carries stay symbols; ModelNew reads each element
    back from its own constructor arguments (``self._kf_init[i][j]``), nothing is pinned."""
    from kforge.agents.expert.codegen.backend import render_default

    source = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, shape):
        super(Model, self).__init__()
        self.shape = shape

    def forward(self, x):
        return torch.softmax(x.reshape(x.shape[0], self.shape[0], self.shape[1]), dim=-1)

def get_inputs():
    return [torch.randn(4, 32)]

def get_init_inputs():
    return [(4, 8)]
'''
    cap = capture_problem(source)
    assert cap.fixed_init == {} and sorted(cap.init_sources.values()) == [(0, 0), (0, 1)]
    candidate = render_default(plan_graph(build_graph(cap)), "cpu", "strict", source)
    assert "int(self._kf_init[0][0])" in candidate and "int(self._kf_init[0][1])" in candidate


def test_a_constant_tensor_in_forward_must_be_a_single_number() -> None:
    source = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x):
        return x * torch.tensor([1.0, 2.0, 3.0, 4.0], device=x.device)

def get_inputs():
    return [torch.randn(3, 4)]

def get_init_inputs():
    return []
'''
    from kforge.agents.expert.errors import UnsupportedError

    with pytest.raises(UnsupportedError, match="not a single number"):
        build_graph(capture_problem(source))
