"""The CPU backend's old import path, kept only for ``tests/verifier/test_correctness.py``
(owned with ``kforge/verifier/``); nothing in ``kforge`` imports it. Import
:mod:`kforge.agents.expert.codegen.cpu` instead; delete this once that test does."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kforge.agents.expert.codegen.cpu.render import render_cpu as _render
from kforge.agents.expert.plan.kernels import Program
from kforge.agents.expert.plan.knobs import CpuKnobs

DEFAULT_KNOBS: Mapping[str, Any] = CpuKnobs().to_json()


def render_cpu(program: Program, knobs: Mapping[str, Any], problem_source: str) -> str:
    return _render(program, CpuKnobs.from_json(knobs, CpuKnobs()), problem_source)


__all__ = ["DEFAULT_KNOBS", "render_cpu"]
