"""The CPU backend's old import path, kept only for ``tests/verifier/test_correctness.py``
(owned with ``kforge/verifier/``); nothing in ``kforge`` imports it. Import
:mod:`kforge.agents.expert.codegen.cpu` instead; delete this once that test does."""

from __future__ import annotations

from kforge.agents.expert.codegen.cpu.render import DEFAULT_KNOBS, render_cpu

__all__ = ["DEFAULT_KNOBS", "render_cpu"]
