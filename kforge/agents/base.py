"""The agent seam: every agent (embedded expert or LLM) generates and analyses through this."""

from __future__ import annotations

from typing import Protocol

from kforge.schema import AnalysisRequest, AnalysisResult, GenerationRequest, GenerationResult


class Agent(Protocol):
    """A generation + performance-analysis agent.

    ``generate`` writes a candidate (round 0) or refines the previous one from feedback and
    recommendations (later rounds). ``analyze`` reads a profile and returns recommendations.
    Neither may raise for a bad model reply: failures become a ``GenerationResult`` with
    ``source=None`` and a reason in ``extraction``, or a transcript with ``error`` set.
    """

    name: str

    def generate(self, request: GenerationRequest) -> GenerationResult: ...

    def analyze(self, request: AnalysisRequest) -> AnalysisResult: ...
