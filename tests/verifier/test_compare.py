"""Stress distributions are held to the relative error norm; wrong answers fail everywhere."""

from __future__ import annotations

import numpy as np
import pytest

from kforge.verifier.correctness import compare

REF = np.array([1000.0, -1000.0, 1e-3, 250.0])


def test_cancellation_error_fails_on_native_inputs_but_not_on_heavy_tails() -> None:
    reassociated = REF + np.array([0.0, 0.0, 2e-3, 0.0])  # an fp32 sum in another order
    assert compare(reassociated, REF, 1e-4, "native")[0] == "mismatch"
    assert compare(reassociated, REF, 1e-4, "heavy")[0] is None


def test_wrong_answers_fail_on_every_distribution() -> None:
    wrong = REF * 1.01
    for dist in ("native", "signed", "heavy", "scaled"):
        assert compare(wrong, REF, 1e-4, dist)[0] == "mismatch"
    nan = REF.copy()
    nan[2] = np.nan
    assert compare(nan, REF, 1e-4, "heavy")[0] == "nonfinite"


def test_a_repeated_call_on_doubled_inputs_keeps_its_case_band_and_a_stale_answer_still_fails() -> None:
    """The repeat phase's contents scale inputs by powers of two (exact): an honest kernel's
    rounding error scales with its output, so the absolute part of the band follows the
    output's RMS (``atol_scale``); the stale answer (the case's own output) is still off by the
    output's size."""
    import torch

    from kforge.verifier.comparison import atol_scale
    from kforge.verifier.correctness import measure
    from kforge.verifier.gpu_compare import compare_on_device

    rng = np.random.default_rng(0)
    ref = rng.standard_normal(4096) * 40
    ref[:8] = rng.standard_normal(8) * 1e-2  # outputs near zero, where cancellation leaves fp32 noise
    cand = ref + 5e-5 * rng.choice([-1.0, 1.0], 4096)  # an fp32 sum in another order: passes
    assert measure(cand, ref, 1e-4).kind is None
    ref4, cand4 = 4 * ref, 4 * cand  # both operands of a GEMV doubled: exact, the error x4
    assert measure(cand4, ref4, 1e-4).kind == "mismatch"  # the unscaled band
    scale = atol_scale(float(np.sqrt(np.mean(ref4**2))), float(np.sqrt(np.mean(ref**2))))
    assert scale == pytest.approx(4.0)
    assert measure(cand4, ref4, 1e-4, scale=scale).kind is None
    assert measure(cand, ref4, 1e-4, scale=scale).kind == "mismatch"  # stale
    dev = compare_on_device(torch.from_numpy(cand4), torch.from_numpy(ref4), 1e-4, chunk=1000, scale=scale)
    assert dev.kind is None and dev.margin == pytest.approx(measure(cand4, ref4, 1e-4, scale=scale).margin, rel=1e-9)
    assert atol_scale(1.0, 2.0) == 1.0 and atol_scale(1.0, 0.0) == 1.0  # never tighter, nothing to scale
