"""The expert's Triton backend without a GPU: its candidates pass the platform's static check,
its knobs are validated and fitted, the policy bounds the precision, knobs reach the source;
and its analysis rules (kforge/agents/expert/analysis/triton.py) on a profiled GEMM.
(Interpreted runs: tests/platforms/test_triton_platform.py; the GPU: tests/platforms/.)"""

from __future__ import annotations

from typing import Any

import pytest

from kforge.agents.expert.analysis import recommend
from kforge.agents.expert.codegen.backend import get_backend, render_default
from kforge.agents.expert.codegen.triton.tiles import (
    SMEM_LIMIT,
    check,
    fit_shared_memory,
    gemm_smem_bytes,
)
from kforge.agents.expert.errors import PlanError
from kforge.agents.expert.plan.knobs import TritonGemm, TritonPointwise
from kforge.agents.expert.plan.planner import plan_problem
from kforge.platforms.triton import static_check
from kforge.schema import AnalysisRequest, KernelStat, Profile, Timing
from tests.test_expert_helpers import STARTER, gemm_knobs, triton_candidate

TRITON = get_backend("triton")


def program(name: str) -> Any:
    return plan_problem((STARTER / f"{name}.py").read_text())


@pytest.mark.parametrize("name", ["elementwise_swish_bias", "softmax_rows", "layernorm_rows", "reduce_max_rows",
                                  "gemm_gelu_scale"])
@pytest.mark.parametrize("policy", ["strict", "relaxed"])
def test_generated_source_passes_platform_static_check(name: str, policy: str) -> None:
    source = render_default(program(name), "triton", policy, (STARTER / f"{name}.py").read_text())
    assert static_check(source) == []
    compile(source, "<generated>", "exec")
    assert "torch.matmul" not in source and "F.linear" not in source and "softmax(" not in source


def test_strict_policy_rejects_lossy_precision() -> None:
    for precision in ("tf32", "bf16", "bf16x2", "fp16", "fp16x2"):
        with pytest.raises(PlanError, match="not allowed under the strict policy"):
            check(gemm_knobs(precision=precision), "strict")
    src = (STARTER / "gemm_bias_relu.py").read_text()
    assert "a_lo" in triton_candidate(program("gemm_bias_relu"), "strict", src, precision="bf16x3", b_regs=0)
    assert "input_precision='tf32x3'" in triton_candidate(program("gemm_bias_relu"), "strict", src,
                                                          precision="tf32x3", precast=0, b_regs=0, tma=0)
    assert "tl.float16" in render_default(program("gemm_bias_relu"), "triton", "relaxed", src)


def test_knob_values_are_checked() -> None:
    with pytest.raises(PlanError, match="power of two"):
        gemm_knobs(BLOCK_M=96)
    with pytest.raises(PlanError, match="num_warps"):
        gemm_knobs(num_warps=0)
    with pytest.raises(PlanError, match="positive integer"):
        gemm_knobs(num_stages=0)
    with pytest.raises(PlanError, match="unknown precision policy"):
        check(gemm_knobs(), "fast")
    with pytest.raises(PlanError, match="a step of the ladder"):
        gemm_knobs(precision="fp8")
    with pytest.raises(PlanError, match="BLOCK must be a power of two"):
        TritonPointwise(BLOCK=1000)
    knobs, unknown = gemm_knobs().with_params({"BLOCK_N": 64, "unrelated": 1})
    assert knobs.BLOCK_N == 64 and unknown == ["unrelated"]


def test_knobs_reach_the_source() -> None:
    src = (STARTER / "matmul_sigmoid_scale.py").read_text()
    source = triton_candidate(program("matmul_sigmoid_scale"), "strict", src, BLOCK_M=64, BLOCK_N=32, num_stages=5,
                              GROUP_M=4)
    assert "BLOCK_M=64, BLOCK_N=32" in source and "num_stages=5" in source and "GROUP_M=4" in source


