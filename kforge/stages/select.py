"""Stage `select`: pick the best verified round and time it against eager and torch.compile.

The winner is re-timed in one process together with both baselines (alternated), so every
speedup in the report compares numbers taken in the same run. A candidate faster than the
roofline allows is flagged and never selected.
"""

from __future__ import annotations

import time
from pathlib import Path

from kforge.stages.context import StageContext, read_record, record_digest, write_record
from kforge.stages.records import (
    AnalysisRecord,
    CandidateRecord,
    ProfileRecord,
    SelectionRecord,
    VerifyRecord,
)


def _status_without_winner(verdicts: list[VerifyRecord]) -> tuple[str, str]:
    reasons = [v.verdict.reason for v in verdicts]
    last = verdicts[-1].verdict
    if all(r == "platform_unavailable" for r in reasons):
        return "unavailable", last.detail
    if "no_device" in reasons:
        return "compiled_only", "built here; no device to run it on"
    if any(v.verdict.ok and v.verdict.interpreted for v in verdicts):
        return "verified_interpreted", "verified under an interpreter: correctness only, not timed"
    return "failed", f"{last.reason}: {last.detail}"[:500]


def run_select(ctx: StageContext, *, round_dirs: list[Path], out: Path) -> SelectionRecord:
    cands = [read_record(d / "candidate.json", CandidateRecord) for d in round_dirs]
    verdicts = [read_record(d / "verify.json", VerifyRecord) for d in round_dirs]
    profiles = [read_record(d / "profile.json", ProfileRecord) for d in round_dirs]
    analyses = [read_record(d / "analysis.json", AnalysisRecord) for d in round_dirs]
    first = cands[0]
    spent = {
        "prompt_tokens": sum(c.prompt_tokens for c in cands) + sum(a.prompt_tokens for a in analyses),
        "completion_tokens": sum(c.completion_tokens for c in cands) + sum(a.completion_tokens for a in analyses),
        "cost_usd": round(sum(c.cost_usd for c in cands) + sum(a.cost_usd for a in analyses), 6),
    }
    wall = sum(c.seconds for c in cands) + sum(a.seconds for a in analyses)
    wall += sum(v.verdict.seconds for v in verdicts) + sum(p.seconds for p in profiles)
    common = {
        "agent": first.agent, "platform": first.platform, "suite": first.suite, "problem": first.problem,
        "policy": ctx.config.policy, "rounds_used": sum(1 for c in cands if c.mode != "carry"), **spent,
        "transfer_from": ctx.config.transfer.source_platform if "transfer" in first.used else None,
    }

    timed = [
        (p.profile.candidate.median_ms, i)
        for i, p in enumerate(profiles)
        if verdicts[i].verdict.ok and p.profile and p.profile.ok and p.profile.candidate
    ]
    flagged = {i for i, p in enumerate(profiles) if p.profile and p.profile.extra.get("beats_roofline")}
    eligible = sorted((ms, i) for ms, i in timed if i not in flagged)
    if not eligible:
        status, detail = _status_without_winner(verdicts)
        if flagged:
            status, detail = "roofline_flagged", "every verified round beat the roofline: not trusted, not shipped"
        record = SelectionRecord(**common, status=status, detail=detail, wall_s=round(wall, 3))
        write_record(out, record, ctx.store)
        return record

    best = eligible[0][1]
    best_dir, best_source = round_dirs[best], verdicts[best].source
    suite_cfg, prof = ctx.config.suites[first.suite], ctx.config.profile
    key = ctx.action_key(
        "select", platform=first.platform, source=best_source, problem=verdicts[best].problem_source,
        preset=suite_cfg.preset, sizes=suite_cfg.sizes, settings=prof.model_dump(mode="json"),
    )
    hit = ctx.store.action_get(key)
    if hit is None:
        from kforge.stages.profile import host_peaks
        from kforge.verifier import profile_candidate

        start = time.perf_counter()
        profile = profile_candidate(
            (best_dir / "kernel.py").read_text(), ctx.problem_path(first.suite, first.problem),
            platform=first.platform, preset=suite_cfg.preset, sizes=suite_cfg.sizes,
            build_dir=ctx.build_dir.resolve(), baselines=True, warmup=prof.warmup, reps=prof.reps,
            threads=prof.threads, timeout_s=prof.timeout_s, peaks=host_peaks(ctx, verdicts[best].verdict.device),
            remeasure=lambda: host_peaks(ctx, verdicts[best].verdict.device, fresh=True),
        )
        hit = {"profile": ctx.store.put_json(profile), "seconds": round(time.perf_counter() - start, 3)}
        ctx.ledger("select", platform=first.platform, problem=first.problem, source=best_source)
        ctx.store.action_put(key, hit, [hit["profile"]])
    from kforge.schema import Profile

    profile = Profile.model_validate(ctx.store.get_json(hit["profile"]))
    record = _timed_record(common, profile, best, best_dir, best_source, hit, wall)
    write_record(out, record, ctx.store)
    return record


def _ratio(base: float | None, cand: float) -> float | None:
    return round(base / cand, 4) if base and cand > 0 else None


def _timed_record(common: dict, profile, best: int, best_dir: Path, best_source, hit: dict, wall: float) -> SelectionRecord:  # type: ignore[no-untyped-def,type-arg]
    if not profile.ok or profile.candidate is None:
        return SelectionRecord(
            **common, status="failed", detail=f"timing against baselines failed: {profile.reason} {profile.detail}"[:500],
            best_round=best, wall_s=round(wall + hit["seconds"], 3), selection_profile=hit["profile"],
        )
    cand = profile.candidate.median_ms
    eager = profile.eager.median_ms if profile.eager else None
    compiled = profile.compiled.median_ms if profile.compiled else None
    baselines = [b for b in (eager, compiled) if b]
    flagged = bool(profile.extra.get("beats_roofline"))
    return SelectionRecord(
        **common,
        status="roofline_flagged" if flagged else "verified",
        detail="faster than the roofline allows: not trusted, not shipped" if flagged else "",
        best_round=best,
        best_candidate=record_digest(best_dir / "candidate.json"),
        best_source=best_source,
        candidate_ms=round(cand, 6),
        eager_ms=round(eager, 6) if eager else None,
        compile_ms=round(compiled, 6) if compiled else None,
        candidate_cv=round(profile.candidate.cv, 4),
        speedup_vs_eager=_ratio(eager, cand),
        speedup_vs_compile=_ratio(compiled, cand),
        speedup_vs_best=_ratio(min(baselines), cand) if baselines else None,
        device=profile.device,
        wall_s=round(wall + hit["seconds"], 3),
        selection_profile=hit["profile"],
    )
