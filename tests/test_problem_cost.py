"""FLOP and minimum-byte counts, and the generic ci shrink's budget."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from kforge.problem_cost import (
    CI_MAX_FLOPS,
    CI_MAX_INPUT_ELEMENTS,
    MIN_SHRINKABLE,
    count_costs,
    flops_and_bytes,
    generic_shrink,
)
from kforge.problems import load_problem, load_problem_source, problem_meta

pytestmark = pytest.mark.exclusive  # timings or wall-clock bounds: alone under xdist (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
STARTER = ROOT / "problems" / "starter"
LEVEL1 = ROOT / "problems" / "level1"


def test_square_matmul_flops_and_bytes_are_exact() -> None:
    problem = load_problem(LEVEL1 / "001_square_matmul.py", preset="ci")
    n = problem.sizes()["N"]
    flops, nbytes = flops_and_bytes(problem)
    assert flops == 2 * n**3
    assert nbytes == 3 * n * n * 4  # A and B read once, C written once, fp32


def test_full_size_gemm_counts_without_allocating() -> None:
    problem = load_problem(STARTER / "gemm_bias_relu.py", preset="full")
    m, k, n = 1024, 8192, 8192
    start = time.perf_counter()
    flops, nbytes = flops_and_bytes(problem)
    assert time.perf_counter() - start < 5.0, "full sizes are counted on the meta device"
    # 2*M*N*K for the GEMM, plus 1 FLOP per output element for the ReLU.
    assert flops == 2 * m * n * k + m * n
    assert nbytes == 4 * (m * k + n * k + n + m * n)


def test_rectangular_matmul_flops() -> None:
    problem = load_problem(STARTER / "matmul_sigmoid_scale.py", preset="ci")
    s = problem.sizes()
    flops, _ = flops_and_bytes(problem)
    gemm = 2 * s["M"] * s["N"] * s["K"]
    assert flops == gemm + 2 * s["M"] * s["N"]  # sigmoid and * 2.0 on [M, N]


def test_pointwise_and_reduction_estimates() -> None:
    relu = load_problem(LEVEL1 / "015_relu.py", preset="ci")
    b, d = relu.sizes()["batch_size"], relu.sizes()["dim"]
    assert flops_and_bytes(relu) == (b * d, 2 * b * d * 4)
    mean = load_problem(STARTER / "reduce_mean_rows.py", preset="ci")
    b, d = mean.sizes()["batch_size"], mean.sizes()["dim"]
    flops, nbytes = flops_and_bytes(mean)
    assert flops == b * d  # 1 FLOP per element of the reduced operand
    assert nbytes == (b * d + b) * 4


def test_shared_parameters_counted_once() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(64, 64, bias=False)
            self.b = self.a

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x))

    flops, nbytes, out = count_costs(Tied(), [torch.randn(8, 64)])
    assert out.shape == (8, 64)
    assert flops == 2 * (2 * 8 * 64 * 64)
    assert nbytes == 4 * (8 * 64 + 64 * 64 + 8 * 64)


def test_views_and_copies_are_free() -> None:
    class Shuffle(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.t().contiguous().view(-1).clone()

    flops, nbytes, _ = count_costs(Shuffle(), [torch.randn(16, 32)])
    assert flops == 0
    assert nbytes == 2 * 16 * 32 * 4


def test_problem_meta_uses_cost_counts() -> None:
    problem = load_problem(LEVEL1 / "001_square_matmul.py", preset="ci")
    meta = problem_meta(problem, check_degenerate=False)
    assert (meta.flops, meta.min_bytes) == flops_and_bytes(problem)
    assert meta.category == "gemm" and meta.degenerate == []


def test_causal_attention_floor_counts_only_the_unmasked_half() -> None:
    causal = load_problem(LEVEL1 / "042_causal_attention.py", preset="ci")
    full = load_problem(LEVEL1 / "041_attention.py", preset="ci")
    assert causal.module.FLOP_FRACTION == 0.5
    with torch.device("meta"):  # as flops_and_bytes counts: SDPA decomposes into its math
        counted = count_costs(causal.module.Model(), causal.get_inputs())[0]
        plain = count_costs(full.module.Model(), full.get_inputs())[0]
    assert counted > 2 * 2 * 4 * 256 * 256 * 64  # QK^T and PV were counted
    assert flops_and_bytes(causal)[0] == counted / 2
    assert flops_and_bytes(full)[0] == plain


def test_flop_fraction_outside_zero_one_is_an_error() -> None:
    import types

    from kforge.problem_cost import flop_fraction

    for bad in (0, 1.5, "half", True):
        with pytest.raises(ValueError, match="FLOP_FRACTION"):
            flop_fraction(types.SimpleNamespace(FLOP_FRACTION=bad))  # type: ignore[arg-type]
    assert flop_fraction(types.SimpleNamespace()) == 1.0  # type: ignore[arg-type]


def test_generic_shrink_respects_budget_and_small_constants() -> None:
    source = textwrap.dedent(
        """
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self, c_in, c_out, k):
                super().__init__()
                self.conv = nn.Conv2d(c_in, c_out, k)
            def forward(self, x):
                return self.conv(x)

        batch_size = 64
        c_in = 128
        c_out = 256
        k = 7
        side = 512

        def get_inputs():
            return [torch.randn(batch_size, c_in, side, side)]

        def get_init_inputs():
            return [c_in, c_out, k]
        """
    )
    problem = load_problem_source(source, "conv", preset="none")
    original = problem.sizes()
    changed = generic_shrink(problem.module, original)
    assert changed and "k" not in changed
    assert all(v < original[key] and v >= MIN_SHRINKABLE // 2 for key, v in changed.items())
    shrunk = load_problem_source(source, "conv", preset="ci")
    assert shrunk.sizes() == {**original, **changed}
    flops, _ = flops_and_bytes(shrunk)
    assert flops <= CI_MAX_FLOPS
    assert shrunk.get_inputs()[0].numel() <= CI_MAX_INPUT_ELEMENTS
    assert problem.sizes() == original, "probing restores the module's sizes"


def test_generic_shrink_leaves_a_size_that_eases_nothing_over_budget() -> None:
    """A net whose parameters alone are over budget (they are its architecture's): halving its
    input's side shrinks no measure over the budget, so the side stays (at 14 x 14 a ResNet's
    BatchNorm saw two values per channel); the channel width, which shrinks the parameters, is
    halved until they fit."""
    source = textwrap.dedent(
        """
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self, width):
                super().__init__()
                self.conv = nn.Conv2d(3, width, 3)
                self.fc = nn.Linear(width, width * 4096)
            def forward(self, x):
                return self.fc(self.conv(x).mean((2, 3)))

        width = 256
        side = 64

        def get_inputs():
            return [torch.randn(2, 3, side, side)]

        def get_init_inputs():
            return [width]
        """
    )
    problem = load_problem_source(source, "wide", preset="none")
    changed = generic_shrink(problem.module, problem.sizes())
    assert "side" not in changed, changed
    assert changed["width"] < 256
    assert load_problem_source(source, "wide", preset="ci").sizes()["side"] == 64