def test_gemm_pipeline_is_fitted_to_shared_memory() -> None:
    asked = gemm_knobs(precision="bf16x3", BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=3, b_regs=0, tma=0)
    assert gemm_smem_bytes(asked) == 294912  # what Triton 3.6 reported on the H200
    fitted = fit_shared_memory(asked)
    assert gemm_smem_bytes(fitted) <= SMEM_LIMIT and fitted.num_stages == 2
    prog = program("matmul_sigmoid_scale")
    defaults = TRITON.default_knobs(prog, "strict")
    assert TRITON.fit(prog, defaults, "strict") == defaults  # round 0's knobs fit as they are


def _request(policy: str, ms: float, plan: dict[str, Any], kernels: int = 1) -> AnalysisRequest:
    def timing(v: float) -> Timing:
        return Timing(median_ms=v, mean_ms=v, cv=0.01, reps=20, min_ms=v)

    profile = Profile(ok=True, device="cuda", candidate=timing(ms), eager=timing(2.7), compiled=timing(2.7),
                      kernels=[KernelStat(name=f"k{i}", calls=1, total_us=ms * 1000) for i in range(kernels)],
                      flops=2.0 * 1024 * 8192 * 8192, min_bytes=4.0 * (2 * 1024 * 8192 + 8192 * 8192))
    return AnalysisRequest(problem_name="p", platform="triton", policy=policy, candidate_source="", profile=profile,
                           plan=plan)


def gemm_plan(knobs: TritonGemm) -> dict[str, Any]:
    """An expert plan of one GEMM kernel k0 of 1024 x 8192 x 8192."""
    return {"platform": "triton", "compiler": "fusion-v2", "kernels": [{"name": "k0", "kind": "gemm", "stores": 1}],
            "knobs": {"k0": knobs.to_json()}, "program_knobs": {"cuda_graph": 0}, "precision": knobs.precision,
            "dominant": "k0", "graph": {"pattern": {"kind": "gemm", "m": 1024, "n": 8192, "k": 8192}}}


TF32X3 = gemm_knobs(precision="tf32x3", BLOCK_N=128, BLOCK_K=32, precast=0, b_regs=0, tma=0)


def test_analysis_moves_precision_only_within_policy() -> None:
    relaxed = recommend(_request("relaxed", 1.6, gemm_plan(TF32X3)))
    assert relaxed.bottleneck == "compute"
    assert relaxed.actions[0].kind == "precision" and relaxed.actions[0].params["precision"] == "fp16"
    strict = recommend(_request("strict", 1.6, gemm_plan(TF32X3)))
    assert all(a.params.get("precision") in (None, "tf32x3", "ieee") for a in strict.actions)
    assert {"BLOCK_M", "BLOCK_N", "num_stages"} & {k for a in strict.actions for k in a.params}


def test_analysis_near_roofline_proposes_nothing_more() -> None:
    fast = recommend(_request("strict", 137.4 / 130.0, gemm_plan(TF32X3)))  # ~130 TFLOP/s of tf32x3
    assert fast.actions == [] and "near the roofline" in fast.summary


def test_analysis_flags_extra_launches_and_missing_profile() -> None:
    assert recommend(_request("strict", 1.6, gemm_plan(TF32X3), kernels=4)).bottleneck == "launch"
    bad = _request("strict", 1.0, gemm_plan(TF32X3)).model_copy(update={"profile": Profile(ok=False, reason="timeout")})
    assert recommend(bad).bottleneck == "unknown"


def test_analysis_needs_an_expert_plan_with_the_backends_knobs() -> None:
    other = recommend(_request("relaxed", 1.6, {"platform": "triton", "BLOCK_M": 128}))
    assert other.bottleneck == "unknown" and "no expert plan" in other.summary
    broken = gemm_plan(TF32X3)
    broken["knobs"]["k0"] = {"BLOCK_M": 128}  # not a whole record
    rec = recommend(_request("relaxed", 1.6, broken))
    assert rec.bottleneck == "unknown" and "not triton's" in rec.summary

