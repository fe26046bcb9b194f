"""The planner's old import path, kept only for ``tests/verifier/test_correctness.py`` (owned
with ``kforge/verifier/``); nothing in ``kforge`` imports it. Import
:mod:`kforge.agents.expert.plan.planner` instead; delete this once that test does."""

from __future__ import annotations

from kforge.agents.expert.plan.planner import plan_problem

__all__ = ["plan_problem"]
