"""``ExpertAgent``: the embedded, deterministic generation + analysis agent.

generate: the fusion compiler, for every platform with a backend (``codegen/backend.py``:
triton, cpu, cuda): capture -> IR -> plan (:func:`~.plan.planner.plan_problem`), this round's
knobs (:func:`~.plan.rounds.round_knobs`: round 0 the backend's defaults, later the analysis'
actions or a step up the precision ladder), the backend renders; the plan record
(:mod:`.plan.record`) rides with the candidate. analyze: :func:`.analysis.recommend`. Both
record a :class:`~kforge.schema.Transcript` with the same messages an LLM would have been sent.
"""

from __future__ import annotations

import json

from kforge.agents.expert.analysis import recommend
from kforge.agents.expert.codegen.backend import check_storage, get_backend
from kforge.agents.expert.errors import UnsupportedError
from kforge.agents.expert.plan.planner import plan_problem
from kforge.agents.expert.plan.record import plan_record
from kforge.agents.expert.plan.rounds import failed_precisions, round_knobs
from kforge.agents.prompting import render_analysis_messages, render_generation_messages
from kforge.config import AgentConfig
from kforge.schema import (
    AnalysisRequest,
    AnalysisResult,
    GenerationRequest,
    GenerationResult,
    Transcript,
    Usage,
)


class ExpertAgent:
    """Rule-based agent; ``config.model`` names it in transcripts (e.g. ``kforge/expert-v1``)."""

    name = "expert"

    def __init__(self, config: AgentConfig) -> None:
        self.config = config

    def _transcript(self, role: str, messages: list[dict[str, str]], response: str,
                    error: str | None = None) -> Transcript:
        return Transcript(agent=self.name, model=self.config.model, role=role,  # type: ignore[arg-type]
                          messages=messages, response=response, usage=Usage(), error=error)

    def generate(self, request: GenerationRequest) -> GenerationResult:
        messages = render_generation_messages(request)
        try:
            backend = get_backend(request.platform)
            program = plan_problem(request.problem_source)
            check_storage(backend, program)
            knobs, notes = round_knobs(backend, program, request)
            source = backend.render(program, knobs, request.policy, request.problem_source)
        except UnsupportedError as err:
            reason = str(err)
            return GenerationResult(source=None, extraction=reason, plan={},
                                    transcript=self._transcript("generate", messages, reason, error=reason))
        plan = plan_record(program, knobs, notes, request.platform, failed_precisions(request))
        return GenerationResult(source=source, extraction="ok", plan=plan.model_dump(mode="json"),
                                transcript=self._transcript("generate", messages, source))

    def analyze(self, request: AnalysisRequest) -> AnalysisResult:
        messages = render_analysis_messages(request)
        recommendation = recommend(request)
        response = json.dumps(recommendation.model_dump(mode="json"), sort_keys=True, indent=1)
        return AnalysisResult(recommendation=recommendation,
                              transcript=self._transcript("analyze", messages, response))
