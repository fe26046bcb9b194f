"""Stage `select`: pick the best verified round, time it against eager and torch.compile, and
decide whether it ships.

The winner is re-timed in one process together with both baselines (alternated), so every
speedup in the report compares numbers taken in the same run. The ship rule: a kernel ships only
when it verified on the device, its problem's reference is deterministic, it is not faster than
the roofline allows, and it beats the faster of eager and torch.compile (the lower median) on
the paired ratio: rep i of the candidate and rep i of that baseline were timed back to back, and
the one-sided 95% lower confidence bound of the median of ``baseline_i / candidate_i``, a
binomial order statistic (``kforge.verifier.paired``), must exceed ``SHIP_FLOOR`` = 1.02.
``speedup_vs_*`` are the paired medians (ratios of the medians for a profile written before
per-rep samples were recorded; such a profile has no bound and does not ship). Every
other row says why in its status (``no_gain``, ``failed``, ``roofline_flagged``,
``nondeterministic_reference``, ``verified_interpreted``, ``compiled_only``, ``unavailable``) and
its shipped answer is the PyTorch reference: ``shipped_speedup`` 1.0. The candidate itself stays
in the store, the run folder and the tables.
"""

from __future__ import annotations

import importlib.metadata
import platform as host_platform
import sys
import time
from pathlib import Path
from typing import Any

from kforge.schema import ProblemMeta, Profile, RatioBound, Timing
from kforge.stages.context import (
    PACKAGE_DIR,
    STAGE_CODE,
    StageContext,
    code_digest,
    read_record,
    record_digest,
    write_record,
)
from kforge.stages.records import (
    AnalysisRecord,
    CandidateRecord,
    CompileRecord,
    ProfileRecord,
    SelectionRecord,
    VerifyRecord,
)

SHIP_FLOOR = 1.02  # the paired ratio's 95% lower bound must clear this: 2% is never a gain
NOT_SHIPPED = 1.0  # the shipped answer of a row that does not ship: the PyTorch reference


def ship_bound(profile: Profile) -> tuple[RatioBound | None, str]:
    """The paired ratio against the faster baseline with its bound, or None and why not (no
    baseline timed: the empty reason; too few or no per-rep samples: that reason)."""
    # imported here, not at the top: kforge.verifier's package imports torch
    from kforge.verifier.paired import faster_baseline, paired_ratio, why_no_bound

    faster = faster_baseline(profile)
    if faster is None or profile.candidate is None:
        return None, ""
    name, base = faster
    bound = paired_ratio(profile.candidate, base, name)
    return bound, "" if bound is not None else why_no_bound(profile.candidate, base)


def best_ratio(profile: Profile, bound: RatioBound | None) -> float | None:
    """``speedup_vs_best``: the paired median against the faster baseline (the bound's own
    median when there is a bound)."""
    from kforge.verifier.paired import faster_baseline

    if bound is not None:
        return bound.median
    faster = faster_baseline(profile)
    return paired_speedup(faster[1], profile.candidate) if faster and profile.candidate else None


def paired_speedup(baseline: Timing | None, candidate: Timing) -> float | None:
    """The paired median ratio; the ratio of the medians when the profile has no samples."""
    from kforge.verifier.paired import paired_median

    if baseline is None:
        return None
    median = paired_median(candidate, baseline)
    return median if median is not None else _ratio(baseline.median_ms, candidate.median_ms)


def is_nondeterministic(problem_record: Path | None) -> bool:
    """The problem stage flags a reference that disagrees with itself on the same inputs."""
    if problem_record is None or not Path(problem_record).is_file():
        return False
    meta = read_record(problem_record, ProblemMeta)
    return "nondeterministic" in meta.degenerate


def inputs_manifest(ctx: StageContext, agent: str, round_dir: Path, device: str) -> str:
    """Store what the winner was made and judged with that no stage record names by digest (the
    verifier's code, the prompt files, the agent settings, the environment), each file as a blob;
    return the digest of the manifest. Prompts are the files as of this job: the transcripts
    hold the exact messages each agent call saw."""
    from kforge.agents.prompting import PROMPTS_DIR

    store = ctx.store
    files: set[Path] = set()
    for pattern in STAGE_CODE["verify"]:
        files.update(p for p in PACKAGE_DIR.glob(pattern) if p.is_file())
    verifier = {f"kforge/{p.relative_to(PACKAGE_DIR)}": store.put_bytes(p.read_bytes()) for p in sorted(files)}
    prompts = {p.name: store.put_bytes(p.read_bytes()) for p in sorted(PROMPTS_DIR.glob("*.md"))}
    compiled = round_dir / "compile.json"
    tools = read_record(compiled, CompileRecord).tool_versions if compiled.is_file() else {}
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "absent"
    environment = {
        "python": sys.version.split()[0], "os": host_platform.platform(), "machine": host_platform.machine(),
        "torch": torch_version, "device": device, "tool_versions": tools,
    }
    manifest = {
        "verifier_code": verifier, "verifier_code_digest": code_digest("verify"), "prompts": prompts,
        "agent": store.put_json(ctx.config.agents[agent].model_dump(mode="json")),
        "environment": store.put_json(environment),
    }
    return store.put_json(manifest)


