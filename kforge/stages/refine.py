"""Stage `refine`: round N+1 from round N.

- Round N failed (no code, compile error, verification failure, or a verified candidate whose
  checked timing failed: ``stale_output``, ``timing_inconsistent``, ``beats_roofline``, ...) and
  the functional budget is not spent: a *repair* pass, the errors fed back to the generation
  agent (a timing failure as a ``profile`` feedback item with the profiler's reason code).
- Round N verified and the optimisation budget is not spent and the analysis recommended
  something: an *optimize* pass, the recommendations fed to the generation agent.
- Otherwise the candidate is *carried* forward unchanged: its kernel.py is byte-identical, so
  nothing downstream reruns and the round costs nothing. So is it, first of all, when the problem
  file does not load (``problem_error``): no agent is asked.
"""

from __future__ import annotations

from pathlib import Path

from kforge.schema import Feedback, GenerationRequest, GenerationResult, Profile, Transcript
from kforge.stages.agent_calls import (
    agent_context,
    generate_cached,
    load_example_blob,
    write_candidate,
)
from kforge.stages.context import StageContext, read_record, record_digest
from kforge.stages.problem import PROBLEM_ERROR, load_error
from kforge.stages.records import (
    AnalysisRecord,
    CandidateRecord,
    CompileRecord,
    Mode,
    ProfileRecord,
    VerifyRecord,
)

# Verdicts that say nothing about the candidate itself: repairing would be pointless.
NOT_THE_CANDIDATES_FAULT = frozenset({"no_device", "platform_unavailable", "harness_error", PROBLEM_ERROR})


def timing_failure(profiled: ProfileRecord | None) -> Profile | None:
    """The profile of a verified candidate whose timing was rejected for something the candidate
    did (a timed call's stale answer, claims the parent's clock contradicts, a time below the
    roofline, ...); None when it was timed, skipped, or failed for the host's reasons."""
    prof = profiled.profile if profiled is not None else None
    if prof is None or prof.ok or prof.reason in NOT_THE_CANDIDATES_FAULT:
        return None
    return prof


def _feedback(ctx: StageContext, compiled: CompileRecord, verified: VerifyRecord, extraction: str,
              timing: Profile | None = None) -> list[Feedback]:
    if compiled.reason == "no_candidate":
        return [Feedback(stage="generate", reason=extraction, detail="The reply held no usable candidate module.")]
    if not compiled.ok:
        log = ctx.store.get_text(compiled.log) if compiled.log else ""
        return [Feedback(stage="compile", reason=compiled.reason, detail=log)]
    v = verified.verdict
    if v.ok and timing is not None:
        return [Feedback(stage="profile", reason=timing.reason, detail=(
            "The candidate passed verification, but its timed run was rejected: "
            f"{timing.detail or timing.reason}"))]
    return [Feedback(stage="verify", reason=v.reason, detail=v.detail)]


def _carry(prev: CandidateRecord, ctx: StageContext, why: str) -> GenerationResult:
    source = ctx.store.get_text(prev.source) if prev.source else None
    transcript = Transcript(
        agent=prev.agent, model=prev.model, role="generate", messages=[],
        response=f"carried forward from round {prev.round}: {why}",
    )
    return GenerationResult(
        source=source, extraction=prev.extraction, plan=ctx.store.get_json(prev.plan), transcript=transcript
    )


def run_refine(
    ctx: StageContext,
    *,
    round: int,
    prev_dir: Path,
    problem_record: Path,
    example_record: Path,
    out_dir: Path,
) -> CandidateRecord:
    prev = read_record(prev_dir / "candidate.json", CandidateRecord)
    compiled = read_record(prev_dir / "compile.json", CompileRecord)
    verified = read_record(prev_dir / "verify.json", VerifyRecord)
    analysis = read_record(prev_dir / "analysis.json", AnalysisRecord)
    profiled = read_record(prev_dir / "profile.json", ProfileRecord) if (prev_dir / "profile.json").is_file() else None
    timing = timing_failure(profiled) if verified.verdict.ok else None
    budgets = ctx.config.rounds
    functional_used, optimization_used = prev.functional_used, prev.optimization_used

    mode: Mode = "carry"
    why = ""
    feedback: list[Feedback] = []
    broken = load_error(problem_record)
    if broken is not None:  # nobody's candidate: no agent is asked
        why = f"the problem does not load ({PROBLEM_ERROR}: {broken})"
    elif timing is not None:  # verified, but the checked timing caught it: repair, as a failure
        if functional_used >= budgets.functional:
            why = f"functional (repair) budget spent (timing rejected: {timing.reason})"
        else:
            mode, functional_used = "repair", functional_used + 1
            feedback = _feedback(ctx, compiled, verified, prev.extraction, timing)
    elif verified.verdict.ok:
        rec = analysis.recommendation
        if optimization_used >= budgets.optimization:
            why = "optimisation budget spent"
        elif rec is None or not rec.actions:
            why = "the analysis recommended nothing more"
        else:
            mode, optimization_used = "optimize", optimization_used + 1
    elif verified.verdict.reason in NOT_THE_CANDIDATES_FAULT:
        why = f"cannot verify here ({verified.verdict.reason})"
    elif functional_used >= budgets.functional:
        why = "functional (repair) budget spent"
    else:
        mode, functional_used = "repair", functional_used + 1
        feedback = _feedback(ctx, compiled, verified, prev.extraction)

    if mode == "carry":
        result = _carry(prev, ctx, why)
    else:
        request = GenerationRequest(
            problem_name=prev.problem,
            problem_source=ctx.problem_path(prev.suite, prev.problem).read_text(),
            platform=prev.platform,
            example=load_example_blob(ctx, example_record),
            policy=ctx.config.policy,
            round=round,
            previous_source=ctx.store.get_text(prev.source) if prev.source else None,
            previous_plan=ctx.store.get_json(prev.plan),
            feedback=feedback,
            recommendation=analysis.recommendation if mode == "optimize" else None,
            verified_margin=verified.verdict.max_margin if verified.verdict.ok else None,
            failed_margin=verified.verdict.max_margin if not verified.verdict.ok else None,
            context=agent_context(
                ctx, prev.agent, platform=prev.platform, suite=prev.suite, problem=prev.problem,
                run_dir=prev_dir.parent, rounds=round,
            ),
        )
        result = generate_cached(ctx, prev.agent, request, suite=prev.suite)
    used = {
        "problem": record_digest(problem_record),
        "example": record_digest(example_record),
        "compile": record_digest(prev_dir / "compile.json"),
        "verify": record_digest(prev_dir / "verify.json"),
        "analysis": record_digest(prev_dir / "analysis.json"),
    }
    if profiled is not None:
        used["profile"] = record_digest(prev_dir / "profile.json")
    return write_candidate(
        ctx,
        agent=prev.agent,
        platform=prev.platform,
        suite=prev.suite,
        problem=prev.problem,
        round=round,
        mode=mode,
        result=result,
        parent=record_digest(prev_dir / "candidate.json"),
        used=used,
        functional_used=functional_used,
        optimization_used=optimization_used,
        seconds=result.transcript.latency_s if mode != "carry" else 0.0,
        out_dir=out_dir,
    )
