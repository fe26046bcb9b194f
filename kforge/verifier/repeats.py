"""Verification's look at repetition: the instance that ran the cases, called again and again.

After the cases pass, the candidate's worker calls the same ``ModelNew`` ``REPEATS`` more times
on two buffer sets (pointer, shape and version unchanged), each call's inputs a case's inputs
changed by a fresh content (``content.py``), plus a fresh instance once. The contents come from
``repeat_plan(seed)``: the seed is secret to the parent and the reference's worker, which
answers for every call of the plan (``reference_answers``);
the parent (or on a GPU the judge) compares (``correctness.judge_repeats``). An answer that is
missing, or wrong for its inputs, is ``stale_output``: a cache keyed on the pointer, shape,
version or sampled elements, a partial recompute on repeated inputs, a result that goes stale
after N calls.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from kforge.verifier.content import Content, draw, rebuild

REPEATS = 16  # calls of the verified instance in the repeat phase, every answer held to the reference
RUNS = 2  # consecutive calls on one buffer set


@dataclass(frozen=True)
class RepeatCall:
    rep: int  # -1: the fresh instance
    slot: int
    case: int  # 0 or 1: which of the two cases' inputs the content changes
    content: Content


def repeat_plan(seed: int) -> list[RepeatCall]:
    """The repeat phase, the same in the candidate's and the reference's worker."""
    rng = random.Random(seed)
    calls = []
    for rep in range(REPEATS):
        slot = (rep // RUNS) % 2
        visit = (rep // (RUNS * 2)) * RUNS + rep % RUNS
        calls.append(RepeatCall(rep, slot, visit % 2, draw(rng)))
    calls.append(RepeatCall(-1, 0, 0, draw(rng)))
    return calls


Emit = Callable[[RepeatCall, list[torch.Tensor]], None]


def _tensors(out: Any) -> list[torch.Tensor]:
    if type(out) is torch.Tensor:
        return [out]
    if type(out) in (tuple, list):
        return [t for t in out if type(t) is torch.Tensor]
    return []


def repeat_phase(model: Any, fresh: Callable[[], Any], bases: list[list[Any]], plan: list[RepeatCall],
                 emit: Emit) -> None:
    """The candidate's side: every call of ``plan`` on refilled buffers, each answer to
    ``emit`` as it comes (as bytes, or to the judge, which acks before the next call: no copy
    of a GPU-sized output is held)."""
    buffers = [[v.detach().clone() if isinstance(v, torch.Tensor) else v for v in bases[0]] for _ in range(2)]
    with torch.no_grad():
        for call in plan:
            values = rebuild(bases[call.case], call.content)
            slot = buffers[call.slot]
            for buf, v in zip(slot, values, strict=True):
                if isinstance(buf, torch.Tensor):
                    buf.data.copy_(v)  # .data: pointer, shape and version counter stay
            instance = fresh() if call.rep < 0 else model
            out = instance(*slot)
            emit(call, _tensors(out))
            del out


def reference_answers(model: Any, bases: list[list[Any]], plan: list[RepeatCall]) -> Iterator[tuple[RepeatCall, list[Any]]]:
    """The reference's side: its outputs for every call's inputs, one call at a time."""
    with torch.no_grad():
        for call in plan:
            yield call, _tensors(model(*rebuild(bases[call.case], call.content)))
