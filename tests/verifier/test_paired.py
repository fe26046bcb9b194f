"""The paired ratio and its order-statistic bound (kforge.verifier.paired), and the ship rule
that reads it (kforge.stages.select.ship_status)."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from kforge.schema import Profile, Timing
from kforge.stages.select import SHIP_FLOOR, ship_status
from kforge.verifier.paired import (
    faster_baseline,
    min_pairs,
    order_index,
    paired_median,
    paired_ratio,
    ratios,
    why_no_bound,
)
from kforge.verifier.timing import summarize


def timing(samples: list[float]) -> Timing:
    return Timing(median_ms=statistics.median(samples) if samples else 1.0, mean_ms=1.0, cv=0.0,
                  reps=len(samples), min_ms=min(samples, default=1.0), samples=samples)


def test_order_index_is_the_binomial_tail_by_hand() -> None:
    # n = 20: sum_{j<=5} C(20, j) = 1 + 20 + 190 + 1140 + 4845 + 15504 = 21700, and
    # 21700 / 2^20 = 0.0207 <= 0.05; with C(20, 6) = 38760 it is 60460 / 2^20 = 0.0577 > 0.05
    assert sum(math.comb(20, j) for j in range(6)) == 21700
    assert order_index(20) == 6
    # n = 10: (1 + 10) / 1024 = 0.0107 <= 0.05 < (1 + 10 + 45) / 1024 = 0.0547
    assert order_index(10) == 2
    assert order_index(5) == 1  # 1 / 32 = 0.031 <= 0.05
    assert order_index(4) is None  # 1 / 16 = 0.0625 > 0.05: no 95% bound from 4 pairs
    assert order_index(30) == 11 and order_index(0) is None
    assert min_pairs() == 5 and min_pairs(0.99) == 7
    with pytest.raises(ValueError):
        order_index(20, confidence=0.4)


def test_known_inputs_give_the_hand_checked_order_statistics() -> None:
    cand = timing([1.0] * 10)
    base = timing([1.1, 1.5, 0.9, 1.3, 1.2, 1.0, 1.4, 1.6, 0.8, 1.7])
    bound = paired_ratio(cand, base, "eager")
    assert bound is not None
    # sorted: 0.8 0.9 1.0 1.1 1.2 1.3 1.4 1.5 1.6 1.7; k = 2 of 10
    assert (bound.n, bound.median, bound.low, bound.high) == (10, 1.25, 0.9, 1.6)
    assert bound.baseline == "eager" and bound.confidence == 0.95


def test_samples_pair_by_index_and_truncate_to_the_shorter_list() -> None:
    cand = timing([1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 9.0, 9.0])  # the last two have no partner
    base = timing([1.5, 3.0, 1.5, 3.0, 1.5, 3.0])  # 1.5x the candidate, rep by rep
    assert ratios(cand, base) == [1.5] * 6
    bound = paired_ratio(cand, base, "compiled")
    assert bound is not None and bound.n == 6 and bound.low == bound.median == bound.high == 1.5
    # unpaired, the same numbers would look like anything from 0.75x to 3x
    assert min(base.samples) / max(cand.samples[:6]) == 0.75


def test_too_few_pairs_give_no_bound_and_say_why() -> None:
    four = timing([1.0, 1.0, 1.0, 1.0])
    assert paired_ratio(four, timing([2.0] * 4), "eager") is None
    assert "only 4 paired reps" in why_no_bound(four, timing([2.0] * 4))
    assert paired_ratio(timing([]), timing([2.0] * 20), "eager") is None
    assert "no per-rep samples" in why_no_bound(timing([]), timing([2.0] * 20))
    assert paired_median(timing([]), timing([2.0] * 20)) is None
    # a pair with a sample the clock could not resolve is dropped, never a win
    zeros = timing([0.0, 1.0, 1.0, 1.0, 1.0])
    assert ratios(zeros, timing([1.0] * 5)) == [1.0] * 4 and paired_ratio(zeros, timing([1.0] * 5), "eager") is None


def test_a_constant_ratio_is_its_own_bound() -> None:
    cand = timing([0.5 + 0.01 * i for i in range(20)])
    base = timing([1.3 * c for c in cand.samples])
    bound = paired_ratio(cand, base, "eager")
    assert bound is not None and bound.median == bound.low == bound.high == 1.3
    assert ship_status(bound, False)[0] == "shipped"


def _noisy(speedup: float, seed: int, reps: int = 20, noise: float = 0.3) -> tuple[Timing, Timing]:
    """A busy host: a shared per-rep load factor (up to 3x) and independent lognormal noise
    on each call."""
    rng = random.Random(seed)
    cand, base = [], []
    for _ in range(reps):
        load = 1.0 + 2.0 * rng.random()
        cand.append(load * math.exp(rng.gauss(0.0, noise)))
        base.append(speedup * load * math.exp(rng.gauss(0.0, noise)))
    return summarize(cand), summarize(base)


def test_a_noisy_but_clearly_faster_kernel_ships() -> None:
    cand, base = _noisy(2.0, seed=1)
    assert cand.cv > 0.3 and base.cv > 0.3  # per-sample CVs a 2-core host shows
    # the CV band would have asked for more than the kernel has: 1 + 2 * hypot(cv_c, cv_b) > 2
    assert 1 + 2 * math.hypot(cand.cv, base.cv) > 2.0
    bound = paired_ratio(cand, base, "eager")
    assert bound is not None and bound.low > SHIP_FLOOR and bound.low <= bound.median <= bound.high
    assert ship_status(bound, False)[0] == "shipped"


@pytest.mark.parametrize("seed", range(10))
def test_a_kernel_as_fast_as_its_baseline_does_not_ship(seed: int) -> None:
    cand, base = _noisy(1.0, seed=seed)
    bound = paired_ratio(cand, base, "eager")
    assert bound is not None and bound.low <= SHIP_FLOOR, bound
    assert ship_status(bound, False)[0] == "no_gain"


def test_the_bound_is_deterministic_and_ignores_the_order_of_the_pairs() -> None:
    cand, base = _noisy(1.4, seed=7)
    first = paired_ratio(cand, base, "eager")
    assert first == paired_ratio(cand, base, "eager")
    order = list(range(len(cand.samples)))
    random.Random(3).shuffle(order)
    shuffled = (timing([cand.samples[i] for i in order]), timing([base.samples[i] for i in order]))
    assert paired_ratio(*shuffled, "eager") == first


def test_summarize_keeps_the_samples_in_rep_order() -> None:
    t = summarize([3.0, 1.0, 2.123456789])
    assert t.samples == [3.0, 1.0, 2.12346] and t.median_ms == 2.123456789


def test_faster_baseline_is_the_lower_median() -> None:
    cand = timing([1.0] * 5)
    eager, compiled = timing([2.0] * 5), timing([1.5] * 5)
    assert faster_baseline(Profile(ok=True, candidate=cand, eager=eager, compiled=compiled)) == ("compiled", compiled)
    assert faster_baseline(Profile(ok=True, candidate=cand, eager=eager, compiled=eager))[0] == "eager"  # a tie
    assert faster_baseline(Profile(ok=True, candidate=cand, eager=eager)) == ("eager", eager)
    assert faster_baseline(Profile(ok=True, candidate=cand)) is None
