"""The embedded ``expert`` agent: deterministic, rule-based generation and analysis.

A small fusion compiler (docs/EXPERT.md), one subpackage a pass::

    capture/   the problem's Model traced by make_fx, sizes symbolic
    ir/        the op-graph IR over one op table (ir/ops.py), ATen handlers, rewrites
    plan/      the fusion planner, index lowering, kernels, knobs, the precision ladder, rounds
    codegen/   one Backend protocol (codegen/backend.py): triton/, cpu/, cuda/
    analysis/  profile -> the next round's knob changes, per backend

``errors.py`` holds the error types every pass raises.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ExpertAgent"]


def __getattr__(name: str) -> Any:  # lazy: importing the IR alone needs no codegen
    if name == "ExpertAgent":
        from kforge.agents.expert.agent import ExpertAgent

        return ExpertAgent
    raise AttributeError(name)
