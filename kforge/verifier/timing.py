"""One timing method for every platform (runs inside the profile worker).

    warm up every callable ─> for each repetition, in turn for each callable (alternated):
        GPU: flush L2 (buffer = 2 x the device's L2, read from its properties), full sync,
             host clock + CUDA events around the call, full sync, host clock again
        CPU: fixed thread count, pinned to the same cores; the parent's clock around the call
             by a handshake on a pipe (handshake.py), checked against the claimed time
    ─> median, mean, min and coefficient of variation per callable

Every timed call gets an input set of its own (``InputPlan``); ``checked.py`` compares a
sample of what the timed calls returned with the reference before the timing counts.

On the GPU the event time is the measurement and the host time after a full device sync is
the check: work left on a side stream or a thread shows as host >> events.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kforge.schema import Timing

HOST_GAP_FACTOR = 2.0  # host time above this many times the event time is suspicious
HOST_GAP_FLOOR_MS = 0.05


@dataclass
class Samples:
    ms: list[float] = field(default_factory=list)
    host_ms: list[float] = field(default_factory=list)

    def timing(self) -> Timing:
        return summarize(self.ms)

    def host_gap(self) -> bool:
        """True when the host clock (after a full sync) disagrees with the events."""
        if not self.host_ms or not self.ms:
            return False
        host, ev = statistics.median(self.host_ms), statistics.median(self.ms)
        return host > HOST_GAP_FACTOR * ev + HOST_GAP_FLOOR_MS


def summarize(ms: list[float]) -> Timing:
    if not ms:
        raise ValueError("no timing samples")
    mean = statistics.fmean(ms)
    cv = statistics.pstdev(ms) / mean if mean > 0 and len(ms) > 1 else 0.0
    return Timing(median_ms=statistics.median(ms), mean_ms=mean, cv=cv, reps=len(ms), min_ms=min(ms))


def pin_cpu(threads: int | None) -> dict[str, Any]:
    """Fix torch's thread count and pin this process to that many cores (the same each rep)."""
    cores = sorted(os.sched_getaffinity(0))
    n = max(1, min(threads or len(cores), len(cores)))
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


Clock = Callable[..., tuple[float, Any]]  # (name, rep, fn, claim=None) -> (ms, what fn returned)


def host_clock(name: str, rep: int, fn: Callable[[], Any],
               claim: Callable[[Any], int] | None = None) -> tuple[float, Any]:
    """The in-process clock: milliseconds of one call, and what it returned."""
    t0 = time.perf_counter_ns()
    out = fn()
    return (time.perf_counter_ns() - t0) / 1e6, out


