"""Deterministic test inputs, shared by the reference worker and the candidate worker.

Both processes rebuild the same inputs from ``(problem, sizes, seed, distribution)``, so the
reference's outputs never exist inside the candidate's process. Floating inputs are redrawn
from one of several distributions (integer inputs such as indices keep the problem's own)::

    native   what ``get_inputs()`` returns
    signed   standard normal (negative values even if the problem draws from [0, 1))
    heavy    Cauchy-like, clipped to +-1e3 (outliers that break naive max/exp tricks):
             ``(pi/4) v / (1/4 - v^2)`` for v uniform in [-1/2, 1/2), the poles of
             ``tan(pi v)`` and its 1/x tails, in plain IEEE arithmetic. ``torch.tan`` drew
             different last bits now and then in the candidate's process and the
             reference's (seen in CI and on the H200, always on this case, never
             reproduced outside the sandbox; vectorised transcendental libraries may pick
             code paths by buffer alignment); +, -, * and / are rounded the same everywhere
    scaled   native x 64 (large magnitudes: overflow in an unshifted exp shows up)
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kforge.verifier.protocol import tensor_bytes

DISTRIBUTIONS: tuple[str, ...] = ("native", "signed", "heavy", "scaled")


@dataclass(frozen=True)
class Case:
    index: int
    seed: int
    dist: str
    sizes: dict[str, int] | None  # None: the preset's sizes; else the sizes of a shape case

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "seed": self.seed, "dist": self.dist, "sizes": self.sizes}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Case:
        return cls(int(data["index"]), int(data["seed"]), str(data["dist"]), data.get("sizes"))


def plan_cases(trials: int, shape_sizes: dict[str, int] | None, base_seed: int = 1234) -> list[Case]:
    """``max(trials, 4)`` cases at the preset size cycling through the distributions, plus one
    case at other sizes (shape specialisation) when ``shape_sizes`` is given."""
    n = max(trials, len(DISTRIBUTIONS))
    cases = [Case(i, base_seed + 7919 * i, DISTRIBUTIONS[i % len(DISTRIBUTIONS)], None) for i in range(n)]
    if shape_sizes:
        cases.append(Case(n, base_seed + 7919 * n, "native", dict(shape_sizes)))
    return cases


def alternative_sizes(sizes: dict[str, int]) -> list[dict[str, int]]:
    """Other size sets to try for the shape case, most different first: every size constant
    of at least 16 scaled by about 3/4 (odd, off any power of two), then halved."""
    options = []
    for scale in (lambda v: v * 3 // 4 + 1, lambda v: max(1, v // 2)):
        alt = {k: (scale(v) if v >= 16 else v) for k, v in sizes.items()}
        if alt != sizes and alt not in options:
            options.append(alt)
    return options


def _redraw(t: torch.Tensor, dist: str, gen: torch.Generator) -> torch.Tensor:
    if not t.is_floating_point() or dist == "native":
        return t
    if dist == "signed":
        return torch.randn(t.shape, generator=gen, dtype=t.dtype)
    if dist == "heavy":  # Cauchy-like: tan(pi v) has the same poles; +, -, *, / round the same everywhere
        v = torch.rand(t.shape, generator=gen, dtype=torch.float64) - 0.5
        return ((torch.pi / 4) * v / (0.25 - v * v)).clamp(-1e3, 1e3).to(t.dtype)
    if dist == "scaled":
        return t * 64
    raise ValueError(f"unknown input distribution {dist!r}")


def make_inputs(module: Any, case: Case, device: str, *, draw_on_device: bool = False) -> list[Any]:
    """The inputs of one case: ``get_inputs()`` under the case's seed, redrawn, on ``device``.

    ``draw_on_device`` runs ``get_inputs()`` with ``device`` as the default device: the timing
    path's full-size inputs (GBs) come from the GPU's generator in milliseconds instead of
    seconds of CPU sampling. Correctness cases keep CPU draws (the same values on every host)."""
    torch.manual_seed(case.seed)
    if draw_on_device and device != "cpu":
        with torch.device(device):
            raw = list(module.get_inputs())
    else:
        raw = list(module.get_inputs())
    gen = torch.Generator().manual_seed(case.seed + 1)
    out: list[Any] = []
    for value in raw:
        if isinstance(value, torch.Tensor) and (case.dist == "native" or not value.is_floating_point()):
            value = value.detach().to(device)  # no round trip through the host
        elif isinstance(value, torch.Tensor):
            value = _redraw(value.detach().cpu(), case.dist, gen).to(device)
        out.append(value)
    return out


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)


def input_digests(values: list[Any]) -> list[str]:
    """sha256 per value: shape, dtype and bytes of a tensor, ``repr`` of anything else (one
    pass over the bytes; a mismatch can then name the input that differs)."""
    out = []
    for value in values:
        h = hashlib.sha256()
        if isinstance(value, torch.Tensor):
            t = value.detach().to("cpu").contiguous()
            h.update(f"{tuple(t.shape)}{t.dtype}".encode())
            h.update(tensor_bytes(t))
        else:
            h.update(repr(value).encode())
        out.append(h.hexdigest())
    return out


def combine(digests: list[str]) -> str:
    """One digest of a list of :func:`input_digests`."""
    return hashlib.sha256("".join(digests).encode()).hexdigest()


def digest(values: list[Any]) -> str:
    """One digest of every value in ``values`` (see :func:`input_digests`)."""
    return combine(input_digests(values))


def load_case_problem(path: Path, preset: str, sizes: dict[str, int] | None) -> Any:
    """The problem module with the case's sizes applied (``kforge.problems``)."""
    from kforge.problems import load_problem

    return load_problem(path, preset=preset, sizes=sizes)
