"""Stage `profile`: time and profile a verified candidate (the analysis agent's evidence).

Per-round profiles time the candidate alone; the `select` stage re-times the best round
against eager and torch.compile in one process, which is what the report's speedups use.
A run without optimization rounds (``rounds.optimization: 0``) has no choice to make among
timed rounds: its profiles time the candidate with both baselines, alternated in one process
(the same call select would make), and select takes that profile instead of timing it all
again (on the H100 the second timing job was ~27 s of GPU time a problem).
"""

from __future__ import annotations

from pathlib import Path

from kforge.config import Config
from kforge.stages.context import StageContext, read_record, write_record
from kforge.stages.records import ProfileRecord, VerifyRecord


def host_peaks(ctx: StageContext, device: str, *, fresh: bool = False):  # type: ignore[no-untyped-def]
    """Device peaks (copy bandwidth, matmul rate), measured once per host and cached; the
    matmul ceiling is the fastest precision the run's policy allows. ``fresh``: measured now,
    not read from the host's cache (the roofline's second look before it flags)."""
    import tempfile

    from kforge.verifier import measure_peaks
    from kforge.verifier.peaks import policy_matmul_gflops

    if fresh:
        with tempfile.TemporaryDirectory(prefix="kforge-peaks-") as folder:
            peaks = measure_peaks(device, Path(folder))
    else:
        peaks = measure_peaks(device, ctx.root / "host")
    return peaks.model_copy(update={"matmul_gflops": policy_matmul_gflops(peaks, ctx.config.policy)})


def with_baselines(config: Config) -> bool:
    """Whether this run's profiles time eager and torch.compile beside the candidate (see the
    module docstring): only when no optimization round will choose among timed rounds. Such a
    profile times with the device to itself (the lease, kforge/verifier/device_lease.py) and on
    the CPU owns the machine, as select does (rules/profile.smk)."""
    return config.rounds.optimization == 0


def run_profile(
    ctx: StageContext, *, platform: str, suite: str, problem: str, kernel: Path, verify_record: Path, out: Path,
    warm_record: Path | None = None,
) -> ProfileRecord:
    verified = read_record(verify_record, VerifyRecord)
    base = {"platform": platform, "problem_source": verified.problem_source, "source": verified.source}
    if not verified.verdict.ok:
        record = ProfileRecord(**base, skipped=f"not verified ({verified.verdict.reason})")
    elif verified.verdict.interpreted:
        record = ProfileRecord(**base, skipped="interpreted run: correctness only, never timed")
    else:
        suite_cfg, prof = ctx.config.suites[suite], ctx.config.profile
        baselines = with_baselines(ctx.config)
        key = ctx.action_key(
            "profile", **base, preset=suite_cfg.preset, sizes=suite_cfg.sizes,
            settings=prof.model_dump(mode="json"), device=verified.verdict.device,
            **({"baselines": ctx.config.policy} if baselines else {}),
        )
        cached = ctx.cached(key, ProfileRecord)
        if cached is not None:
            write_record(out, cached, ctx.store)
            return cached
        from kforge.stages.warm import seed_for
        from kforge.verifier import profile_candidate

        profile = profile_candidate(
            kernel.read_text(), ctx.problem_path(suite, problem), platform=platform,
            preset=suite_cfg.preset, sizes=suite_cfg.sizes, build_dir=ctx.build_dir.resolve(),
            baselines=baselines, warmup=prof.warmup, reps=prof.reps, threads=prof.threads,
            timeout_s=prof.timeout_s, peaks=host_peaks(ctx, verified.verdict.device),
            remeasure=lambda: host_peaks(ctx, verified.verdict.device, fresh=True),
            **({"policy": ctx.config.policy, "compile_baseline": prof.compile_baseline,
                "compile_cache": seed_for(warm_record, problem)} if baselines else {}),
        )
        if prof.ncu and profile.ok and profile.device == "cuda":
            from kforge.verifier.ncu import ncu_metrics

            profile.extra.update(ncu_metrics(
                kernel.read_text(), ctx.problem_path(suite, problem), platform=platform,
                preset=suite_cfg.preset, sizes=suite_cfg.sizes, build_dir=ctx.build_dir.resolve(),
            ))
        ctx.ledger("profile", platform=platform, problem=problem, source=verified.source)
        record = ProfileRecord(**base, profile=profile)
        ctx.remember(key, record, [])
    write_record(out, record, ctx.store)
    return record
