"""Stage `problem`: load and validate one KernelBench-format problem; record its metadata.

A file that does not load (it raises at import, is not valid Python, ``get_inputs`` raises, ...)
is recorded with ``load_error``, its reason on one line: the stages after it read that
(:func:`load_error`) and ask no agent, verify nothing and time nothing; the row's detail is
``problem_error: <why>`` (``kforge.verifier.reasons.Reason.PROBLEM_ERROR``)."""

from __future__ import annotations

from pathlib import Path

from kforge.schema import ProblemMeta
from kforge.stages.context import StageContext, read_record, write_record
from kforge.store import sha256_bytes

PROBLEM_ERROR = "problem_error"  # kforge.verifier.reasons.Reason.PROBLEM_ERROR, without importing the verifier


def run_problem(ctx: StageContext, suite: str, problem: str, out: Path) -> ProblemMeta:
    path = ctx.problem_path(suite, problem)
    settings = ctx.config.suites[suite]
    source = path.read_bytes()
    key = ctx.action_key(
        "problem", source=sha256_bytes(source), preset=settings.preset, sizes=settings.sizes, suite=suite, name=problem
    )
    meta = ctx.cached(key, ProblemMeta)
    if meta is None:
        from kforge.problems import ProblemError, load_problem, problem_meta

        try:
            loaded = load_problem(path, suite=suite, preset=settings.preset, sizes=settings.sizes)
            # Costs at the run's sizes (counted on the meta device); degeneracy is a property of
            # the maths, checked by running the reference, so at the small ci sizes.
            small = settings.preset == "ci"
            meta = problem_meta(loaded, check_degenerate=small)
            if not small:
                meta.degenerate = problem_meta(load_problem(path, suite=suite, preset="ci")).degenerate
        except ProblemError as err:
            meta = ProblemMeta(
                name=problem, suite=suite, path=str(path), source_digest=sha256_bytes(source),
                preset=settings.preset, error=str(err), load_error=err.brief,
            )
        ctx.store.put_bytes(source)
        ctx.ledger("problem", suite=suite, problem=problem)
        ctx.remember(key, meta, [meta.source_digest])
    write_record(out, meta, ctx.store)
    return meta


def load_error(problem_record: Path | None) -> str | None:
    """Why the problem behind ``problem_record`` does not load (one line), or None when it
    loads or there is no record to read."""
    if problem_record is None or not Path(problem_record).is_file():
        return None
    return read_record(problem_record, ProblemMeta).load_error


def problem_error_detail(why: str) -> str:
    """A verdict's detail for a problem that does not load."""
    return f"{why} (fix the problem file, then rerun; no agent was asked)"
