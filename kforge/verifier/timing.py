"""One timing method for every platform (runs inside the profile worker).

    warm up every callable ─> CPU: one sizing call per callable sets its batch k (calls per
    handshake, ``handshake.batch_size``) ─> for each repetition, in turn for each callable
    (alternated):
        GPU: flush L2 (buffer = 2 x the device's L2, read from its properties), full sync,
             host clock + CUDA events around the call, full sync, host clock again
        CPU: fixed thread count, pinned to the same cores; the parent's clock around a batch
             of k calls (each on its own input set) by a handshake on a pipe (handshake.py),
             checked against the claimed time; one figure per batch (its time / k)
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
from kforge.verifier.handshake import BATCH_NS, PROBES, batch_size

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
    return Timing(median_ms=statistics.median(ms), mean_ms=mean, cv=cv, reps=len(ms), min_ms=min(ms),
                  samples=[float(f"{v:.6g}") for v in ms])  # rep order: paired by index (paired.py)


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
               claim: Callable[[Any], int] | None = None, k: int = 1) -> tuple[float, Any]:
    """The in-process clock: milliseconds of one call (or batch), and what it returned."""
    t0 = time.perf_counter_ns()
    out = fn()
    return (time.perf_counter_ns() - t0) / 1e6, out


def _host_probe(name: str, fn: Callable[[], Any], avail: int, batch_ns: int = BATCH_NS) -> tuple[int, Any]:
    """The in-process clock's sizing calls: the batch that :func:`handshake.batch_size` gives
    for the fastest of ``PROBES`` calls."""
    fastest, out = None, None
    for _ in range(PROBES):
        del out
        t0 = time.perf_counter_ns()
        out = fn()
        took = time.perf_counter_ns() - t0
        fastest = took if fastest is None else min(fastest, took)
    return batch_size(fastest or 0, avail, batch_ns), out


host_clock.probe = _host_probe  # type: ignore[attr-defined]


def unbatched_clock(name: str, rep: int, fn: Callable[[], Any],
                    claim: Callable[[Any], int] | None = None, k: int = 1) -> tuple[float, Any]:
    """:func:`host_clock` without a sizing call: one call per figure (the old in-process path,
    for benchmarks/verify_cpu_clock.py)."""
    return host_clock(name, rep, fn, claim)


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
        if slots < 2:
            raise ValueError("an input plan needs at least two buffer sets")
        self.contents = contents
        self.runs = runs  # consecutive calls on one buffer set (a repeated pointer, new contents)
        self.buffers = [[v.clone() if isinstance(v, torch.Tensor) else v for v in contents[0]]
                        for _ in range(slots)]
        self.factors: list[float | None] | None = None  # set by ``scaled``
        self.state = [0] * slots  # the contents each buffer set holds now
        self.cursor: dict[str, int] = {}  # per callable: the buffer set its last batch ended on
        self.batch_sets = 1  # buffer sets a batch may use (``scaled(batch_sets=...)``)

    @property
    def capacity(self) -> int:
        """The largest batch: every call of a batch gets a buffer set of its own; 1 (no
        batches) unless the plan was made with ``batch_sets``."""
        return self.batch_sets

    @staticmethod
    def sets_for(base: list[Any], budget_bytes: int, most: int) -> int:
        """How many buffer sets of ``base``'s inputs fit ``budget_bytes`` (at most ``most``;
        below 2 means no batches)."""
        size = sum(v.numel() * v.element_size() for v in base if isinstance(v, torch.Tensor))
        return int(min(most, budget_bytes // max(size, 1)))

    @classmethod
    def scaled(cls, base: list[Any], slots: int = 2, runs: int = 2, batch_sets: int = 1) -> InputPlan:
        factors: list[float | None] = [
            (0.5 if bool((v >= 0).all()) else -0.5) if isinstance(v, torch.Tensor) and v.is_floating_point()
            else None for v in base]
        alt = [v * f if f is not None else v for v, f in zip(base, factors, strict=True)]
        plan = cls([base, alt], slots=max(slots, batch_sets), runs=runs)
        plan.factors = factors
        plan.batch_sets = batch_sets if batch_sets >= 2 else 1
        return plan

    def schedule(self, rep: int) -> tuple[int, int]:
        """(slot, content) of repetition ``rep`` (one call per handshake): ``runs`` calls in a
        row on one buffer set, over the first two sets, and a buffer set's contents change at
        every visit."""
        slots = 2
        slot = (rep // self.runs) % slots
        visit = (rep // (self.runs * slots)) * self.runs + rep % self.runs
        return slot, visit % len(self.contents)

    def batch(self, key: str, k: int) -> list[tuple[int, int]]:
        """(slot, content) of each call of the next batch of callable ``key``: k distinct buffer
        sets, the first being the one this callable's previous batch ended on (a repeated
        pointer), each refilled with the other contents now, before the timed window (in reverse
        order, so the first call's inputs were touched last)."""
        if not 1 <= k <= self.capacity:
            raise ValueError(f"a batch of {k} needs {k} buffer sets; the plan has {self.capacity}")
        start = self.cursor.get(key, 0)
        slots = [(start + j) % self.capacity for j in range(k)]
        self.cursor[key] = slots[-1]
        for slot in reversed(slots):
            self.load(slot, 1 - self.state[slot])
        return [(slot, self.state[slot]) for slot in slots]

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


Observer = Callable[..., None]  # (name, rep, slot, content, output, batched=False)


def _reuses_outputs(outputs: list[Any]) -> bool:
    """Two of these (live) outputs share storage: the callable hands back one buffer it
    rewrites, so a batch's earlier answers cannot be checked after the batch."""
    seen: set[int] = set()
    for out in outputs:
        for t in (out if isinstance(out, tuple | list) else [out]):
            if isinstance(t, torch.Tensor) and t.numel():
                ptr = t.untyped_storage().data_ptr()
                if ptr in seen:
                    return True
                seen.add(ptr)
    return False


def time_alternating(
    fns: dict[str, Callable[..., Any]], *, device: str, warmup: int, reps: int,
    plan: InputPlan | None = None, clock: Clock = host_clock, observe: Observer | None = None,
    batches: dict[str, int] | None = None,
) -> dict[str, Samples]:
    """Time every callable ``reps`` times, interleaved so drift hits all of them alike.

    With a ``plan`` every call gets the plan's buffers for its repetition (refilled first,
    outside the timed window) and ``observe`` sees what each timed call returned. ``clock``
    times one handshake (``handshake.py`` hands it to the parent's clock); on the GPU the
    events time one call, and the claim the parent checks is the event time.

    CPU, with a plan and a clock that can size batches (``clock.probe``): after the warm-up,
    one sizing call per callable sets k, and each repetition then times k calls back to back,
    each on its own buffer set (``InputPlan.batch``); the figure is the batch's time / k. Of a
    batch's outputs the first, the last and one that moves with the repetition are kept (the
    rest are dropped at once, as a plain loop would) and observed after the batch. A callable
    that returns one output buffer it rewrites (two live outputs share storage in the warm-up)
    stays at k = 1. ``batches`` receives the k per callable."""
    flush = L2Flush(device)

    def args(rep: int) -> tuple[int, int, list[Any]]:
        if plan is None:
            return 0, 0, []
        slot, content = plan.schedule(rep)
        return slot, content, plan.load(slot, content)

    kept: dict[str, list[Any]] = {name: [] for name in fns}
    for w in range(max(1, warmup)):
        for name, fn in fns.items():
            kept[name].append(fn(*args(w)[2]))
    reuse = {name for name, outs in kept.items() if _reuses_outputs(outs)}
    del kept
    if device == "cuda":
        torch.cuda.synchronize()
    samples = {name: Samples() for name in fns}
    order = list(fns)
    sizes = {name: 1 for name in fns}
    probe = getattr(clock, "probe", None)
    if device != "cuda" and plan is not None and probe is not None and plan.capacity >= 2:
        for name in order:
            slot, content, values = args(0)
            flush()
            k, out = probe(name, functools.partial(fns[name], *values), 1 if name in reuse else plan.capacity)
            sizes[name] = int(k)
            if observe is not None:
                observe(name, -1, slot, content, out, batched=True)
            del out
    if batches is not None:
        batches.update(sizes)
    for rep in range(reps):
        rotated = order[rep % len(order):] + order[: rep % len(order)]
        for name in rotated:
            k = sizes[name]
            if k > 1 and plan is not None:
                pairs = plan.batch(name, k)
                flush()
                run = _batch_runner(fns[name], [plan.buffers[slot] for slot, _ in pairs], {0, rep % k, k - 1})
                ms, outs = clock(name, rep, run, k=k)
                samples[name].ms.append(ms / k)
                if observe is not None:
                    for j, out in outs:
                        observe(name, rep, *pairs[j], out, batched=True)
                del outs
                continue
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


def _batch_runner(fn: Callable[..., Any], buffers: list[list[Any]], keep: set[int]) -> Callable[[], list[tuple[int, Any]]]:
    """The timed body of one batch: ``fn`` on each buffer set in turn; the outputs of the
    calls in ``keep`` are held for the check, the others dropped as they come."""
    def run() -> list[tuple[int, Any]]:
        held = []
        for j, values in enumerate(buffers):
            out = fn(*values)
            if j in keep:
                held.append((j, out))
            del out
        return held

    return run


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
