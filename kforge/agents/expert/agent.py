"""``ExpertAgent``: the embedded, deterministic generation + analysis agent.

generate: ``triton`` and ``cpu`` go through the fusion compiler (:mod:`.compiler`: capture,
IR, planner, knobs, a backend); ``cuda`` through the earlier pattern matcher (:mod:`.graph`,
:mod:`.cuda_codegen`). Round 0 takes default knobs; later rounds apply the analysis' actions
or, after a failure, step up the precision ladder. analyze: :func:`analysis.recommend`. Both
record a :class:`~kforge.schema.Transcript` with the same messages an LLM would have been sent.
"""

from __future__ import annotations

import json
from typing import Any

from kforge.agents.expert.analysis import recommend
from kforge.agents.expert.errors import PlanError, UnsupportedError
from kforge.agents.expert.graph import KernelGraph, trace_problem
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

FUNCTIONAL_STAGES = ("compile", "verify", "profile")


def cuda_candidate(graph: KernelGraph, request: GenerationRequest) -> tuple[dict[str, Any], str]:
    """Knobs and source for ``cuda`` (``cuda_codegen``): round 0 its default plan; later the
    previous knobs updated by the actions' params; the default again after a functional
    failure or a plan it rejects."""
    from kforge.agents.expert import cuda_codegen as cc

    default = cc.default_cuda_plan(graph, request.policy)
    knobs = dict(default)
    failures = [f for f in request.feedback if f.stage in FUNCTIONAL_STAGES]
    if request.round > 0 and not failures:
        knobs.update({k: v for k, v in request.previous_plan.items() if k in default})
        if request.recommendation is not None:
            for action in request.recommendation.actions:
                knobs.update({k: v for k, v in action.params.items() if k in default})
    try:
        knobs = cc.resolve_cuda_plan(graph, knobs, request.policy)
    except cc.PlanError:
        knobs = default
    return knobs, cc.generate_cuda(graph, knobs, request.policy, request.problem_source)


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
        if request.platform in ("triton", "cpu"):
            return self._compile(request, messages)
        try:
            if request.platform != "cuda":
                raise UnsupportedError(f"the expert has no {request.platform!r} code generator")
            graph = trace_problem(request.problem_source)
            knobs, source = cuda_candidate(graph, request)
        except UnsupportedError as err:
            reason = str(err)
            return GenerationResult(source=None, extraction=reason, plan={},
                                    transcript=self._transcript("generate", messages, reason, error=reason))
        plan_data: dict[str, Any] = {"platform": request.platform, "graph": graph.model_dump(mode="json"), **knobs}
        return GenerationResult(source=source, extraction="ok", plan=plan_data,
                                transcript=self._transcript("generate", messages, source))

    def _compile(self, request: GenerationRequest, messages: list[dict[str, str]]) -> GenerationResult:
        """The fusion compiler's path (:mod:`.compiler`): triton and cpu."""
        from kforge.agents.expert.plan.planner import plan_problem
        from kforge.agents.expert.plan.rounds import failed_precisions, plan_record, round_knobs

        try:
            program = plan_problem(request.problem_source)
            if request.platform == "triton":
                from kforge.agents.expert.codegen.triton.gemm import check_knobs
                from kforge.agents.expert.codegen.triton.render import default_knobs, render_triton

                defaults = default_knobs(program, request.policy)
                knobs, notes = round_knobs(program, defaults, request)
                try:
                    knobs = {n: check_knobs(kv, request.policy) if "precision" in kv else kv for n, kv in knobs.items()}
                except PlanError as err:
                    knobs, notes = defaults, [*notes, f"rejected ({err}): back to the defaults"]
                source = render_triton(program, knobs, request.policy, request.problem_source)
            else:
                from kforge.agents.expert.codegen.cpu.render import DEFAULT_KNOBS, render_cpu

                cpu_defaults = {"program": dict(DEFAULT_KNOBS)}  # one set of knobs for every kernel
                knobs, notes = round_knobs(program, cpu_defaults, request)
                source = render_cpu(program, knobs["program"], request.problem_source)
        except UnsupportedError as err:
            reason = str(err)
            return GenerationResult(source=None, extraction=reason, plan={},
                                    transcript=self._transcript("generate", messages, reason, error=reason))
        plan = plan_record(program, knobs, notes, request.platform, failed_precisions(request))
        plan["rewrites"], plan["rewrite_notes"] = list(program.rewrites), list(program.rewrite_notes)
        return GenerationResult(source=source, extraction="ok", plan=plan,
                                transcript=self._transcript("generate", messages, source))

    def analyze(self, request: AnalysisRequest) -> AnalysisResult:
        messages = render_analysis_messages(request)
        recommendation = recommend(request)
        response = json.dumps(recommendation.model_dump(mode="json"), sort_keys=True, indent=1)
        return AnalysisResult(recommendation=recommendation,
                              transcript=self._transcript("analyze", messages, response))
