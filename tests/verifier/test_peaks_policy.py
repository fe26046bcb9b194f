"""The roofline's matmul ceiling follows the precision policy."""

from __future__ import annotations


def test_policy_ceiling_admits_tf32x3_under_strict_and_bf16_under_relaxed() -> None:
    from kforge.verifier.peaks import Peaks, policy_matmul_gflops

    h200 = Peaks(host="h", device="cuda", device_name="H200", copy_gbps=3800, matmul_gflops=50_000,
                 tf32_gflops=400_000, bf16_gflops=700_000)
    assert policy_matmul_gflops(h200, "strict") == 200_000  # tf32x3 at 76 TFLOP/s is not flagged
    assert policy_matmul_gflops(h200, "relaxed") == 700_000
    cpu = Peaks(host="h", device="cpu", device_name="x", copy_gbps=20, matmul_gflops=150)
    assert policy_matmul_gflops(cpu, "strict") == policy_matmul_gflops(cpu, "relaxed") == 150


def test_a_cache_resident_working_set_is_bounded_by_cache_bandwidth() -> None:
    from kforge.schema import Profile, Timing
    from kforge.verifier.peaks import Peaks
    from kforge.verifier.profiling import roofline

    # 30 MB read in 1.2 ms = 25 GB/s: faster than a 20 GB/s DRAM copy, slower than cache.
    t = Timing(median_ms=1.2, mean_ms=1.2, cv=0.01, reps=20, min_ms=1.2)
    host = Peaks(host="h", device="cpu", device_name="x", copy_gbps=20.0, matmul_gflops=100.0,
                 cache_copy_gbps=50.0)
    assert roofline(Profile(ok=True, candidate=t, flops=1e6, min_bytes=3e7), host).ok
    dram_only = host.model_copy(update={"cache_copy_gbps": 0.0})
    assert roofline(Profile(ok=True, candidate=t, flops=1e6, min_bytes=3e7), dram_only).reason == "beats_roofline"
