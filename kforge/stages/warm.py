"""Stage `warm`: torch.compile of a problem's reference, compiled once per problem in a job that
shares the machine, so the timing jobs that own it (`profile` with baselines, `select`) load the
compiled baseline from its caches instead of compiling it (kforge/verifier/compile_cache.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kforge.schema import ProblemMeta
from kforge.stages.context import StageContext, read_record, write_record
from kforge.stages.records import WarmRecord

if TYPE_CHECKING:
    from kforge.verifier.compile_cache import Seed


def run_warm(ctx: StageContext, *, platform: str, suite: str, problem: str, problem_record: Path,
             out: Path) -> WarmRecord:
    meta = read_record(problem_record, ProblemMeta)
    base = {"platform": platform, "problem_source": meta.source_digest}
    if meta.load_error is not None:
        record = WarmRecord(**base, ok=False, skipped=f"the problem does not load: {meta.load_error}")
    elif not ctx.config.profile.compile_baseline:
        record = WarmRecord(**base, ok=False, skipped="profile.compile_baseline is false: nothing to compile")
    else:
        from kforge.verifier.compile_cache import warm

        suite_cfg, prof = ctx.config.suites[suite], ctx.config.profile
        folder = (ctx.build_dir / "compile_cache" / platform / suite / problem).resolve()
        result = warm(ctx.problem_path(suite, problem), platform=platform, dest=folder, preset=suite_cfg.preset,
                      sizes=suite_cfg.sizes, build_dir=ctx.build_dir.resolve(), threads=prof.threads,
                      timeout_s=prof.timeout_s)
        record = WarmRecord(**base, **{k: v for k, v in result.items() if k in WarmRecord.model_fields})
    write_record(out, record, ctx.store)
    return record


def seed_for(warm_record: Path | None) -> Seed | None:
    """The compile-cache seed a timing job plants (None: it compiles from nothing)."""
    if warm_record is None or not Path(warm_record).is_file():
        return None
    from kforge.verifier.compile_cache import seed_from_record

    return seed_from_record(read_record(warm_record, WarmRecord).model_dump())
