"""Stage `verify`: run the candidate against its reference in the sandboxed verifier."""

from __future__ import annotations

from pathlib import Path

from kforge.schema import TOLERANCES, Verdict
from kforge.stages.context import StageContext, read_record, write_record
from kforge.stages.problem import PROBLEM_ERROR, load_error, problem_error_detail
from kforge.stages.records import CompileRecord, VerifyRecord
from kforge.store import sha256_bytes


def _skip(ctx: StageContext, reason: str, detail: str) -> Verdict:
    tol = TOLERANCES[ctx.config.policy]
    return Verdict(ok=False, reason=reason, detail=detail, policy=ctx.config.policy, atol=tol, rtol=tol)


def run_verify(
    ctx: StageContext, *, platform: str, suite: str, problem: str, kernel: Path, compile_record: Path, out: Path,
    problem_record: Path | None = None,
) -> VerifyRecord:
    """``problem_record``: the problem stage's record; a problem that does not load is judged
    ``problem_error`` with its reason, whatever the candidate (nothing runs)."""
    compiled = read_record(compile_record, CompileRecord)
    problem_path = ctx.problem_path(suite, problem)
    problem_source = sha256_bytes(problem_path.read_bytes())
    why = load_error(problem_record)
    if why is not None:
        verdict = _skip(ctx, PROBLEM_ERROR, problem_error_detail(why))
        record = VerifyRecord(platform=platform, problem_source=problem_source, source=compiled.source, verdict=verdict)
        write_record(out, record, ctx.store)
        return record
    if not compiled.ok:
        verdict = _skip(ctx, compiled.reason, "not verified: the candidate did not build")
        record = VerifyRecord(platform=platform, problem_source=problem_source, source=compiled.source, verdict=verdict)
        write_record(out, record, ctx.store)
        return record
    from kforge.platforms import get_platform

    info = get_platform(platform).describe()
    suite_cfg, verify_cfg = ctx.config.suites[suite], ctx.config.verify
    preset, sizes = (suite_cfg.preset, suite_cfg.sizes) if verify_cfg.preset == "suite" else ("ci", {})
    key = ctx.action_key(
        "verify", platform=platform, info=info.model_dump(mode="json"), source=compiled.source,
        problem=problem_source, policy=ctx.config.policy, preset=preset, sizes=sizes, trials=verify_cfg.trials,
        sanitizer=list(verify_cfg.sanitizer), compare=verify_cfg.compare,
    )
    cached = ctx.cached(key, VerifyRecord)
    if cached is not None:
        write_record(out, cached, ctx.store)
        return cached
    reports: list[dict[str, object]] = []
    if not info.runnable:
        verdict = _skip(ctx, "no_device", f"{platform} cannot run here: {info.reason}")
    else:
        from kforge.verifier import verify_candidate

        source = kernel.read_text()
        verdict = verify_candidate(
            source, problem_path, platform=platform, policy=ctx.config.policy,
            preset=preset, sizes=sizes, build_dir=ctx.build_dir.resolve(), trials=verify_cfg.trials, timeout_s=verify_cfg.timeout_s, memory_mb=verify_cfg.memory_mb,
            compare=verify_cfg.compare,
        )
        if verdict.ok and verdict.device == "cuda" and verify_cfg.sanitizer:
            from kforge.verifier.sanitizer import apply_sanitizers

            verdict, done = apply_sanitizers(
                verdict, source, problem_path, platform=platform, tools=verify_cfg.sanitizer, preset=preset,
                sizes=sizes, build_dir=ctx.build_dir.resolve(), timeout_s=max(300.0, verify_cfg.timeout_s),
            )
            reports = [r.model_dump(mode="json") for r in done]
        ctx.ledger("verify", platform=platform, problem=problem, source=compiled.source, ok=verdict.ok)
    record = VerifyRecord(
        platform=platform, problem_source=problem_source, preset=preset, source=compiled.source, verdict=verdict,
        sanitizer=reports,
    )
    ctx.remember(key, record, [])
    write_record(out, record, ctx.store)
    return record
