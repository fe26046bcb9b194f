from __future__ import annotations

import pytest

from kforge.agents.expert import ExpertAgent
from kforge.agents.expert.plans import CpuPlan, apply_actions, safer_plan
from kforge.config import AgentConfig
from kforge.platforms.base import load_example
from kforge.schema import (
    AnalysisRequest,
    Feedback,
    GenerationRequest,
    KernelStat,
    Profile,
    Recommendation,
    Timing,
)
from tests.test_expert_helpers import STARTER

AGENT = ExpertAgent(AgentConfig(kind="expert", model="kforge/expert-v1"))


def request(name: str, **kw: object) -> GenerationRequest:
    data = dict(problem_name=name, problem_source=(STARTER / f"{name}.py").read_text(), platform="cpu",
                example=load_example("cpu"), policy="strict", round=0)
    data.update(kw)
    return GenerationRequest(**data)  # type: ignore[arg-type]


def profile(ms: float, flops: float, nbytes: float, kernels: int = 1) -> Profile:
    t = Timing(median_ms=ms, mean_ms=ms, cv=0.01, reps=20, min_ms=ms)
    return Profile(ok=True, candidate=t, eager=t, flops=flops, min_bytes=nbytes,
                   achieved_gflops=flops / ms / 1e6, achieved_gbps=nbytes / ms / 1e6,
                   peak_gflops=150.0, peak_gbps=20.0, roofline_ms=max(flops / 150e6, nbytes / 20e6),
                   kernels=[KernelStat(name=f"kforge::k{i}", calls=20, total_us=ms * 1e3) for i in range(kernels)])


def analyse(result_plan: dict, source: str, prof: Profile, name: str = "p") -> Recommendation:
    req = AnalysisRequest(problem_name=name, platform="cpu", policy="strict", candidate_source=source,
                          plan=result_plan, profile=prof)
    return AGENT.analyze(req).recommendation


def test_round0_is_conservative_and_transcribed() -> None:
    result = AGENT.generate(request("softmax_rows"))
    assert result.source and result.extraction == "ok"
    assert result.plan["cpu"]["simd"] is False and result.plan["graph"]["pattern"]["kind"] == "row_reduction"
    t = result.transcript
    assert (t.agent, t.model, t.role, t.response) == ("expert", "kforge/expert-v1", "generate", result.source)
    assert t.messages[0]["role"] == "system" and t.usage.prompt_tokens == 0 and t.usage.cost_usd == 0.0


def test_generation_is_byte_identical_for_identical_requests() -> None:
    a, b = AGENT.generate(request("gemm_bias_relu")), AGENT.generate(request("gemm_bias_relu"))
    assert a.model_dump_json() == b.model_dump_json()


def test_memory_and_compute_bound_profiles_get_different_actions() -> None:
    ew = AGENT.generate(request("elementwise_swish_bias"))
    mem = analyse(ew.plan, ew.source or "", profile(5.0, 1e6, 8e6))
    gemm = AGENT.generate(request("gemm_bias_relu"))
    comp = analyse(gemm.plan, gemm.source or "", profile(30.0, 5e8, 4e6, kernels=1))
    assert mem.bottleneck == "memory" and comp.bottleneck == "compute"
    assert {a.kind for a in comp.actions} - {a.kind for a in mem.actions} == {"tile"}
    assert all("bw_util" in a.rationale for a in mem.actions)
    tiny = analyse(ew.plan, ew.source or "", profile(0.005, 1e3, 8e3))
    assert tiny.bottleneck == "latency" and {"threads": False} in [a.params for a in tiny.actions]


def test_recommendations_improve_rounds_until_nothing_is_left() -> None:
    req = request("gemm_gelu_scale")
    result = AGENT.generate(req)
    seen = [result.plan["cpu"]]
    for rnd in range(1, 5):
        rec = analyse(result.plan, result.source or "", profile(30.0 / rnd, 5e8, 4e6, kernels=2))
        result = AGENT.generate(req.model_copy(update=dict(
            round=rnd, previous_source=result.source, previous_plan=result.plan, recommendation=rec)))
        seen.append(result.plan["cpu"])
    assert seen[1]["gemm_kernel"] == "avx2" and seen[1]["simd"] and seen[1]["fuse_epilogue"]
    assert seen[-1] == seen[-2]  # converged: same plan, so same source bytes


def test_functional_failure_steps_back_and_says_why() -> None:
    good = AGENT.generate(request("gemm_bias_relu"))
    plan = dict(good.plan, cpu=CpuPlan(simd=True, gemm_kernel="avx2", fuse_epilogue=True).model_dump())
    fb = [Feedback(stage="verify", reason="mismatch", detail="max abs err 3.0")]
    result = AGENT.generate(request("gemm_bias_relu", round=1, previous_plan=plan, feedback=fb))
    assert result.plan["cpu"]["gemm_kernel"] == "packed"
    assert "verify:mismatch" in result.plan["cpu"]["notes"][-1]


def test_safer_plan_bottoms_out() -> None:
    plan = CpuPlan(simd=True, unroll=4, passes=2, fuse_epilogue=True, gemm_kernel="avx2")
    for _ in range(12):
        plan = safer_plan(plan, "x")
    assert plan == safer_plan(plan, "x")
    assert (plan.threads, plan.simd, plan.gemm_kernel) == (False, False, "naive")


def test_apply_actions_ignores_unknown_kinds() -> None:
    from kforge.schema import Action

    plan = CpuPlan()
    assert apply_actions(plan, [Action(kind="precision", params={"dtype": "bf16"})]) == plan


@pytest.mark.parametrize(
    "source,platform,expect",
    [("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return torch.cumsum(x, -1)\n"
      "def get_inputs():\n    return [torch.randn(2, 3)]\ndef get_init_inputs():\n    return []\n", "cpu", "cumsum"),
     (None, "metal", "no 'metal' code generator")],
)
def test_unsupported_gives_a_clear_result(source: str | None, platform: str, expect: str) -> None:
    req = request("softmax_rows", platform=platform)
    if source is not None:
        req = req.model_copy(update={"problem_source": source})
    result = AGENT.generate(req)
    assert result.source is None and result.extraction.startswith("unsupported: ")
    assert expect in result.extraction and result.transcript.error == result.extraction


def test_analysis_of_a_failed_profile_is_unknown() -> None:
    result = AGENT.generate(request("softmax_rows"))
    rec = analyse(result.plan, result.source or "", Profile(ok=False, reason="timeout"))
    assert rec.bottleneck == "unknown" and not rec.actions
