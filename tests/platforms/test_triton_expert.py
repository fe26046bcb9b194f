"""The expert's Triton generator and analysis, without running kernels (interpreted runs of
generated kernels are in test_triton_platform.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kforge.agents.expert.analysis.triton import analyze_triton, pattern_kind
from kforge.agents.expert.triton_codegen import (
    PlanError,
    default_plan,
    generate_triton,
    resolve_plan,
)
from kforge.platforms.triton import static_check
from kforge.schema import AnalysisRequest, Profile, Timing

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]


def trace(name: str) -> Any:
    from kforge.agents.expert.fx_lower import lower_module
    from kforge.problems import load_problem

    problem = load_problem(ROOT / "problems" / "starter" / f"{name}.py", preset="ci")
    with torch.device("meta"):
        return lower_module(problem.Model(*problem.get_init_inputs()), problem.get_inputs())


@pytest.mark.parametrize(
    "name",
    [
        "elementwise_swish_bias",
        "softmax_rows",
        "layernorm_rows",
        "reduce_max_rows",
        "gemm_gelu_scale",
    ],
)
@pytest.mark.parametrize("policy", ["strict", "relaxed"])
def test_generated_source_passes_platform_static_check(name: str, policy: str) -> None:
    source = generate_triton(trace(name), {}, policy)
    assert static_check(source) == []
    compile(source, "<generated>", "exec")
    assert "torch.matmul" not in source and "F.linear" not in source and "softmax(" not in source


def test_strict_policy_rejects_lossy_precision() -> None:
    ir = trace("gemm_bias_relu")
    for precision in ("tf32", "bf16", "bf16x2"):
        with pytest.raises(PlanError, match="not allowed under the strict policy"):
            generate_triton(ir, {"precision": precision}, "strict")
    assert "a_lo" in generate_triton(ir, {"precision": "bf16x3"}, "strict")  # a split product is strict
    assert "input_precision='tf32x3'" in generate_triton(ir, {}, "strict")
    assert "tl.bfloat16" in generate_triton(ir, {}, "relaxed")


def test_plan_values_are_checked() -> None:
    ir = trace("gemm_bias_relu")
    with pytest.raises(PlanError, match="power of two"):
        resolve_plan(ir, {"BLOCK_M": 96}, "strict")
    with pytest.raises(PlanError, match="positive integer"):
        resolve_plan(ir, {"num_warps": 0}, "strict")
    with pytest.raises(PlanError, match="unknown precision policy"):
        resolve_plan(ir, {}, "fast")
    assert resolve_plan(ir, {"BLOCK_N": 64, "unrelated": 1}, "strict")["BLOCK_N"] == 64


def test_knobs_reach_the_source() -> None:
    ir = trace("matmul_sigmoid_scale")
    source = generate_triton(
        ir, {"BLOCK_M": 64, "BLOCK_N": 32, "num_stages": 5, "GROUP_M": 4}, "strict"
    )
    assert "BLOCK_M=64, BLOCK_N=32" in source and "num_stages=5" in source and "GROUP_M=4" in source
    assert "b_op.stride(0), b_op.stride(1)" in source  # [K, N] right operand read as is
    linear = generate_triton(trace("gemm_bias_relu"), {}, "strict")
    assert "b_op.stride(1), b_op.stride(0)" in linear and "nn.Linear(" in linear


def test_row_reduction_plan_picks_single_tile_or_loop() -> None:
    ir = trace("softmax_rows")
    assert default_plan(ir, "strict")["BLOCK_N"] >= ir.pattern.cols
    assert "for c0 in range" not in generate_triton(ir, {}, "strict")
    assert "for c0 in range" in generate_triton(ir, {"BLOCK_N": 512}, "strict")


def _request(policy: str, ms: float, kernels: int = 1) -> AnalysisRequest:
    def timing(v: float) -> Timing:
        return Timing(median_ms=v, mean_ms=v, cv=0.01, reps=20, min_ms=v)

    from kforge.schema import KernelStat

    profile = Profile(
        ok=True,
        device="cuda",
        candidate=timing(ms),
        eager=timing(2.7),
        compiled=timing(2.7),
        kernels=[KernelStat(name=f"k{i}", calls=1, total_us=ms * 1000) for i in range(kernels)],
        flops=2.0 * 1024 * 8192 * 8192,
        min_bytes=4.0 * (2 * 1024 * 8192 + 8192 * 8192),
    )
    return AnalysisRequest(
        problem_name="p", platform="triton", policy=policy, candidate_source="", profile=profile
    )


GEMM_PLAN = {
    "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 8, "num_stages": 3,
    "precision": "tf32x3", "graph": {"pattern": {"kind": "gemm", "m": 1024, "n": 8192, "k": 8192}},
}  # fmt: skip


def test_analysis_moves_precision_only_within_policy() -> None:
    relaxed = analyze_triton(_request("relaxed", 1.6), GEMM_PLAN)
    assert relaxed.bottleneck == "compute"
    assert (
        relaxed.actions[0].kind == "precision" and relaxed.actions[0].params["precision"] == "fp16"
    )
    strict = analyze_triton(_request("strict", 1.6), GEMM_PLAN)
    assert all(a.params.get("precision") in (None, "tf32x3", "ieee") for a in strict.actions)
    assert {"BLOCK_N", "num_stages"} & {k for a in strict.actions for k in a.params}


def test_analysis_near_roofline_proposes_nothing_more() -> None:
    fast = analyze_triton(_request("strict", 137.4 / 130.0), GEMM_PLAN)  # ~130 TFLOP/s of tf32x3
    assert fast.actions == [] and "near the roofline" in fast.summary


def test_analysis_flags_extra_launches_and_missing_profile() -> None:
    assert analyze_triton(_request("strict", 1.6, kernels=4), GEMM_PLAN).bottleneck == "launch"
    bad = _request("strict", 1.0).model_copy(
        update={"profile": Profile(ok=False, reason="timeout")}
    )
    assert analyze_triton(bad, GEMM_PLAN).bottleneck == "unknown"


def test_analysis_row_reduction_prefers_single_tile() -> None:
    plan = {
        "BLOCK_N": 1024,
        "num_warps": 4,
        "graph": {"pattern": {"kind": "row_reduction", "cols": 16384}},
    }
    assert pattern_kind(plan) == "row_reduction"
    rec = analyze_triton(_request("strict", 5.0), plan)
    assert rec.bottleneck == "memory" and rec.actions[0].params["BLOCK_N"] == 16384


def test_safer_plan_after_failures() -> None:
    from kforge.agents.expert.triton_codegen import safer_plan

    ir = trace("matmul_sigmoid_scale")
    after_mismatch = safer_plan(ir, {"precision": "bf16"}, "relaxed", "mismatch: max abs 0.15")
    assert after_mismatch["precision"] == "bf16x3"
    after_smem = safer_plan(ir, {"num_stages": 4}, "strict", "triton OutOfResources: shared memory")
    assert after_smem["num_stages"] == 3 and after_smem["precision"] == "tf32x3"
    assert safer_plan(ir, {"BLOCK_M": 16}, "strict", "timeout") == default_plan(ir, "strict")


def test_gemm_pipeline_is_fitted_to_shared_memory() -> None:
    from kforge.agents.expert.triton_codegen import SMEM_LIMIT, gemm_smem_bytes

    ir = trace("matmul_sigmoid_scale")
    plan = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_stages": 3}
    asked = {**default_plan(ir, "relaxed"), **plan, "precision": "bf16x3", "precast": 1}
    assert gemm_smem_bytes(asked) == 294912  # what Triton 3.6 reported on the H200
    knobs = resolve_plan(ir, {**plan, "precision": "bf16x3", "precast": 1}, "relaxed")
    assert gemm_smem_bytes(knobs) <= SMEM_LIMIT and knobs["num_stages"] == 2
    assert resolve_plan(ir, {}, "strict")["num_stages"] == default_plan(ir, "strict")["num_stages"]


def test_recommend_reads_the_expert_plan_layout() -> None:
    from kforge.agents.expert.analysis.triton import recommend

    flat = {"platform": "triton", **GEMM_PLAN}
    request = _request("relaxed", 1.6).model_copy(update={"plan": flat})
    assert recommend(request).actions[0].params["precision"] == "fp16"
    nested = {
        "platform": "triton",
        "graph": GEMM_PLAN["graph"],
        "triton": dict(GEMM_PLAN, precision="bf16"),
    }
    request = _request("relaxed", 1.6).model_copy(update={"plan": nested})
    assert all(a.kind != "precision" for a in recommend(request).actions)
