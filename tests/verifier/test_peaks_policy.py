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
