from __future__ import annotations

from kforge.agents.expert.analysis.cuda import analyze_cuda
from kforge.schema import AnalysisRequest, Profile, Timing


def request(ms: float, flops: float, nbytes: float, policy: str = "strict") -> AnalysisRequest:
    timing = Timing(median_ms=ms, mean_ms=ms, cv=0.01, reps=20, min_ms=ms)
    profile = Profile(ok=True, device="cuda", candidate=timing, flops=flops, min_bytes=nbytes, peak_gbps=4000.0)
    return AnalysisRequest(problem_name="p", platform="cuda", policy=policy, candidate_source="", profile=profile)


GEMM = {"graph": {"pattern": {"kind": "gemm"}}, "precision": "fp32", "block_k": 16}
ROWS = {"graph": {"pattern": {"kind": "row_reduction"}}, "block_size": 256, "vector_width": 4}


def test_relaxed_gemm_moves_to_tf32_but_strict_never_does() -> None:
    relaxed = analyze_cuda(request(5.0, 1.4e11, 1e8, "relaxed"), GEMM)
    strict = analyze_cuda(request(5.0, 1.4e11, 1e8, "strict"), GEMM)
    assert relaxed.actions[0].params == {"precision": "tf32"}
    assert all(a.params.get("precision") is None for a in strict.actions)
    assert strict.bottleneck == "compute" and strict.actions[0].params == {"block_k": 32}


def test_memory_bound_reduction_gets_more_threads_until_bandwidth_is_used() -> None:
    slow = analyze_cuda(request(1.0, 1e6, 1e9), ROWS)  # 1 GB/ms = 1000 GB/s of 4000
    assert slow.bottleneck == "memory" and slow.actions[0].params == {"block_size": 512}
    fast = analyze_cuda(request(0.3, 1e6, 1e9), ROWS)  # 3333 GB/s: well used
    assert fast.actions == []


def test_launch_bound_kernels_are_left_alone() -> None:
    assert analyze_cuda(request(0.005, 1e3, 1e3), ROWS).bottleneck == "launch"
