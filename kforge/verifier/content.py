"""Input contents that never repeat: every timed and repeated call sees inputs no earlier call saw.

A call's inputs are the base draw of a case (``inputs.make_inputs``) changed by a
:class:`Content`, which the trusted side chooses (the parent for timed calls, a secret seed for
verification's repeat phase) and the candidate's process applies in place::

    scale    every floating input that allows it times sign * 2**exp (exp in {-1, 0, 1}; the
             sign flips only where the input has negative values, so log's or [0, 1] domains
             hold): exact in floating point, undone exactly
    swaps    ``swaps(n)`` positions of each contiguous floating input, chosen by ``seed``, take
             the values of other random positions (where both are non-zero: a triangular or
             sparse input keeps its zeros); undone by writing the saved values back

A cache keyed on a few sampled elements, on the pointer, shape or version, or on a content seen
before then returns a stale answer at positions it cannot predict, and the judge, which rebuilds
the same inputs from the same base and content (:func:`rebuild`) and runs the reference on
them, sees it. Buffers are changed in place through ``.data`` (pointer, shape and version
counter stay), so a refill costs one pass like the old x / x * f alternation, and copying other
contents in (which cooled the caches of the honest control, 1.5-2x slower) is never needed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

EXPONENTS = (-1, 0, 1)


@dataclass(frozen=True)
class Content:
    seed: int
    exp: int = 0
    sign: int = 1

    def to_json(self) -> dict[str, int]:
        return {"seed": self.seed, "exp": self.exp, "sign": self.sign}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Content:
        exp, sign = int(data.get("exp", 0)), int(data.get("sign", 1))
        if exp not in EXPONENTS or sign not in (1, -1):
            raise ValueError(f"not a content: {data!r}")
        return cls(int(data["seed"]), exp, sign)

    @property
    def factor(self) -> float:
        return float(self.sign * 2.0 ** self.exp)


def draw(rng: random.Random) -> Content:
    """A fresh content from the trusted side's generator."""
    return Content(rng.getrandbits(48), rng.choice(EXPONENTS), rng.choice((1, -1)))


def swaps(n: int) -> int:
    """Positions swapped in an input of ``n`` elements."""
    return 0 if n < 2 else min(n // 2, 16 + n // 512)


@dataclass(frozen=True)
class Caps:
    """What a content may do to one input: scale it (finite after x2, normal after /2), flip
    its sign (it has negative values), swap its elements (a contiguous floating tensor)."""

    scale: bool = False
    sign: bool = False
    swap: bool = False


def capabilities(values: list[Any]) -> list[Caps]:
    out = []
    for v in values:
        if not isinstance(v, torch.Tensor) or not v.is_floating_point() or v.is_complex() or not v.numel():
            out.append(Caps())
            continue
        x = v.detach()
        finite = bool(torch.isfinite(x).all())
        big = float(x.abs().max()) if finite else float("inf")
        nonzero = x[x != 0].abs()
        small = float(nonzero.min()) if nonzero.numel() else float("inf")
        info = torch.finfo(x.dtype)
        scale = finite and big * 2 < info.max and (small == float("inf") or small / 2 >= 4 * info.tiny)
        out.append(Caps(scale=scale, sign=scale and bool((x < 0).any()), swap=x.is_contiguous() and x.numel() > 1))
    return out


def _factor(content: Content, caps: Caps) -> float:
    if not caps.scale:
        return 1.0
    return (content.sign if caps.sign else 1) * 2.0 ** content.exp


def _positions(content: Content, index: int, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(distinct positions to write, positions to read), the same in every process."""
    gen = torch.Generator().manual_seed((content.seed * 1009 + index) % (1 << 62))
    m = swaps(n)
    write = torch.unique(torch.randint(0, n, (m,), generator=gen))
    read = torch.randint(0, n, (write.numel(),), generator=gen)
    return write.to(device), read.to(device)


def _swap(t: torch.Tensor, content: Content, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply the content's swaps to ``t`` in place; returns (positions, the values they held)."""
    flat = t.data.view(-1)
    write, read = _positions(content, index, flat.numel(), flat.device)
    held = flat[write].clone()
    new = flat[read]
    flat[write] = torch.where((held != 0) & (new != 0), new, held)
    return write, held


def rebuild(base: list[Any], content: Content, caps: list[Caps] | None = None) -> list[Any]:
    """The inputs ``content`` makes of ``base`` (fresh tensors; ``base`` is untouched): the
    judge's and the reference's side of :class:`LiveSet`."""
    caps = capabilities(base) if caps is None else caps
    out = []
    for i, (v, cap) in enumerate(zip(base, caps, strict=True)):
        if not isinstance(v, torch.Tensor) or not (cap.scale or cap.swap):
            out.append(v)
            continue
        t = v.detach().clone()
        f = _factor(content, cap)
        if f != 1.0:
            t.mul_(f)
        if cap.swap:
            _swap(t, content, i)
        out.append(t)
    return out


class LiveSet:
    """One buffer set of the candidate's (or a baseline's) process, rewritten in place for each
    call: the previous call's swaps undone, rescaled relative to the current factor (a power of
    two: exact), the new swaps applied. Bit for bit what :func:`rebuild` makes."""

    def __init__(self, base: list[Any], caps: list[Caps]) -> None:
        self.values = [v.detach().clone() if isinstance(v, torch.Tensor) else v for v in base]
        self.caps = caps
        self.factors = [1.0] * len(base)
        self.undo: list[tuple[int, torch.Tensor, torch.Tensor]] = []

    def load(self, content: Content) -> list[Any]:
        for i, where, held in reversed(self.undo):
            self.values[i].data.view(-1)[where] = held
        self.undo = []
        for i, (v, cap) in enumerate(zip(self.values, self.caps, strict=True)):
            if not isinstance(v, torch.Tensor) or not (cap.scale or cap.swap):
                continue
            f = _factor(content, cap)
            if f != self.factors[i]:
                v.data.mul_(f / self.factors[i])  # .data: pointer, shape and version stay
                self.factors[i] = f
            if cap.swap:
                where, held = _swap(v, content, i)
                self.undo.append((i, where, held))
        return self.values
