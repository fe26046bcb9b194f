"""GPU rows of the VERIFY.md matrix: run on the H200 host (``pytest -m gpu``)."""

from __future__ import annotations

import pytest

from .conftest import SCALE_TANH, honest_with, verify

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _cuda(body: str, header: str = "") -> str:
    return honest_with(body, header=header)


def test_illegal_address_is_a_device_error_or_crash() -> None:
    src = _cuda("        import ctypes\n        torch.cuda.synchronize()\n"
                "        bad = torch.empty(0, device='cuda').data_ptr() + (1 << 40)\n"
                "        torch.cuda.caching_allocator_delete(bad)\n        return y")
    v = verify(src, platform="cuda", static=False)
    assert not v.ok and v.reason in {"device_error", "crashed"}


def test_200_gb_gpu_allocation_is_oom() -> None:
    v = verify(_cuda("        big = torch.empty(200 * 1024**3, dtype=torch.uint8, device='cuda')\n        return y"),
               platform="cuda", static=False)
    assert v.reason == "oom"


def test_side_stream_work_left_after_return() -> None:
    body = ("        s = torch.cuda.Stream()\n        out = torch.empty_like(y)\n"
            "        torch.cuda._sleep(100_000_000)\n"
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
