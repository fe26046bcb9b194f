"""Checked timing (worker side): the timed calls' outputs are compared with the reference.

    before the candidate is imported:
        the reference model, the inputs x and x * f (``InputPlan.scaled``), and the reference's
        output for each (computed twice: a nondeterministic reference leaves the check off)
    timing (timing.time_alternating with an InputPlan):
        buffer sets (two; on the CPU, for small inputs, up to ``handshake.MAX_BATCH`` within
        ``BATCH_BUDGET`` bytes, one per call of a batch), rescaled in place before every call or
        batch (pointer, shape and version stay, contents change); one call per handshake: the
        candidate's outputs at the first, middle and last call of every (buffer set, contents)
        compared with the reference for those contents at once, on the device, outside the
        timed window; batches: three kept outputs of every batch (first, last, one that moves),
        compared after the batch and then filled with NaN (a later output that lands on their
        memory shows NaN, not an answer)
    after timing:
        a fresh ModelNew and the one timed many times, on both contents, against the reference

Under the strict tolerance an output within it of the reference in float64 (made before the
candidate is imported too) is right as well, as in verification's ``exact`` rule.

A mismatch is ``stale_output``: the timing measured calls that did not compute the answer
(a cache keyed on the input's address, shape or version, a partial recompute on repeated
inputs, a result that goes stale after N calls, or one written by a thread after return).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kforge.verifier.inputs import Case, make_inputs, tensors_in
from kforge.verifier.timing import InputPlan

SLOTS = 2
# Bytes of the input sets of one CPU batch (handshake.py): a batch's calls each read their own
# set, so the sets must stay cache-resident as a lone call's freshly refilled set is; 2 MB
# inputs in 8 sets timed 3-5x slower a call than one set on the dev host (its L2: 512 KiB).
BATCH_BUDGET = 512 << 10
DEFAULT_TOL = 1e-2  # the verify stage judged the policy's tolerance; this catches wrong answers
# Under a tolerance below this (strict's 1e-4) an output may also match the float64 reference, as
# in verification's ``exact`` rule: on the H100 an fp32 GEMV folded from a GEMM + row sum
# (level2/015, K = N = 8192) was 2.8e-4 off the fp32 reference at one output near zero, where
# the fp32 reference's own rounding is of that size.
EXACT_BELOW = 1e-3
EXACT_MAX_BYTES = 1 << 30  # float64 answers held through the timing: skipped past this (GPU memory)


class StaleOutput(Exception):
    """A timed call's output disagrees with the reference for the inputs it was given."""


@dataclass
class Sample:
    rep: int  # the repetition (a batch's index; -1: the sizing call)
    slot: int
    content: int
    wrong: str  # "" when the call's output matched the reference


