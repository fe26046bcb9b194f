"""The expert's performance analysis for CUDA C++ candidates: profile -> next plan change.

Places the candidate against the device's ceilings (measured peaks from the profile when
present, else the H200's: ~60 TFLOP/s fp32 FMA, ~400 TFLOP/s TF32 tensor cores, ~4.3 TB/s)
and proposes plan-key changes for :func:`kforge.agents.expert.cuda_codegen.generate_cuda`:
the next round's plan is ``{**plan, **action.params}``. Precision never leaves the policy.
"""

from __future__ import annotations

from typing import Any

from kforge.agents.expert.analysis.triton import pattern_kind
from kforge.schema import Action, AnalysisRequest, Recommendation

PEAK_GFLOPS = {"fp32": 60_000.0, "tf32": 400_000.0}
PEAK_GBPS = 4_300.0
LAUNCH_BOUND_MS = 0.02
WELL_USED = 0.6


def _rates(request: AnalysisRequest, precision: str) -> dict[str, float]:
    p = request.profile
    ms = p.candidate.median_ms if p.candidate else 0.0
    peak_flops = PEAK_GFLOPS.get(precision, PEAK_GFLOPS["fp32"])
    peak_bw = p.peak_gbps or PEAK_GBPS
    gflops = p.flops / (ms * 1e6) if ms > 0 else 0.0
    gbps = p.min_bytes / (ms * 1e6) if ms > 0 else 0.0
    return {
        "candidate_ms": ms,
        "achieved_gflops": gflops,
        "achieved_gbps": gbps,
        "compute_fraction": gflops / peak_flops if peak_flops else 0.0,
        "bandwidth_fraction": gbps / peak_bw if peak_bw else 0.0,
    }


def _gemm_actions(plan: dict[str, Any], policy: str, ev: dict[str, float]) -> list[Action]:
    actions: list[Action] = []
    if policy == "relaxed" and plan.get("precision") == "fp32":
        actions.append(Action(kind="precision", params={"precision": "tf32"}, expected_gain=4.0,
                              rationale=f"fp32 FMA at {ev['compute_fraction']:.0%} of its peak; the relaxed "
                                        "policy allows TF32 tensor cores with fp32 accumulation"))
    if ev["compute_fraction"] < WELL_USED and plan.get("block_k", 32) < 32:
        actions.append(Action(kind="tile", params={"block_k": 32}, expected_gain=1.15,
                              rationale="a deeper K tile halves the barriers per FLOP"))
    return actions


def _memory_actions(plan: dict[str, Any], ev: dict[str, float]) -> list[Action]:
    actions: list[Action] = []
    if ev["bandwidth_fraction"] >= WELL_USED:
        return actions
    if plan.get("vector_width", 4) < 4:
        actions.append(Action(kind="vectorize", params={"vector_width": 4}, expected_gain=1.3,
                              rationale="float4 loads move four elements per instruction"))
    block = int(plan.get("block_size", 256))
    if block < 1024:
        actions.append(Action(kind="block_size", params={"block_size": block * 2}, expected_gain=1.1,
                              rationale=f"{ev['bandwidth_fraction']:.0%} of copy bandwidth: more threads "
                                        "in flight per SM hide memory latency"))
    return actions


def analyze_cuda(request: AnalysisRequest, plan: dict[str, Any]) -> Recommendation:
    kind = pattern_kind(plan)
    ev = _rates(request, str(plan.get("precision", "fp32")))
    if 0 < ev["candidate_ms"] < LAUNCH_BOUND_MS:
        return Recommendation(bottleneck="launch", evidence=ev,
                              summary="the kernel runs in launch-overhead time: nothing to tune")
    if kind == "gemm":
        actions = _gemm_actions(plan, request.policy, ev)
        bottleneck = "compute"
        summary = f"GEMM at {ev['achieved_gflops']:.0f} GFLOP/s ({ev['compute_fraction']:.0%} of peak)"
    else:
        actions = _memory_actions(plan, ev)
        bottleneck = "memory"
        summary = f"{kind} at {ev['achieved_gbps']:.0f} GB/s ({ev['bandwidth_fraction']:.0%} of peak)"
    return Recommendation(bottleneck=bottleneck, evidence=ev, actions=actions[:3], summary=summary)
