"""The expert's performance analysis for CUDA candidates: profile -> next knob change.

Places the candidate against the device's ceilings (the precision table's peak of the dominant
GEMM's step, the profile's measured bandwidth else the H200's ~4.3 TB/s) and proposes changes
to the dominant kernel's knobs (:class:`~kforge.agents.expert.plan.knobs.CudaGemm`, ``CudaRow``,
``CudaPointwise``). Precision never leaves the policy: a relaxed GEMM at ieee moves to tf32.
"""

from __future__ import annotations

from kforge.agents.expert.plan.knobs import CudaGemm, CudaPointwise, CudaRow, CudaScan, ProgramKnobs
from kforge.agents.expert.plan.precision import STEPS
from kforge.agents.expert.plan.record import ExpertPlan
from kforge.schema import Action, AnalysisRequest, Recommendation

PEAK_GBPS = 4_300.0
LAUNCH_BOUND_MS = 0.02
WELL_USED = 0.6


def _rates(request: AnalysisRequest, precision: str) -> dict[str, float]:
    p = request.profile
    ms = p.candidate.median_ms if p.candidate else 0.0
    peak_flops = p.peak_gflops or STEPS[precision].peak_gflops
    peak_bw = p.peak_gbps or PEAK_GBPS
    gflops = p.flops / (ms * 1e6) if ms > 0 else 0.0
    gbps = p.min_bytes / (ms * 1e6) if ms > 0 else 0.0
    return {"candidate_ms": ms, "achieved_gflops": gflops, "achieved_gbps": gbps,
            "compute_fraction": gflops / peak_flops if peak_flops else 0.0,
            "bandwidth_fraction": gbps / peak_bw if peak_bw else 0.0}


def _gemm_actions(plan: ExpertPlan, gemm: CudaGemm, policy: str, ev: dict[str, float]) -> list[Action]:
    actions: list[Action] = []
    if policy == "relaxed" and gemm.precision == "ieee" and "tf32" not in plan.failed_precisions:
        actions.append(Action(kind="precision", params={"precision": "tf32", "block_k": 32}, expected_gain=4.0,
                              rationale=f"fp32 FMA at {ev['compute_fraction']:.0%} of its peak; the relaxed "
                                        "policy allows TF32 tensor cores with fp32 accumulation"))
    if ev["compute_fraction"] < WELL_USED and gemm.precision == "ieee" and gemm.block_k < 32:
        actions.append(Action(kind="tile", params={"block_k": 32}, expected_gain=1.15,
                              rationale="a deeper K tile halves the barriers per FLOP"))
    return actions


def _memory_actions(knobs: CudaPointwise | CudaRow | CudaScan, ev: dict[str, float]) -> list[Action]:
    if ev["bandwidth_fraction"] >= WELL_USED:
        return []
    why = f"{ev['bandwidth_fraction']:.0%} of copy bandwidth: more threads in flight hide memory latency"
    if isinstance(knobs, CudaRow):
        if knobs.threads == 1 or knobs.threads >= 1024:
            return []
        wider = knobs.threads * 2
        return [Action(kind="block_size", params={"threads": wider, "rows": max(1, min(knobs.rows, 1024 // wider))},
                       expected_gain=1.1, rationale=why)]
    if knobs.threads < 1024:
        return [Action(kind="block_size", params={"threads": knobs.threads * 2}, expected_gain=1.1, rationale=why)]
    return []


def recommend_cuda(request: AnalysisRequest, plan: ExpertPlan, knobs: ProgramKnobs) -> Recommendation:
    kind = plan.graph.pattern.kind
    dom = knobs.kernels.get(plan.dominant or "")
    ev = _rates(request, dom.precision if isinstance(dom, CudaGemm) else "ieee")
    if 0 < ev["candidate_ms"] < LAUNCH_BOUND_MS:
        return Recommendation(bottleneck="launch", evidence=ev,
                              summary="the kernel runs in launch-overhead time: nothing to tune")
    if isinstance(dom, CudaGemm):
        actions = _gemm_actions(plan, dom, request.policy, ev)
        bottleneck = "compute"
        summary = f"GEMM at {ev['achieved_gflops']:.0f} GFLOP/s ({ev['compute_fraction']:.0%} of peak)"
    else:
        actions = _memory_actions(dom, ev) if dom is not None else []
        bottleneck = "memory"
        summary = f"{kind} at {ev['achieved_gbps']:.0f} GB/s ({ev['bandwidth_fraction']:.0%} of peak)"
    return Recommendation(bottleneck=bottleneck, evidence=ev, actions=actions[:3], summary=summary)
