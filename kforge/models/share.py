"""Each region's share of the model's time, and which distinct regions a budget takes.

A 100-region net (DenseNet201: 103 distinct) costs the regions' pipeline ~20 s a region on a
2-core host; most of its regions are a few percent of the forward. ``kforge model --regions N``
takes the N distinct regions with the largest share of the measured forward through the
pipeline (a stack's block counted once per call) and keeps the others as their own PyTorch ops,
each saying so in its row."""

from __future__ import annotations

import time

import torch

from kforge.models.partition import Partition


def region_times(part: Partition, *, reps: int = 3) -> dict[str, float]:
    """Milliseconds of each region's submodule on the arguments it was called with in the
    capture (the best of ``reps`` calls after one warm call, on one thread: shares, not a
    profile); a region's in-place writes are the model's own, idempotent per call, so running
    it again changes nothing."""
    out = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a pool's threads on a busy host wake on the scheduler's tick (4 ms)
    try:
        _time_each(part, reps, out)
    finally:
        torch.set_num_threads(threads)
    return out


def _time_each(part: Partition, reps: int, out: dict[str, float]) -> None:
    with torch.no_grad():
        for region in part.regions:
            sub = getattr(part.split, region.name)
            args = part.seen[region.name][0]
            sub(*args)
            best = float("inf")
            for _ in range(reps):
                t = time.perf_counter()
                sub(*args)
                best = min(best, time.perf_counter() - t)
            out[region.name] = best * 1e3


def largest(part: Partition, times: dict[str, float], budget: int) -> set[str]:
    """The digests of the ``budget`` distinct regions with the largest total time."""
    total: dict[str, float] = {}
    for region in part.regions:
        total[region.digest] = total.get(region.digest, 0.0) + times[region.name]
    return set(sorted(total, key=lambda d: -total[d])[:budget])
