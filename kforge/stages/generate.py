"""Stage `generate`: round 0, the agent's first candidate for (agent, platform, problem)."""

from __future__ import annotations

from pathlib import Path

from kforge.schema import GenerationRequest
from kforge.stages.agent_calls import (
    agent_context,
    generate_cached,
    load_example_blob,
    not_asked,
    write_candidate,
)
from kforge.stages.context import StageContext, read_record, record_digest
from kforge.stages.problem import load_error
from kforge.stages.records import CandidateRecord, SelectionRecord


def run_generate(
    ctx: StageContext,
    *,
    agent: str,
    platform: str,
    suite: str,
    problem: str,
    problem_record: Path,
    example_record: Path,
    out_dir: Path,
    transfer_record: Path | None = None,
) -> CandidateRecord:
    used = {"problem": record_digest(problem_record), "example": record_digest(example_record)}
    why = load_error(problem_record)
    if why is not None:  # nobody's candidate: no agent is asked
        return write_candidate(
            ctx, agent=agent, platform=platform, suite=suite, problem=problem, round=0, mode="initial",
            result=not_asked(ctx, agent, why), parent=None, used=used, functional_used=0, optimization_used=0,
            seconds=0.0, out_dir=out_dir,
        )
    source = ctx.problem_path(suite, problem).read_text()
    request = GenerationRequest(
        problem_name=problem,
        problem_source=source,
        platform=platform,
        example=load_example_blob(ctx, example_record),
        policy=ctx.config.policy,
        round=0,
        context=agent_context(
            ctx, agent, platform=platform, suite=suite, problem=problem, run_dir=out_dir.parent, rounds=0
        ),
    )
    if transfer_record is not None:  # cross-platform transfer: the other platform's best kernel
        best = read_record(transfer_record, SelectionRecord)
        if best.verified and best.status in ("shipped", "no_gain") and best.best_source:
            request.transfer_source = ctx.store.get_text(best.best_source)
            request.transfer_platform = best.platform
            used["transfer"] = record_digest(transfer_record)
    result = generate_cached(ctx, agent, request, suite=suite)
    return write_candidate(
        ctx,
        agent=agent,
        platform=platform,
        suite=suite,
        problem=problem,
        round=0,
        mode="initial",
        result=result,
        parent=None,
        used=used,
        functional_used=0,
        optimization_used=0,
        seconds=result.transcript.latency_s,
        out_dir=out_dir,
    )
