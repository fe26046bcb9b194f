"""``python -m kforge.stages <stage> --config RESOLVED.json [options]``: what each rule runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kforge.stages.context import StageContext


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kforge.stages")
    p.add_argument("stage", choices=[
        "problem", "example", "peaks", "warm", "generate", "compile", "verify", "profile", "analyze", "refine", "select",
        "tables", "report",
    ])
    p.add_argument("--config", required=True, type=Path)
    for name in ("agent", "platform", "suite", "problem"):
        p.add_argument(f"--{name}")
    p.add_argument("--round", type=int, default=0)
    for name in ("out", "out-dir", "kernel", "candidate", "compile-record", "verify-record", "profile-record",
                 "problem-record", "example-record", "prev-dir", "transfer-record", "warm-record"):
        p.add_argument(f"--{name}", type=Path)
    p.add_argument("--inputs", nargs="*", type=Path, default=[])
    return p


# Stages that only read records: every other one holds a share of the host's lease for its whole
# life (kforge/verifier/device_lease.py), so no timing on this host runs beside its work.
READS_ONLY = frozenset({"tables", "report", "example"})


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    if a.stage in READS_ONLY:
        return run_stage(a)
    from kforge.verifier.device_lease import held

    with held(gpu=False):
        return run_stage(a)


def run_stage(a: argparse.Namespace) -> int:
    ctx = StageContext.from_file(a.config)
    if a.stage == "problem":
        from kforge.stages.problem import run_problem

        run_problem(ctx, a.suite, a.problem, a.out)
    elif a.stage == "example":
        from kforge.stages.example import run_example

        run_example(ctx, a.platform, a.out)
    elif a.stage == "peaks":
        from kforge.platforms import get_platform
        from kforge.stages.context import write_record
        from kforge.stages.profile import host_peaks

        write_record(a.out, host_peaks(ctx, get_platform(a.platform).device()), ctx.store)
    elif a.stage == "warm":
        from kforge.stages.warm import run_warm

        run_warm(ctx, platform=a.platform, suite=a.suite, problem_records=a.inputs, out=a.out)
    elif a.stage == "generate":
        from kforge.stages.generate import run_generate

        run_generate(ctx, agent=a.agent, platform=a.platform, suite=a.suite, problem=a.problem,
                     problem_record=a.problem_record, example_record=a.example_record, out_dir=a.out_dir,
                     transfer_record=a.transfer_record)
    elif a.stage == "refine":
        from kforge.stages.refine import run_refine

        run_refine(ctx, round=a.round, prev_dir=a.prev_dir, problem_record=a.problem_record,
                   example_record=a.example_record, out_dir=a.out_dir)
    elif a.stage == "compile":
        from kforge.stages.compile import run_compile

        run_compile(ctx, platform=a.platform, kernel=a.kernel, out=a.out)
    elif a.stage == "verify":
        from kforge.stages.verify import run_verify

        run_verify(ctx, platform=a.platform, suite=a.suite, problem=a.problem, kernel=a.kernel,
                   compile_record=a.compile_record, out=a.out, problem_record=a.problem_record)
    elif a.stage == "profile":
        from kforge.stages.profile import run_profile

        run_profile(ctx, platform=a.platform, suite=a.suite, problem=a.problem, kernel=a.kernel,
                    verify_record=a.verify_record, out=a.out, warm_record=a.warm_record)
    elif a.stage == "analyze":
        from kforge.stages.analyze import run_analyze

        run_analyze(ctx, candidate=a.candidate, kernel=a.kernel, profile_record=a.profile_record, out=a.out)
    elif a.stage == "select":
        from kforge.stages.select import run_select

        run_select(ctx, round_dirs=a.inputs, out=a.out, problem_record=a.problem_record, warm_record=a.warm_record)
    elif a.stage == "tables":
        from kforge.stages.report import run_tables

        run_tables(ctx, records=a.inputs, out_dir=a.out_dir)
    elif a.stage == "report":
        from kforge.stages.report import run_report

        run_report(ctx, selections=a.inputs, out=a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