def _time_cuda(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    h0 = time.perf_counter_ns()
    start.record()
    out = fn()
    end.record()
    torch.cuda.synchronize()
    host = (time.perf_counter_ns() - h0) / 1e6
    return start.elapsed_time(end), host, out


class InputPlan:
    """Distinct input sets for the timed calls (``checked.py``): ``slots`` sets of buffers, all
    alive at once (so no two share an address), refilled before every call with one of the
    ``contents`` variants, in place and without bumping the tensors' version counters. A
    call never sees the contents its buffers held at that buffer set's previous call, so a
    cache keyed on pointer, shape or version returns a stale answer, and the samples show it.

    ``InputPlan.scaled`` (the timing path) alternates a buffer between x and x * f in place,
    f = -1/2 (1/2 for a non-negative tensor: domains like log's or [0, 1] stay valid), exact in
    floating point. Copying other contents in would pollute the cache before every call: the
    honest control measured 1.5-2x slower than with a fixed input; scaling in place left it
    as it was."""

    def __init__(self, contents: list[list[Any]], slots: int = 2, runs: int = 2) -> None:
        if len(contents) < 2:
            raise ValueError("an input plan needs at least two content variants")
        self.contents = contents
        self.runs = runs  # consecutive calls on one buffer set (a repeated pointer, new contents)
        self.buffers = [[v.clone() if isinstance(v, torch.Tensor) else v for v in contents[0]]
                        for _ in range(slots)]
        self.factors: list[float | None] | None = None  # set by ``scaled``
        self.state = [0] * slots  # the contents each buffer set holds now

    @classmethod
    def scaled(cls, base: list[Any], slots: int = 2, runs: int = 2) -> InputPlan:
        factors: list[float | None] = [
            (0.5 if bool((v >= 0).all()) else -0.5) if isinstance(v, torch.Tensor) and v.is_floating_point()
            else None for v in base]
        alt = [v * f if f is not None else v for v, f in zip(base, factors, strict=True)]
        plan = cls([base, alt], slots=slots, runs=runs)
        plan.factors = factors
        return plan

    def schedule(self, rep: int) -> tuple[int, int]:
        """(slot, content) of repetition ``rep``: ``runs`` calls in a row on one buffer set, and
        a buffer set's contents change at every visit."""
        slots = len(self.buffers)
        slot = (rep // self.runs) % slots
        visit = (rep // (self.runs * slots)) * self.runs + rep % self.runs
        return slot, visit % len(self.contents)

    def load(self, slot: int, content: int) -> list[Any]:
        if self.factors is not None:
            if self.state[slot] != content:
                for buf, f in zip(self.buffers[slot], self.factors, strict=True):
                    if f is not None:
                        buf.data.mul_(f if content == 1 else 1.0 / f)  # .data: version unchanged
            self.state[slot] = content
            return self.buffers[slot]
        for buf, src in zip(self.buffers[slot], self.contents[content], strict=True):
            if isinstance(buf, torch.Tensor):
                buf.data.copy_(src)  # .data: the version counter stays as it was
        return self.buffers[slot]


Observer = Callable[[str, int, int, int, Any], None]  # (name, rep, slot, content, output)


def time_alternating(
    fns: dict[str, Callable[..., Any]], *, device: str, warmup: int, reps: int,
    plan: InputPlan | None = None, clock: Clock = host_clock, observe: Observer | None = None,
) -> dict[str, Samples]:
    """Time every callable ``reps`` times, interleaved so drift hits all of them alike.

    With a ``plan`` every call gets the plan's buffers for its repetition (refilled first,
    outside the timed window) and ``observe`` sees what each timed call returned. ``clock``
    times one call (``handshake.py`` hands it to the parent's clock); on the GPU the events
    time it, and the claim the parent checks is the event time (UNTESTED ON A GPU)."""
    flush = L2Flush(device)

    def args(rep: int) -> tuple[int, int, list[Any]]:
        if plan is None:
            return 0, 0, []
        slot, content = plan.schedule(rep)
        return slot, content, plan.load(slot, content)

    for w in range(max(1, warmup)):
        for fn in fns.values():
            fn(*args(w)[2])
    if device == "cuda":
        torch.cuda.synchronize()
    samples = {name: Samples() for name in fns}
    order = list(fns)
    for rep in range(reps):
        rotated = order[rep % len(order):] + order[: rep % len(order)]
        for name in rotated:
            slot, content, values = args(rep)
            flush()
            call = functools.partial(fns[name], *values)
            if device == "cuda":
                torch.cuda.synchronize()  # the flush ends outside the parent's window
                _, (ev, host, out) = clock(name, rep, functools.partial(_time_cuda, call),
                                           claim=lambda r: int(r[0] * 1e6))
                samples[name].ms.append(ev)
                samples[name].host_ms.append(host)
            else:
                ms, out = clock(name, rep, call)
                samples[name].ms.append(ms)
            if observe is not None:
                observe(name, rep, slot, content, out)
            del out
    return samples


def speedup(candidate: Timing, baselines: list[Timing], *, k: float = 2.0) -> tuple[float, str]:
    """min(baselines) / candidate, reported as exactly 1.0 when inside the noise band
    ``k * sqrt(cv_c^2 + cv_b^2)`` (at least 2%)."""
    if not baselines:
        return 0.0, "no baseline timed"
    best = min(baselines, key=lambda t: t.median_ms)
    ratio = best.median_ms / candidate.median_ms if candidate.median_ms > 0 else float("inf")
    band = max(0.02, k * (candidate.cv**2 + best.cv**2) ** 0.5)
    if abs(ratio - 1.0) <= band:
        return 1.0, f"no measurable difference (within +-{band:.1%} noise band)"
    return ratio, ("faster" if ratio > 1 else "slower") + f" than the best baseline (band +-{band:.1%})"
