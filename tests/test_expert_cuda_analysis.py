"""The expert's CUDA analysis (kforge/agents/expert/analysis/cuda.py) on typed plan knobs."""

from __future__ import annotations

from typing import Any

from kforge.agents.expert.analysis import recommend
from kforge.agents.expert.plan.knobs import CudaGemm, CudaRow, Knobs
from kforge.schema import AnalysisRequest, Profile, Timing


def plan(kind: str, knobs: Knobs, failed: list[str] | None = None) -> dict[str, Any]:
    pattern = {"gemm": "gemm", "row": "row_reduction"}[kind]
    return {"platform": "cuda", "compiler": "fusion-v2", "kernels": [{"name": "k0", "kind": kind}],
            "knobs": {"k0": knobs.to_json()}, "dominant": "k0", "failed_precisions": failed or [],
            "graph": {"pattern": {"kind": pattern}}}


def request(ms: float, flops: float, nbytes: float, plan: dict[str, Any], policy: str = "strict") -> AnalysisRequest:
    timing = Timing(median_ms=ms, mean_ms=ms, cv=0.01, reps=20, min_ms=ms)
    profile = Profile(ok=True, device="cuda", candidate=timing, flops=flops, min_bytes=nbytes, peak_gbps=4000.0)
    return AnalysisRequest(problem_name="p", platform="cuda", policy=policy, candidate_source="", profile=profile,
                           plan=plan)


GEMM = plan("gemm", CudaGemm("ieee", 128, 128, 16))
ROWS = plan("row", CudaRow(256, 1))


def test_relaxed_gemm_moves_to_tf32_but_strict_never_does() -> None:
    relaxed = recommend(request(5.0, 1.4e11, 1e8, GEMM, "relaxed"))
    strict = recommend(request(5.0, 1.4e11, 1e8, GEMM, "strict"))
    assert relaxed.actions[0].params == {"precision": "tf32", "block_k": 32}
    assert all(a.params.get("precision") is None for a in strict.actions)
    assert strict.bottleneck == "compute" and strict.actions[0].params == {"block_k": 32}
    failed = recommend(request(5.0, 1.4e11, 1e8, plan("gemm", CudaGemm("ieee", 128, 128, 16), ["tf32"]), "relaxed"))
    assert all(a.kind != "precision" for a in failed.actions)  # the ladder never goes back


def test_memory_bound_reduction_gets_more_threads_until_bandwidth_is_used() -> None:
    slow = recommend(request(1.0, 1e6, 1e9, ROWS))  # 1 GB/ms = 1000 GB/s of 4000
    assert slow.bottleneck == "memory" and slow.actions[0].params == {"threads": 512, "rows": 1}
    fast = recommend(request(0.3, 1e6, 1e9, ROWS))  # 3333 GB/s: well used
    assert fast.actions == []
    per_thread = recommend(request(1.0, 1e6, 1e9, plan("row", CudaRow(1, 256))))
    assert per_thread.actions == []  # a thread a row: no wider row to try


def test_launch_bound_kernels_are_left_alone() -> None:
    assert recommend(request(0.005, 1e3, 1e3, ROWS)).bottleneck == "launch"
