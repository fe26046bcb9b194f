"""Generated CPU candidates compile and match the reference on odd shapes, for several plans."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from kforge.agents.expert.cpu_codegen import generate_cpu_candidate
from kforge.agents.expert.graph import trace_problem
from kforge.agents.expert.plans import CpuPlan, initial_plan
from kforge.platforms import cpu_runtime
from tests.test_expert_helpers import STARTER_NAMES, compare, odd_problem, run_candidate

PLANS = {
    "round0": initial_plan("any"),
    "simd_packed": CpuPlan(simd=True, unroll=2, fuse_epilogue=True, gemm_kernel="packed"),
    "best": CpuPlan(simd=True, unroll=4, passes=2, fuse_epilogue=True, gemm_kernel="avx2"),
    "odd_tiles_1thread": CpuPlan(threads=False, simd=True, gemm_kernel="avx2", mr=5, nr=8, kc=32,
                                 mc=12, nc=24),
}


@pytest.fixture(scope="module")
def sources() -> dict[tuple[str, str], str]:
    """Every (problem, plan) candidate, with the distinct C++ sources built two at a time."""
    out = {}
    for name in STARTER_NAMES:
        problem = odd_problem(name)
        graph = trace_problem(problem.source)
        for plan_name, plan in PLANS.items():
            out[(name, plan_name)] = generate_cpu_candidate(graph, plan, problem.source)
    cpps = sorted({cpu_runtime.extract_cpp_source(s) for s in out.values()})
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(cpu_runtime.build_library, cpps))
    return out


@pytest.mark.parametrize("plan_name", list(PLANS))
@pytest.mark.parametrize("name", STARTER_NAMES)
def test_candidate_matches_reference_on_odd_shapes(
    sources: dict[tuple[str, str], str], name: str, plan_name: str
) -> None:
    problem = odd_problem(name)
    candidate = run_candidate(sources[(name, plan_name)])
    for seed in (0, 1):
        ok, err = compare(problem, candidate, seed)
        assert ok, f"{name} under {plan_name}: max abs error {err}"


def test_plans_really_change_the_kernel(sources: dict[tuple[str, str], str]) -> None:
    for name in STARTER_NAMES:
        assert sources[(name, "round0")] != sources[(name, "best")], name
    gemm = sources[("gemm_gelu_scale", "round0")]
    assert "kf_epilogue" in gemm and "_mm256_fmadd_ps" not in gemm
    best = sources[("gemm_gelu_scale", "best")]
    assert "kf_epilogue" not in best and "_mm256_fmadd_ps" in best


def test_generation_is_deterministic() -> None:
    problem = odd_problem("softmax_rows")
    graph = trace_problem(problem.source)
    first = generate_cpu_candidate(graph, PLANS["best"], problem.source)
    assert first == generate_cpu_candidate(trace_problem(problem.source), PLANS["best"], problem.source)


def test_candidate_never_calls_reference_ops(sources: dict[tuple[str, str], str]) -> None:
    banned = ("torch.matmul", "F.linear", "torch.softmax", "torch.tanh(", "F.gelu", "torch.sigmoid(",
              "self.linear(", "self.norm(", "Model(")
    for key, src in sources.items():
        forward = src[src.index("def forward"):]
        assert not any(b in forward for b in banned), key
        assert "try:" not in src, key


def test_layout_and_tails_beyond_odd_sizes() -> None:
    """Shapes that exercise every edge: single row, single column, K smaller than one lane."""
    import torch

    problem = odd_problem("matmul_sigmoid_scale")
    graph = trace_problem(problem.source)
    cand = run_candidate(generate_cpu_candidate(graph, PLANS["best"], problem.source))
    for m, k, n in ((1, 1, 1), (7, 3, 17), (13, 300, 33)):
        a, b = torch.randn(m, k), torch.randn(k, n)
        expected = torch.sigmoid(a @ b) * 2.0
        assert torch.allclose(cand.ModelNew()(a, b), expected, atol=1e-4, rtol=1e-4), (m, k, n)