def _status_without_winner(verdicts: list[VerifyRecord], profiles: list[ProfileRecord] | None = None) -> tuple[str, str]:
    reasons = [v.verdict.reason for v in verdicts]
    last = verdicts[-1].verdict
    rejected = [p.profile for v, p in zip(verdicts, profiles or [], strict=False)
                if v.verdict.ok and p.profile is not None and not p.profile.ok
                and p.profile.reason not in ("beats_roofline", "harness_error")]
    if rejected and not any(r == "no_device" for r in reasons):  # verified, but the timing caught it
        return "failed", f"verified, but the checked timing rejected it: {rejected[-1].reason}: {rejected[-1].detail}"[:500]
    if all(r == "platform_unavailable" for r in reasons):
        return "unavailable", last.detail
    if "no_device" in reasons:
        return "compiled_only", "built here; no device to run it on"
    if any(v.verdict.ok and v.verdict.interpreted for v in verdicts):
        return "verified_interpreted", "verified under an interpreter: correctness only, not timed"
    return "failed", f"{last.reason}: {last.detail}"[:500]


def run_select(
    ctx: StageContext, *, round_dirs: list[Path], out: Path, problem_record: Path | None = None,
    warm_record: Path | None = None,
) -> SelectionRecord:
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
    nondeterministic = is_nondeterministic(problem_record)
    if not eligible or nondeterministic:
        status, detail = _status_without_winner(verdicts, profiles)
        if flagged:
            status, detail = "roofline_flagged", "every verified round beat the roofline: not trusted, not shipped"
        verified = status == "verified_interpreted"
        extra: dict[str, Any] = {}
        if nondeterministic:
            status, verified = "nondeterministic_reference", False
            detail = "the reference gives different outputs on the same inputs: no candidate can be judged, not shipped"
            if eligible:  # keep the best candidate on record (never timed, never shipped)
                i = eligible[0][1]
                extra = {"best_round": i, "best_candidate": record_digest(round_dirs[i] / "candidate.json"),
                         "best_source": verdicts[i].source}
        record = SelectionRecord(**common, **extra, status=status, detail=detail, verified=verified,
                                 interpreted=status == "verified_interpreted", wall_s=round(wall, 3))
        _progress(ctx, record)
        write_record(out, record, ctx.store)
        return record

    best = eligible[0][1]
    best_dir, best_source = round_dirs[best], verdicts[best].source
    suite_cfg, prof = ctx.config.suites[first.suite], ctx.config.profile
    key = ctx.action_key(
        "select", platform=first.platform, source=best_source, problem=verdicts[best].problem_source,
        preset=suite_cfg.preset, sizes=suite_cfg.sizes, settings=prof.model_dump(mode="json"),
    )
    hit = ctx.store.action_get(key) or profiled_with_baselines(ctx, profiles, eligible, verdicts)
    if hit is None:
        from kforge.stages.profile import host_peaks
        from kforge.stages.warm import seed_for
        from kforge.verifier.profiling import time_against_baselines

        start = time.perf_counter()
        profile = time_against_baselines(
            (best_dir / "kernel.py").read_text(), ctx.problem_path(first.suite, first.problem),
            platform=first.platform, policy=ctx.config.policy, preset=suite_cfg.preset, sizes=suite_cfg.sizes,
            build_dir=ctx.build_dir.resolve(), warmup=prof.warmup, reps=prof.reps,
            threads=prof.threads, timeout_s=prof.timeout_s, peaks=host_peaks(ctx, verdicts[best].verdict.device),
            remeasure=lambda: host_peaks(ctx, verdicts[best].verdict.device, fresh=True),
            compile_baseline=prof.compile_baseline, compile_cache=seed_for(warm_record, first.problem),
        )
        hit = {"profile": ctx.store.put_json(profile), "seconds": round(time.perf_counter() - start, 3)}
        ctx.ledger("select", platform=first.platform, problem=first.problem, source=best_source)
        ctx.store.action_put(key, hit, [hit["profile"]])
    profile = Profile.model_validate(ctx.store.get_json(hit["profile"]))
    record = _timed_record(common, profile, best, best_dir, best_source, hit, wall)
    if hit.get("from_profile"):
        record.detail += " (timed with both baselines in the round's profile job)"
    record.inputs = inputs_manifest(ctx, first.agent, best_dir, profile.device)
    _progress(ctx, record)
    write_record(out, record, ctx.store)
    return record


