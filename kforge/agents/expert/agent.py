"""``ExpertAgent``: the embedded, deterministic generation + analysis agent.

generate: trace the problem to the IR, pick a plan (round 0: conservative; later rounds: the
previous plan with the recommendation's actions applied, or a safer plan after a compile or
verification failure), emit the candidate. analyze: :func:`analysis.recommend`. Both record a
:class:`~kforge.schema.Transcript` with the same messages an LLM would have been sent.
"""

from __future__ import annotations

import json
from typing import Any

from kforge.agents.expert.analysis import recommend
from kforge.agents.expert.cpu_codegen import generate_cpu_candidate
from kforge.agents.expert.graph import KernelGraph, UnsupportedError, trace_problem
from kforge.agents.expert.plans import (
    CpuPlan,
    apply_actions,
    initial_plan,
    plan_from_dict,
    safer_plan,
)
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


def next_cpu_plan(graph: KernelGraph, request: GenerationRequest) -> CpuPlan:
    """The plan for this round, from the previous one and what happened to it."""
    if request.round == 0 or not request.previous_plan.get("cpu"):
        return initial_plan(graph.kind)
    previous = plan_from_dict(request.previous_plan["cpu"])
    failures = [f for f in request.feedback if f.stage in FUNCTIONAL_STAGES]
    if failures:
        return safer_plan(previous, f"{failures[0].stage}:{failures[0].reason}")
    if request.recommendation is not None:
        return apply_actions(previous, request.recommendation.actions)
    return previous


def _gpu_generator(platform: str) -> tuple[Any, Any, Any, type[Exception]]:
    """(default plan, resolve plan, generate, plan error) of the ``triton`` or ``cuda`` generator."""
    if platform == "triton":
        from kforge.agents.expert import triton_codegen as tc

        return tc.default_plan, tc.resolve_plan, tc.generate_triton, tc.PlanError
    from kforge.agents.expert import cuda_codegen as cc

    return cc.default_cuda_plan, cc.resolve_cuda_plan, cc.generate_cuda, cc.PlanError


def gpu_candidate(graph: KernelGraph, request: GenerationRequest) -> tuple[dict[str, Any], str]:
    """Knobs and source for a GPU platform (``triton``: ``triton_codegen``; ``cuda``:
    ``cuda_codegen``): round 0 its default plan; later the previous knobs updated by the
    actions' params; the default again after a functional failure or a plan the policy
    rejects."""
    default_plan, resolve_plan, generate, plan_error = _gpu_generator(request.platform)
    default = default_plan(graph, request.policy)
    knobs = dict(default)
    failures = [f for f in request.feedback if f.stage in FUNCTIONAL_STAGES]
    if failures and request.platform == "triton" and request.previous_plan:
        from kforge.agents.expert.triton_codegen import safer_plan

        previous = {k: v for k, v in request.previous_plan.items() if k in default}
        try:  # e.g. an accuracy failure of a lossy GEMM mode moves to the bf16 hi/lo split
            knobs = safer_plan(graph, {**default, **previous}, request.policy, f"{failures[0].reason}: {failures[0].detail}")
            return knobs, generate(graph, knobs, request.policy, request.problem_source)
        except plan_error:
            pass
    if request.round > 0 and not failures:
        knobs.update({k: v for k, v in request.previous_plan.items() if k in default})
        if request.recommendation is not None:
            for action in request.recommendation.actions:
                knobs.update({k: v for k, v in action.params.items() if k in default})
    try:
        knobs = resolve_plan(graph, knobs, request.policy)
    except plan_error:
        knobs = default
    return knobs, generate(graph, knobs, request.policy, request.problem_source)


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
            graph = trace_problem(request.problem_source)
            if request.platform in ("triton", "cuda"):
                knobs, source = gpu_candidate(graph, request)
                plan_data: dict[str, Any] = {"platform": request.platform,
                                             "graph": graph.model_dump(mode="json"), **knobs}
                return GenerationResult(source=source, extraction="ok", plan=plan_data,
                                        transcript=self._transcript("generate", messages, source))
            if request.platform != "cpu":
                raise UnsupportedError(f"the expert has no {request.platform!r} code generator")
            plan = next_cpu_plan(graph, request)
            source = generate_cpu_candidate(graph, plan, request.problem_source)
        except UnsupportedError as err:
            reason = str(err)
            return GenerationResult(source=None, extraction=reason, plan={},
                                    transcript=self._transcript("generate", messages, reason, error=reason))
        plan_data = {"platform": request.platform, "graph": graph.model_dump(mode="json"),
                     "cpu": plan.model_dump(mode="json")}
        return GenerationResult(source=source, extraction="ok", plan=plan_data,
                                transcript=self._transcript("generate", messages, source))

    def _compile(self, request: GenerationRequest, messages: list[dict[str, str]]) -> GenerationResult:
        """The fusion compiler's path (:mod:`.compiler`): triton and cpu."""
        from kforge.agents.expert.compiler import plan_record, round_knobs
        from kforge.agents.expert.planner import plan_problem

        try:
            program = plan_problem(request.problem_source)
            if request.platform == "triton":
                from kforge.agents.expert.triton_matmul import PlanError, check_knobs
                from kforge.agents.expert.triton_render import default_knobs, render_triton

                defaults = default_knobs(program, request.policy)
                knobs, notes = round_knobs(program, defaults, request)
                try:
                    knobs = {n: check_knobs(kv, request.policy) if "precision" in kv else kv for n, kv in knobs.items()}
                except PlanError as err:
                    knobs, notes = defaults, [*notes, f"rejected ({err}): back to the defaults"]
                source = render_triton(program, knobs, request.policy, request.problem_source)
            else:
                from kforge.agents.expert.cpu_render import DEFAULT_KNOBS, render_cpu

                cpu_defaults = {"program": dict(DEFAULT_KNOBS)}  # one set of knobs for every kernel
                knobs, notes = round_knobs(program, cpu_defaults, request)
                source = render_cpu(program, knobs["program"], request.problem_source)
        except UnsupportedError as err:
            reason = str(err)
            return GenerationResult(source=None, extraction=reason, plan={},
                                    transcript=self._transcript("generate", messages, reason, error=reason))
        plan = plan_record(program, knobs, notes, request.platform)
        return GenerationResult(source=source, extraction="ok", plan=plan,
                                transcript=self._transcript("generate", messages, source))

    def analyze(self, request: AnalysisRequest) -> AnalysisResult:
        messages = render_analysis_messages(request)
        recommendation = recommend(request)
        response = json.dumps(recommendation.model_dump(mode="json"), sort_keys=True, indent=1)
        return AnalysisResult(recommendation=recommendation,
                              transcript=self._transcript("analyze", messages, response))
