"""Stage `analyze`: the performance-analysis agent reads a profile and recommends changes."""

from __future__ import annotations

from pathlib import Path

from kforge.schema import AnalysisRequest
from kforge.stages.agent_calls import agent_context, analyze_cached
from kforge.stages.context import StageContext, read_record, write_record
from kforge.stages.records import AnalysisRecord, CandidateRecord, ProfileRecord


def run_analyze(ctx: StageContext, *, candidate: Path, kernel: Path, profile_record: Path, out: Path) -> AnalysisRecord:
    cand = read_record(candidate, CandidateRecord)
    prof = read_record(profile_record, ProfileRecord)
    base = {"agent": cand.agent, "platform": cand.platform, "source": cand.source}
    if prof.profile is None or not prof.profile.ok:
        why = prof.skipped or (prof.profile.reason if prof.profile else "no profile")
        record = AnalysisRecord(**base, skipped=why)
    else:
        request = AnalysisRequest(
            problem_name=cand.problem,
            platform=cand.platform,
            policy=ctx.config.policy,
            candidate_source=kernel.read_text(),
            plan=ctx.store.get_json(cand.plan),
            profile=prof.profile,
            context=agent_context(
                ctx, cand.agent, platform=cand.platform, suite=cand.suite, problem=cand.problem,
                run_dir=candidate.parent.parent, rounds=cand.round + 1,
            ),
        )
        if request.context is not None:  # an LLM analyst reads the reference Model too
            request.problem_source = ctx.problem_path(cand.suite, cand.problem).read_text()
        result = analyze_cached(ctx, cand.agent, request)
        usage = result.transcript.usage
        record = AnalysisRecord(
            **base,
            recommendation=result.recommendation,
            transcript=ctx.store.put_json(result.transcript),
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cost_usd=usage.cost_usd or 0.0,  # None (unknown price) stays in the transcript
            seconds=result.transcript.latency_s,
        )
    write_record(out, record, ctx.store)
    return record