@dataclass
class CheckedTiming:
    plan: InputPlan
    expected: list[list[torch.Tensor]]  # the reference's outputs, per content variant
    tol: float
    reps: int
    note: str = ""  # why the comparison is off, when it is
    samples: list[Sample] = field(default_factory=list)
    picks: set[int] = field(default_factory=set)
    # the reference in float64, per content variant, under a tolerance tighter than EXACT_BELOW
    exact: list[list[torch.Tensor]] | None = None

    @classmethod
    def prepare(cls, problem: Any, ref: Any, seed: int, device: str, reps: int,
                tol: float | None = None) -> CheckedTiming:
        """Inputs and the reference's answers, made before any candidate code runs."""
        from kforge.verifier.handshake import MAX_BATCH

        base = make_inputs(problem, Case(0, seed, "native", None), device, draw_on_device=True)
        batch_sets = 1 if device == "cuda" else InputPlan.sets_for(base, BATCH_BUDGET, MAX_BATCH)
        plan = InputPlan.scaled(base, slots=SLOTS, batch_sets=batch_sets)
        contents = plan.contents
        with torch.no_grad():
            expected = [[t.detach().clone() for t in tensors_in(ref(*c))] for c in contents]
            again = [t for t in tensors_in(ref(*contents[0]))]
        note = ""
        if len(again) != len(expected[0]) or not all(
                torch.equal(a, b) for a, b in zip(again, expected[0], strict=False)):
            note = "unchecked: the reference is not deterministic"
        picks: set[int] = set()  # first, middle and last call of every (buffer set, contents)
        for key in {plan.schedule(r) for r in range(reps)}:
            mine = [r for r in range(reps) if plan.schedule(r) == key]
            picks |= {mine[0], mine[len(mine) // 2], mine[-1]}
        tol = DEFAULT_TOL if tol is None else tol
        exact = None
        held = 8 * sum(t.numel() for outs in expected for t in outs)
        if tol < EXACT_BELOW and not note and held <= EXACT_MAX_BYTES:
            from kforge.verifier.worker import exact_outputs

            per_content = [exact_outputs(ref, list(c), len(expected[i])) for i, c in enumerate(contents)]
            exact = None if any(e is None for e in per_content) else per_content
        return cls(plan, expected, tol, reps, note, picks=picks, exact=exact)

    def _wrong(self, got: list[torch.Tensor], content: int) -> str:
        return mismatch(got, self.expected[content], self.tol,
                        exact=self.exact[content] if self.exact is not None else None)

    def observe(self, name: str, rep: int, slot: int, content: int, out: Any, batched: bool = False) -> None:
        """``time_alternating``'s observer: a sampled candidate call is compared at once, on the
        device, outside the timed window (no clones held: full-size outputs stay bounded). A
        batch's kept outputs are all compared, then poisoned with NaN."""
        if name != "candidate" or not (batched or rep in self.picks):
            return
        got = _tensors(out)
        self.samples.append(Sample(rep, slot, content, self._wrong(got, content)))
        if batched:
            for t in got:
                if t.is_floating_point():
                    try:
                        t.detach().fill_(float("nan"))
                    except RuntimeError:  # an expanded view cannot be written; nothing to reuse
                        pass

    def verdict(self, model_cls: type, used: Any, build: Callable[[type], Any]) -> str | None:
        """None when every check passed (or the check is off); else what disagreed."""
        if self.note:
            return None
        for s in self.samples:
            if s.wrong:
                when = "the sizing call" if s.rep < 0 else f"timed call {s.rep}"
                return (f"{when} (input set {s.slot}, contents {s.content}) returned a "
                        f"wrong answer: {s.wrong}; the timing measured calls that did not compute it")
        fresh = build(model_cls)
        for content in range(len(self.expected)):
            with torch.no_grad():
                fresh_out = [t.detach().clone() for t in _tensors(fresh(*self.plan.load(0, content)))]
                used_out = [t.detach().clone() for t in _tensors(used(*self.plan.load(0, content)))]
            bad_fresh, bad_used = self._wrong(fresh_out, content), self._wrong(used_out, content)
            if bad_used or bad_fresh:
                which = "the instance timed many times" if bad_used else "a fresh instance"
                return (f"a fresh ModelNew and the one timed {self.reps} times disagree on the same "
                        f"inputs: {which} is wrong ({bad_used or bad_fresh})")
        return None


REPEATS = 16  # calls of the verified instance in the repeat phase (4 per buffer set x contents)


Emit = Callable[[int, int, int, list[torch.Tensor]], None]  # (rep, slot, case index, outputs)


def repeat_phase(model: Any, fresh: Callable[[], Any], problem: Any, cases: list[Case], device: str,
                 emit: Emit, *, draw_on_device: bool = False) -> None:
    """Verification's look at repetition (candidate mode, after the cases): the instance that
    ran the cases is called ``REPEATS`` times more on two buffer sets refilled with the inputs
    of ``cases`` (pointer, shape and version unchanged, contents alternating); the last call of
    every (buffer set, contents) and a fresh instance's answer (rep -1) are ``emit``ted: as
    ``repeat`` frames of bytes, or to the on-device judge (``gpu_compare.py``); the parent
    compares them with the reference's answers for those cases (``stale_output``)."""
    plan = InputPlan([make_inputs(problem, c, device, draw_on_device=draw_on_device) for c in cases], slots=SLOTS)
    last = {plan.schedule(r): r for r in range(REPEATS)}
    picks = {r: key for key, r in last.items()}
    calls: list[tuple[int, int, int, Any]] = []
    with torch.no_grad():
        for rep in range(REPEATS):
            slot, content = plan.schedule(rep)
            out = model(*plan.load(slot, content))
            if rep in picks:
                calls.append((rep, slot, content, [t.detach().clone() for t in _tensors(out)]))
            del out
        calls.append((-1, 0, 0, [t.detach().clone() for t in _tensors(fresh()(*plan.load(0, 0)))]))
    for rep, slot, content, tensors in calls:
        emit(rep, slot, cases[content].index, tensors)


def _tensors(out: Any) -> list[torch.Tensor]:
    if type(out) is torch.Tensor:
        return [out]
    if type(out) in (tuple, list):
        return [t for t in out if type(t) is torch.Tensor]
    return []


CHUNK = 1 << 24  # elements compared at a time (bounded memory for multi-GB outputs)


def mismatch(got: list[torch.Tensor], want: list[torch.Tensor], tol: float,
             exact: list[torch.Tensor] | None = None) -> str:
    """"" when ``got`` matches ``want`` within ``tol`` (atol = rtol); else what differs. With
    ``exact`` (the reference in float64), an output off ``want`` that is within ``tol`` of its
    float64 counterpart everywhere matches too: the fp32 reference was the one off."""
    if len(got) != len(want):
        return f"{len(got)} output tensors, the reference has {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g.shape != w.shape:
            return f"output {i} has shape {tuple(g.shape)}, the reference {tuple(w.shape)}"
        bad, err = _off(g, w, tol)
        if bad and exact is not None and exact[i].shape == g.shape and _off(g, exact[i], tol)[0] == 0:
            continue
        if bad:
            return f"output {i}: {bad} of {g.numel()} elements off (max abs err {err:.3g})"
    return ""


def _off(got: torch.Tensor, want: torch.Tensor, tol: float) -> tuple[int, float]:
    """(elements of ``got`` not within ``tol`` of ``want``, their largest absolute error),
    compared in float64, ``CHUNK`` elements at a time."""
    flat_g, flat_w = got.detach().reshape(-1), want.detach().reshape(-1)
    bad, err = 0, 0.0
    for start in range(0, flat_g.numel(), CHUNK):
        g64 = flat_g[start:start + CHUNK].to(torch.float64)
        w64 = flat_w[start:start + CHUNK].to(torch.float64)
        close = torch.isclose(g64, w64, rtol=tol, atol=tol, equal_nan=True)
        n = int((~close).sum())
        if n:
            bad += n
            err = max(err, (g64 - w64).abs().nan_to_num(float("inf")).max().item())
    return bad, err
