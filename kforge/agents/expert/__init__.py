"""The embedded ``expert`` agent: deterministic, rule-based generation and analysis.

``graph`` (the IR) -> ``plans`` (knobs) -> ``cpu_codegen`` (candidate source); ``analysis``
reads profiles and recommends actions that ``plans`` applies in the next round.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ExpertAgent"]


def __getattr__(name: str) -> Any:  # lazy: importing the IR alone needs no codegen
    if name == "ExpertAgent":
        from kforge.agents.expert.agent import ExpertAgent

        return ExpertAgent
    raise AttributeError(name)
