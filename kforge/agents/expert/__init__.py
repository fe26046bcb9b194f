"""The embedded ``expert`` agent: deterministic, rule-based generation and analysis.

A small fusion compiler (docs/EXPERT.md): ``capture`` -> ``ir`` -> ``planner`` (``lower``,
``kernels``) -> ``compiler`` (knobs per round) -> ``triton_render`` / ``cpu_render``; the
``cuda`` platform keeps the earlier pattern matcher (``graph``, ``fx_lower``, ``cuda_*``).
``analysis`` reads profiles and recommends the actions the next round applies.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ExpertAgent"]


def __getattr__(name: str) -> Any:  # lazy: importing the IR alone needs no codegen
    if name == "ExpertAgent":
        from kforge.agents.expert.agent import ExpertAgent

        return ExpertAgent
    raise AttributeError(name)
