"""Stage `warm`: torch.compile of the references of a suite, compiled once per suite in a job that
shares the machine, so the timing jobs that own it (`profile` with baselines, `select`) load the
compiled baseline from its caches instead of compiling it (kforge/verifier/compile_cache.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kforge.schema import ProblemMeta
from kforge.stages.context import StageContext, read_record, write_record
from kforge.stages.records import WarmRecord, WarmSuiteRecord

if TYPE_CHECKING:
    from kforge.verifier.compile_cache import Seed


def run_warm(ctx: StageContext, *, platform: str, suite: str, problem_records: list[Path],
             out: Path) -> WarmSuiteRecord:
    """Every problem of ``problem_records`` (one suite) compiled in one worker, their caches in
    one folder (:func:`~kforge.verifier.compile_cache.warm_many`), a record each in ``out``. A
    problem that does not load, or a run that times no torch.compile, is skipped."""
    metas = {Path(r).stem: read_record(r, ProblemMeta) for r in problem_records}
    records: dict[str, WarmRecord] = {}
    todo: dict[str, Path] = {}
    for name, meta in metas.items():
        base = {"platform": platform, "problem_source": meta.source_digest}
        if meta.load_error is not None:
            records[name] = WarmRecord(**base, ok=False, skipped=f"the problem does not load: {meta.load_error}")
        elif not ctx.config.profile.compile_baseline:
            records[name] = WarmRecord(**base, ok=False, skipped="profile.compile_baseline is false: nothing to compile")
        else:
            todo[name] = ctx.problem_path(suite, name)
    if todo:
        from kforge.verifier.compile_cache import warm_many

        suite_cfg, prof = ctx.config.suites[suite], ctx.config.profile
        folder = (ctx.build_dir / "compile_cache" / platform / suite).resolve()
        results = warm_many(todo, platform=platform, dest=folder, preset=suite_cfg.preset, sizes=suite_cfg.sizes,
                            build_dir=ctx.build_dir.resolve(), threads=prof.threads,
                            timeout_s=prof.timeout_s + 30 * len(todo))
        for name, result in results.items():
            base = {"platform": platform, "problem_source": metas[name].source_digest}
            records[name] = WarmRecord(**base, **{k: v for k, v in result.items() if k in WarmRecord.model_fields})
    record = WarmSuiteRecord(platform=platform, suite=suite, problems={n: records[n] for n in metas})
    write_record(out, record, ctx.store)
    return record


def seed_for(warm_record: Path | None, problem: str) -> Seed | None:
    """The compile-cache seed a timing job of ``problem`` plants from its suite's warm record
    (None: it compiles from nothing)."""
    if warm_record is None or not Path(warm_record).is_file():
        return None
    from kforge.verifier.compile_cache import seed_from_record

    entry = read_record(warm_record, WarmSuiteRecord).problems.get(problem)
    return seed_from_record(entry.model_dump()) if entry is not None else None
