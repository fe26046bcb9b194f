"""The expert's performance analysis: a profiled candidate and its plan -> a
:class:`~kforge.schema.Recommendation` for the next round.

``recommend(request)`` reads the plan record (``plan/record.py``) and its knobs as the backend's
typed records, and asks the candidate's backend (``codegen/backend.py``) for its rules:
:mod:`.triton`, :mod:`.cpu`, :mod:`.cuda`. A profile that is not usable, or a plan that is no
expert plan, gets a recommendation of ``unknown`` that says so.
"""

from __future__ import annotations

from kforge.agents.expert.analysis.evidence import evidence
from kforge.agents.expert.codegen.backend import get_backend
from kforge.agents.expert.errors import PlanError, UnsupportedError
from kforge.agents.expert.plan.record import read_plan
from kforge.schema import AnalysisRequest, Recommendation


def recommend(request: AnalysisRequest) -> Recommendation:
    profile = request.profile
    if not profile.ok or profile.candidate is None:
        return Recommendation(bottleneck="unknown", evidence=evidence(profile),
                              summary=f"no usable profile ({profile.reason}): nothing to analyse")
    plan = read_plan(request.plan)
    if plan is None:
        return Recommendation(bottleneck="unknown", evidence=evidence(profile),
                              summary="the candidate carries no expert plan (not an expert candidate)")
    try:
        backend = get_backend(request.platform)
    except UnsupportedError:
        return Recommendation(bottleneck="unknown", evidence=evidence(profile),
                              summary=f"the expert has no analysis rules for {request.platform!r}")
    try:
        knobs = backend.knobs_of(plan)
    except PlanError as err:
        return Recommendation(bottleneck="unknown", evidence=evidence(profile),
                              summary=f"the plan's knobs are not {request.platform}'s ({err}): nothing to analyse")
    return backend.recommend(request, plan, knobs)
