"""Paired speedup ratios and a distribution-free confidence bound on their median.

The timing alternates the candidate, eager and torch.compile call by call, rep by rep
(``conductor.py``), so rep i of the candidate and rep i of a baseline were measured
back to back, under the same host load. ``ratio_i = baseline_i / candidate_i`` cancels the
drift they share; what a ship decision needs is how sure we are that the typical ratio beats
1, not how much either timing spreads on its own (per-sample CVs of 9-58% on a busy 2-core
host put the old CV band at 1.4-3.8x).

The bound: sort the n ratios, r_(1) <= ... <= r_(n). For the true median m of the ratio's
distribution each r_i falls below m with probability 1/2 (independently across reps, for a
continuous distribution), so the number below m is Binomial(n, 1/2) and

    P(r_(k) < m) = P(Bin(n, 1/2) >= k) = 1 - sum_{j<k} C(n, j) / 2^n.

The one-sided lower bound at confidence c is r_(k) for the largest k with
``sum_{j<k} C(n, j) / 2^n <= 1 - c``; by symmetry r_(n+1-k) is the one-sided upper bound, so
[low, high] is a two-sided interval at 2c - 1 (90% for c = 0.95). At c = 0.95: n = 5 gives
k = 1 (the smallest ratio), n = 10 gives k = 2, n = 20 gives k = 6, n = 30 gives k = 11.
Fewer than 5 pairs (2^-n > 0.05) give no 95% bound at all: ``paired_ratio`` returns None.

Why order statistics and not a bootstrap: the bound is exact for any continuous ratio
distribution (conservative with ties or discrete timers: the coverage is at least c), needs
no random numbers, so the same samples always give the same decision and anyone can check it
by hand from the record. A bootstrap of the median can only return sample values too, its
coverage at the 20-30 reps a run takes is approximate (percentile intervals of a median are
known to be unreliable at small n), and its answer would hang on a seed. What the bound
assumes: the pairs are independent and alike (no trend in the ratio itself across the run);
drift common to both calls of a pair cancels in the ratio.

A pair with a sample that is not a positive finite number (a 0 ms figure from a clock that
could not resolve the call) is dropped, never counted as a win.
"""

from __future__ import annotations

import math
import statistics
from typing import Literal

from kforge.schema import Profile, RatioBound, Timing

BaselineName = Literal["eager", "compiled"]
CONFIDENCE = 0.95


def ratios(candidate: Timing, baseline: Timing) -> list[float]:
    """``baseline_i / candidate_i`` in rep order, paired by index over the shorter of the two
    sample lists; pairs with a sample that is not positive and finite are left out."""
    out = []
    for c, b in zip(candidate.samples, baseline.samples, strict=False):
        if c > 0 and b > 0 and math.isfinite(c) and math.isfinite(b):
            out.append(b / c)
    return out


def order_index(n: int, confidence: float = CONFIDENCE) -> int | None:
    """The 1-based rank k of the lower bound among n sorted ratios: the largest k with
    ``P(Bin(n, 1/2) <= k - 1) <= 1 - confidence``; None when even k = 1 fails (too few pairs)."""
    if not 0.5 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0.5, 1), not {confidence}")
    alpha, total = 1.0 - confidence, 2**n
    k, cumulative = 0, 0
    for j in range(n):
        cumulative += math.comb(n, j)  # 2^n * P(Bin(n, 1/2) <= j)
        if cumulative / total > alpha:
            break
        k = j + 1
    return k or None


def min_pairs(confidence: float = CONFIDENCE) -> int:
    """The fewest pairs that give a bound at ``confidence`` (5 at 95%)."""
    n = 1
    while order_index(n, confidence) is None:
        n += 1
    return n


def paired_median(candidate: Timing, baseline: Timing) -> float | None:
    """The median paired ratio (rounded to 4 decimals), None without any pair."""
    rs = ratios(candidate, baseline)
    return round(statistics.median(rs), 4) if rs else None


def paired_ratio(candidate: Timing, baseline: Timing, name: BaselineName,
                 confidence: float = CONFIDENCE) -> RatioBound | None:
    """The median of the paired ratios with its order-statistic bounds (module docstring), each
    rounded to 4 decimals; None when there are too few pairs for a bound at ``confidence``."""
    rs = sorted(ratios(candidate, baseline))
    k = order_index(len(rs), confidence)
    if k is None:
        return None
    n = len(rs)
    return RatioBound(baseline=name, n=n, median=round(statistics.median(rs), 4), low=round(rs[k - 1], 4),
                      high=round(rs[n - k], 4), confidence=confidence)


def why_no_bound(candidate: Timing, baseline: Timing, confidence: float = CONFIDENCE) -> str:
    """Why ``paired_ratio`` gave None, in words for a report's detail."""
    if not candidate.samples or not baseline.samples:
        return "the profile has no per-rep samples (timed before they were recorded)"
    n = len(ratios(candidate, baseline))
    return f"only {n} paired reps; a {confidence:.0%} bound needs at least {min_pairs(confidence)}"


def faster_baseline(profile: Profile) -> tuple[BaselineName, Timing] | None:
    """The baseline with the lower median (eager on a tie), None when neither was timed."""
    timed: list[tuple[BaselineName, Timing]] = [
        (name, t) for name, t in (("eager", profile.eager), ("compiled", profile.compiled))
        if t is not None and t.median_ms]
    return min(timed, key=lambda item: item[1].median_ms) if timed else None
