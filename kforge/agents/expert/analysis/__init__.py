"""The expert's performance analysis, dispatched by platform.

``recommend(request)`` reads ``request.plan`` (``{"platform", "graph", <platform>: knobs}``
as written by :class:`~kforge.agents.expert.agent.ExpertAgent`) and the profile, and returns
a :class:`~kforge.schema.Recommendation`. The ``cpu`` rules live in :mod:`cpu_compiled_analysis`; a
platform ``P`` plugs in as a module ``kforge.agents.expert.P_analysis`` exposing
``recommend(request) -> Recommendation`` or ``analyze_P(request, plan) -> Recommendation``.
"""

from __future__ import annotations

import importlib

from kforge.agents.expert.analysis.cpu import evidence, recommend_compiled_cpu
from kforge.schema import AnalysisRequest, Recommendation


def recommend(request: AnalysisRequest) -> Recommendation:
    profile = request.profile
    if not profile.ok or profile.candidate is None:
        return Recommendation(
            bottleneck="unknown",
            evidence=evidence(profile),
            summary=f"no usable profile ({profile.reason}): nothing to analyse",
        )
    if request.platform != "cpu":
        module_name = f"kforge.agents.expert.analysis.{request.platform}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name != module_name:
                raise
            return Recommendation(bottleneck="unknown", evidence=evidence(profile),
                                  summary=f"the expert has no analysis rules for {request.platform!r}")
        if hasattr(module, "recommend"):
            result: Recommendation = module.recommend(request)
        else:  # e.g. triton_analysis.analyze_triton(request, plan)
            result = getattr(module, f"analyze_{request.platform}")(request, request.plan)
        return result
    if request.plan.get("compiler") != "fusion-v2":
        return Recommendation(bottleneck="unknown", evidence=evidence(profile),
                              summary="the candidate carries no expert plan (not an expert candidate)")
    return recommend_compiled_cpu(request)