def profiled_with_baselines(ctx: StageContext, profiles: list[ProfileRecord], eligible: list[tuple[float, int]],
                            verdicts: list[VerifyRecord]) -> dict[str, Any] | None:
    """The best round's own profile as the selection timing, when it already is one: taken with
    both baselines under this run's policy (``kforge.stages.profile.with_baselines``) and the
    only timed source, so no pick among noisy timings happened that a re-timing would have to
    undo. None: select times the winner itself."""
    from kforge.stages.profile import with_baselines

    best = eligible[0][1]
    profile = profiles[best].profile
    sources = {verdicts[i].source for _, i in eligible}
    if not with_baselines(ctx.config) or len(sources) != 1 or profile is None or profile.eager is None:
        return None
    if ctx.config.profile.compile_baseline and profile.compiled is None and not profile.extra.get("compile_error"):
        return None
    return {"profile": ctx.store.put_json(profile.model_dump(mode="json")), "seconds": 0.0, "from_profile": True}


def _progress(ctx: StageContext, record: SelectionRecord) -> None:
    """One line per finished cell, in the job log and appended to ``<store>/progress.log``
    (``tail -f artifacts/progress.log``; ``kforge report`` shows the cells so far)."""
    ratio = f" {record.speedup_vs_best:.2f}x vs the faster baseline" if record.speedup_vs_best else ""
    if record.speedup_low is not None:
        ratio += f" (95% low {record.speedup_low:.2f}x)"
    line = (f"{time.strftime('%H:%M:%S')} select {record.agent}/{record.platform}/{record.suite}/{record.problem}: "
            f"{record.status}{ratio}")
    print(line, file=sys.stderr, flush=True)
    with open(ctx.root / "progress.log", "a", encoding="utf-8") as handle:  # one short write: atomic in O_APPEND
        handle.write(line + "\n")


def _ratio(base: float | None, cand: float) -> float | None:
    return round(base / cand, 4) if base and cand > 0 else None


def ship_status(bound: RatioBound | None, flagged: bool, *, no_bound: str = "") -> tuple[str, str]:
    """The ship rule on a verified, timed candidate: ``shipped`` or why not. ``bound`` is the
    paired ratio against the faster baseline; without one, ``no_bound`` says why (empty: no
    baseline was timed at all)."""
    if flagged:
        return "roofline_flagged", "faster than the roofline allows: not trusted, not shipped"
    if bound is None and not no_bound:
        return "failed", "no baseline was timed: nothing to compare against, not shipped"
    if bound is None:
        return "no_gain", f"no confidence bound on the speedup: {no_bound}; not shipped, the PyTorch reference is the answer"
    what = (f"{bound.median:.2f}x the faster baseline ({bound.baseline}; paired median of {bound.n} reps, "
            f"{bound.confidence:.0%} lower bound {bound.low:.2f}x, upper {bound.high:.2f}x)")
    if bound.low > SHIP_FLOOR:
        return "shipped", f"{what}: the lower bound clears {SHIP_FLOOR:.2f}x"
    return "no_gain", f"{what}: the lower bound does not clear {SHIP_FLOOR:.2f}x, the PyTorch reference is the answer"


def _timed_record(common: dict, profile, best: int, best_dir: Path, best_source, hit: dict, wall: float) -> SelectionRecord:  # type: ignore[no-untyped-def,type-arg]
    if not profile.ok or profile.candidate is None:
        return SelectionRecord(
            **common, status="failed", detail=f"timing against baselines failed: {profile.reason} {profile.detail}"[:500],
            best_round=best, verified=True, wall_s=round(wall + hit["seconds"], 3), selection_profile=hit["profile"],
        )
    cand = profile.candidate.median_ms
    eager = profile.eager.median_ms if profile.eager else None
    compiled = profile.compiled.median_ms if profile.compiled else None
    bound, no_bound = ship_bound(profile)
    ratio = best_ratio(profile, bound)
    flagged = bool(profile.extra.get("beats_roofline"))
    status, detail = ship_status(bound, flagged, no_bound=no_bound)
    if profile.extra.get("compile_skipped"):
        detail += " (torch.compile not timed: profile.compile_baseline is false)"
    elif profile.extra.get("compile_error"):
        detail += f" (torch.compile failed: {str(profile.extra['compile_error'])[:120]})"
    return SelectionRecord(
        **common,
        status=status,
        detail=detail,
        verified=not flagged,
        shipped=status == "shipped",
        shipped_speedup=ratio if status == "shipped" and ratio else NOT_SHIPPED,
        speedup_low=bound.low if bound else None,
        speedup_high=bound.high if bound else None,
        ship_floor=SHIP_FLOOR,
        eager_cv=round(profile.eager.cv, 4) if profile.eager else None,
        compile_cv=round(profile.compiled.cv, 4) if profile.compiled else None,
        best_round=best,
        best_candidate=record_digest(best_dir / "candidate.json"),
        best_source=best_source,
        candidate_ms=round(cand, 6),
        eager_ms=round(eager, 6) if eager else None,
        compile_ms=round(compiled, 6) if compiled else None,
        candidate_cv=round(profile.candidate.cv, 4),
        speedup_vs_eager=paired_speedup(profile.eager, profile.candidate),
        speedup_vs_compile=paired_speedup(profile.compiled, profile.candidate),
        speedup_vs_best=ratio,
        device=profile.device,
        wall_s=round(wall + hit["seconds"], 3),
        selection_profile=hit["profile"],
    )
