"""Timing pieces every worker and the parent share (the schedule is ``conductor.py``, the wire
``handshake.py``, the workers' loop ``timed_worker.py``).

    GPU: flush L2 (a buffer of 2 x the device's L2, read from its properties), full sync,
         CUDA events around the call and a host clock around the synchronised window
    CPU: a fixed thread count, pinned to the same cores; the parent's clock around a batch
    per callable: median, mean, min, coefficient of variation and the samples in rep order
    (paired with the other callables' by ``paired.py``)
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from kforge.schema import Timing


def summarize(ms: list[float]) -> Timing:
    if not ms:
        raise ValueError("no timing samples")
    mean = statistics.fmean(ms)
    cv = statistics.pstdev(ms) / mean if mean > 0 and len(ms) > 1 else 0.0
    return Timing(median_ms=statistics.median(ms), mean_ms=mean, cv=cv, reps=len(ms), min_ms=min(ms),
                  samples=[float(f"{v:.6g}") for v in ms])


def default_threads(cores: int) -> int:
    """A timed process's threads when none are asked for: every core but one (the parent's
    clock, the scheduler and the OS use that one: on the 2-core dev host a 3 ms GEMM at two
    threads timed with a CV of 30-45%, at one thread 4%)."""
    return max(1, cores - 1)


def pin_cpu(threads: int | None) -> dict[str, Any]:
    """Fix torch's thread count and pin this process to that many cores (the same each rep)."""
    cores = sorted(os.sched_getaffinity(0))
    n = max(1, min(threads or default_threads(len(cores)), len(cores)))
    os.sched_setaffinity(0, cores[:n])
    torch.set_num_threads(n)
    return {"threads": n, "cores": cores[:n]}


class L2Flush:
    """Writes a buffer twice the size of the device's L2 between repetitions."""

    def __init__(self, device: str) -> None:
        self.buffer: torch.Tensor | None = None
        if device == "cuda" and torch.cuda.is_available():
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            l2 = int(getattr(props, "L2_cache_size", 0) or 0) or 64 * 1024 * 1024
            self.buffer = torch.empty(2 * l2 // 4, dtype=torch.float32, device="cuda")
        self.bytes = 0 if self.buffer is None else self.buffer.numel() * 4

    def __call__(self) -> None:
        if self.buffer is not None:
            self.buffer.fill_(1.0)


def time_cuda(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(event ms, host ms around the synchronised window, what ``fn`` returned)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    h0 = time.perf_counter_ns()
    start.record()
    out = fn()
    end.record()
    torch.cuda.synchronize()
    host = (time.perf_counter_ns() - h0) / 1e6
    return start.elapsed_time(end), host, out


HOST_GAP_FACTOR = 2.0  # GPU: host time above this many times the event time is work left running
HOST_GAP_FLOOR_MS = 0.05


def host_gap(event_ms: list[float], host_ms: list[float]) -> bool:
    """True when the host clock around a fully synchronised window disagrees with the events
    (work on another stream or thread that the events did not see)."""
    if not event_ms or not host_ms:
        return False
    host, ev = statistics.median(host_ms), statistics.median(event_ms)
    return host > HOST_GAP_FACTOR * ev + HOST_GAP_FLOOR_MS
