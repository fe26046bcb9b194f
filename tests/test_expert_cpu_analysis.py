"""The expert's CPU analysis (kforge/agents/expert/analysis/cpu.py): a GEMM's roofline fraction
is its rate against the FMA peak of the cores the profile timed it on."""

from __future__ import annotations

from typing import Any

from kforge.agents.expert.analysis import recommend
from kforge.agents.expert.plan.knobs import CpuKnobs
from kforge.schema import AnalysisRequest, Profile, Timing

GEMM: dict[str, Any] = {"platform": "cpu", "compiler": "fusion-v2", "kernels": [{"name": "k0", "kind": "gemm"}],
                        "knobs": {}, "program_knobs": CpuKnobs(mr=12, nr=32).to_json(), "dominant": "k0",
                        "failed_precisions": [], "graph": {"pattern": {"kind": "gemm"}}}


def request(gflops: float, extra: dict[str, Any]) -> AnalysisRequest:
    flops = 5.4e8  # 256 x 1024 x 1024
    ms = flops / gflops / 1e6
    timing = Timing(median_ms=ms, mean_ms=ms, cv=0.01, reps=20, min_ms=ms)
    profile = Profile(ok=True, device="cpu", candidate=timing, flops=flops, min_bytes=6.3e6, peak_gflops=530.0,
                      peak_gbps=136.0, achieved_gflops=gflops, achieved_gbps=6.3e6 / ms / 1e6,
                      roofline_ms=flops / 530e9 * 1e3, extra=extra)
    return AnalysisRequest(problem_name="p", platform="cpu", policy="strict", candidate_source="", profile=profile,
                           plan=GEMM)


def test_a_gemm_near_the_peak_of_the_cores_it_had_gets_no_new_blocks() -> None:
    """The dev host's AVX-512 GEMM: 187 GFLOP/s on 1 of 2 cores (peak 530 on both): 71% of its
    core's peak, not the 35% the whole host's peak says."""
    timed_on_one = recommend(request(187.0, {"pin": {"threads": 1, "cores": [0]}, "peak_cores": 2}))
    assert timed_on_one.actions == [] and "71%" in timed_on_one.summary
    unknown_cores = recommend(request(187.0, {}))  # no pin recorded: the host's peak is all there is
    assert unknown_cores.actions[0].params == {"mc": 192}
    slow = recommend(request(100.0, {"pin": {"threads": 1, "cores": [0]}, "peak_cores": 2}))
    assert slow.actions[0].params == {"mc": 192}  # 38% of its core: larger blocks are worth a round
