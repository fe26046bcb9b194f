"""GPU rows of issue 15 (``pytest -m gpu`` on a CUDA host): verification at the timed size with
the outputs compared on the device (CUDA IPC to the trusted judge), a full-size-only indexing
bug caught, and a clock forged inside the candidate's process caught by the parent's clock.
benchmarks/verify_gpu_check.py runs the whole table."""

from __future__ import annotations

import pytest

from kforge.verifier import profile_candidate
from kforge.verifier.verify import verify_candidate

from . import gpu_offenders as off
from .conftest import assert_nothing_left

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_full_size_verification_compares_on_the_device() -> None:
    v = verify_candidate(off.HONEST, off.PROBLEM, platform="triton", policy="strict", preset="full", timeout_s=240)
    assert_nothing_left()
    assert v.ok, (v.reason, v.detail)
    assert v.compared_on == "device" and v.preset == "full"
    assert v.max_margin is not None and v.max_margin < 0.5 and len(v.margins) >= 4


def test_an_indexing_bug_that_only_full_size_shows_is_caught() -> None:
    at_ci = verify_candidate(off.INDEX_BUG, off.PROBLEM, platform="triton", policy="strict", preset="ci",
                             compare="host", timeout_s=240)
    assert at_ci.ok, (at_ci.reason, at_ci.detail)  # what a ci-only verification would ship
    full = verify_candidate(off.INDEX_BUG, off.PROBLEM, platform="triton", policy="strict", preset="full",
                            timeout_s=240)
    assert_nothing_left()
    assert full.reason in ("output_mismatch", "nonfinite"), (full.reason, full.detail)


def test_a_clock_forged_inside_the_process_is_timing_inconsistent_on_the_gpu() -> None:
    forged = profile_candidate(off.CLOCK_FORGE, off.PROBLEM, platform="triton", preset="full", reps=15)
    assert forged.reason == "timing_inconsistent", (forged.reason, forged.detail)
    honest = profile_candidate(off.SLOW_HONEST, off.PROBLEM, platform="triton", preset="full", reps=15)
    assert_nothing_left()
    assert honest.ok, (honest.reason, honest.detail)
