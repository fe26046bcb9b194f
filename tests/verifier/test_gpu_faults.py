"""GPU rows of the VERIFY.md matrix: run on the H200 host (``pytest -m gpu``)."""

from __future__ import annotations

import pytest

from kforge.verifier import profile_candidate
from kforge.verifier.repeats import REPEATS

from .conftest import SCALE_TANH, assert_nothing_left, honest_with, verify

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

# A Triton kernel that stores one float 2**40 elements (4 TiB) past a tensor's start: no
# allocation is mapped there, so the GPU raises an illegal address (error 700) for real.
POKE = """
import triton
import triton.language as tl


@triton.jit
def _poke(ptr, offset):
    tl.store(ptr + offset, 1.0)


_CALLS = [0]
"""
FAR = "1 << 40"


def _cuda(body: str, header: str = "") -> str:
    return honest_with(body, header=header)


def test_illegal_address_is_a_device_error_or_crash() -> None:
    src = _cuda(f"        _poke[(1,)](y, {FAR})\n        return y", header=POKE)
    v = verify(src, platform="cuda", static=False)
    assert not v.ok and v.reason in {"device_error", "crashed"}, v
    if v.reason == "device_error":
        assert "illegal" in v.detail.lower() or "CUDA error" in v.detail, v.detail
    assert (torch.ones(1, device="cuda") + 1).item() == 2  # this process's GPU is unharmed


# The verifier calls ModelNew max(trials, 4) times, once at other sizes, then REPEATS times
# and once on a fresh instance in the repeat phase (one process, one module-level counter);
# the profile's fresh process calls it warmup + reps times. A fault after FAULT_AFTER calls
# passes the first and breaks the second. (With FAULT_AFTER = 8, written before the repeat
# phase existed, the H100 run of 2026-12-07 saw the fault in the repeat phase: stale_output.)
TRIALS, WARMUP, REPS = 3, 3, 40
FAULT_AFTER = 30


def test_cuda_error_during_timing_after_correctness_passed() -> None:
    correctness_calls = max(TRIALS, 4) + 1 + REPEATS + 1
    assert correctness_calls < FAULT_AFTER < WARMUP + REPS
    body = ("        _CALLS[0] += 1\n"
            f"        if _CALLS[0] > {FAULT_AFTER}:\n"
            f"            _poke[(1,)](y, {FAR})\n"
            "        return y")
    src = _cuda(body, header=POKE)
    v = verify(src, platform="cuda", static=False, trials=TRIALS)
    assert v.ok, v  # correct on every call the verifier makes
    p = profile_candidate(src, SCALE_TANH, platform="cuda", warmup=WARMUP, reps=REPS, timeout_s=180)
    assert_nothing_left()
    assert not p.ok and p.reason in {"device_error", "crashed"}, p
    assert p.candidate is None and p.eager is None and p.compiled is None, p  # no timing stands
    assert "speedup" not in p.extra and p.roofline_ms == 0.0, p


def test_200_gb_gpu_allocation_is_oom() -> None:
    v = verify(_cuda("        big = torch.empty(200 * 1024**3, dtype=torch.uint8, device='cuda')\n        return y"),
               platform="cuda", static=False)
    assert v.reason == "oom"


def test_side_stream_work_left_after_return() -> None:
    # The answer lands on a side stream ~25 ms after forward returns; nothing on the current
    # stream waits for it, so event timing there would see almost no work. (The first version
    # of this test also slept 50 ms on the current stream, which hid the side stream's work
    # behind it: that candidate was merely slow, and the H200 run failed the test.)
    body = ("        torch.cuda.synchronize()\n        s = torch.cuda.Stream()\n        out = torch.empty_like(y)\n"
            "        with torch.cuda.stream(s):\n            torch.cuda._sleep(50_000_000)\n            out.copy_(y)\n"
            "        return out")
    v = verify(_cuda(body), platform="cuda", static=False)
    assert v.reason in {"async_work_left", "output_mismatch", "nonfinite"}


def test_endless_kernel_times_out_and_gpu_stays_usable() -> None:
    v = verify(_cuda("        torch.cuda._sleep(1 << 62)\n        torch.cuda.synchronize()\n        return y"),
               platform="cuda", static=False, timeout_s=10)
    assert v.reason == "timeout"
    assert (torch.ones(1, device="cuda") + 1).item() == 2


assert SCALE_TANH.exists()
