"""Stress distributions are held to the relative error norm; wrong answers fail everywhere."""

from __future__ import annotations

import numpy as np

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
