"""``kforge verify`` and ``kforge bench``: the verifier on a user's own file.

    kforge verify CANDIDATE.py --problem P [--platform cpu] [--policy strict] [--preset ci]
    kforge bench  CANDIDATE.py --problem P [--platform cpu] [--policy strict] [--preset ci] [--json]

Both build the candidate with the platform's build first (as the pipeline's compile stage
does). ``verify`` then verifies it. ``bench`` is the pipeline's ``select`` on one file: it
verifies, times the candidate, eager and torch.compile alternately in one sandboxed process
through the checked timing path (``profiling.time_against_baselines``: sampled outputs compared
with the reference, on the CPU the parent's clock) and judges the result with the select
stage's own ship rule.

Exit codes: 0 verified (bench: verified and timed, whether or not it beats the baselines),
1 rejected by the verifier or the timing checks (reason code printed) or build failed
(compiler log printed), 2 bad usage, 3-9 the user mistakes of ``preflight.py`` (one line
each, never a traceback; 9: the problem file does not load).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kforge.schema import Profile, Timing
from kforge.verifier.preflight import UserError, prepare


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("candidate", type=Path)
    parser.add_argument("--problem", type=Path, required=True)
    parser.add_argument("--platform", default="cpu")
    parser.add_argument("--policy", choices=["strict", "relaxed"], default="strict")
    parser.add_argument("--preset", default="ci")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--compare", choices=["auto", "host", "device"], default="auto",
                        help="where outputs are compared: auto = on the GPU for CUDA candidates (CUDA IPC "
                             "to a trusted judge), as bytes in this process otherwise")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--build-dir", type=Path, default=None,
                        help="where built kernels go (default $KFORGE_BUILD_DIR or ~/.cache/kforge/<platform>)")
    return parser


def report_user_error(prog: str, err: UserError) -> int:
    if err.log:
        print(err.log.rstrip(), file=sys.stderr)
    print(f"{prog}: {err.message}", file=sys.stderr)
    return err.code


def main(argv: list[str] | None = None) -> int:
    from kforge.verifier.verify import verify_candidate

    parser = _parser("kforge verify", "Build, then verify a candidate kernel module.")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    try:
        source, build_dir = prepare(args.candidate, args.problem, args.platform, args.build_dir)
    except UserError as err:
        return report_user_error("kforge verify", err)
    verdict = verify_candidate(source, args.problem, platform=args.platform,
                               policy=args.policy, preset=args.preset, trials=args.trials,
                               timeout_s=args.timeout, build_dir=build_dir, compare=args.compare)
    status = "VERIFIED" if verdict.ok else "REJECTED"
    print(f"{status} reason={verdict.reason} policy={verdict.policy} atol={verdict.atol:g} "
          f"rtol={verdict.rtol:g} trials={verdict.trials} sandbox={verdict.sandbox}")
    if verdict.max_abs_err is not None:
        margin = "-" if verdict.max_margin is None else f"{verdict.max_margin:.3g}"
        print(f"max_abs_err={verdict.max_abs_err:.3g} rel_err_norm={verdict.rel_err_norm:.3g} "
              f"max_margin={margin} (worst error / allowed error over {len(verdict.margins)} cases; "
              f"verified at {verdict.preset or '?'} sizes)")
    if verdict.detail:
        print(verdict.detail)
    return 0 if verdict.ok else 1


def _peaks(device: str, policy: str, fresh: bool = False) -> Any:
    """The host's peaks (measured once, cached beside the reference cache); ``fresh`` measures
    them now, uncached: the second look ``roofline`` takes before it flags a candidate, since
    peaks measured on a busy host make the floor too high."""
    import tempfile

    from kforge.verifier.peaks import measure_peaks, policy_matmul_gflops
    from kforge.verifier.verify import reference_cache_dir

    if fresh:
        with tempfile.TemporaryDirectory() as scratch:
            peaks = measure_peaks(device, Path(scratch))
    else:
        peaks = measure_peaks(device, reference_cache_dir().parent / "host")
    return peaks.model_copy(update={"matmul_gflops": policy_matmul_gflops(peaks, policy)})


def summary(profile: Profile) -> dict[str, Any]:
    """Milliseconds, CVs, speedups and the ship verdict, computed as ``select`` computes them: the
    paired median ratios and the 95% lower bound against the faster baseline (``paired.py``);
    the detail line prints the bound."""
    from kforge.stages.select import SHIP_FLOOR, best_ratio, paired_speedup, ship_bound, ship_status

    def timing(t: Timing | None) -> dict[str, float] | None:
        return None if t is None else {"median_ms": round(t.median_ms, 6), "cv": round(t.cv, 4)}

    cand = profile.candidate
    assert cand is not None
    bound, no_bound = ship_bound(profile)
    ratio = best_ratio(profile, bound)
    status, detail = ship_status(bound, bool(profile.extra.get("beats_roofline")), no_bound=no_bound)
    if profile.extra.get("compile_skipped"):
        detail += " (torch.compile not timed: --eager-only)"
    return {
        "status": status, "detail": detail, "device": profile.device,
        "candidate": timing(cand), "eager": timing(profile.eager), "compiled": timing(profile.compiled),
        "speedup_vs_eager": paired_speedup(profile.eager, cand),
        "speedup_vs_compile": paired_speedup(profile.compiled, cand),
        "speedup_vs_best": ratio, "speedup_low": bound.low if bound else None,
        "speedup_high": bound.high if bound else None, "ship_floor": SHIP_FLOOR,
        "clock": profile.extra.get("clock", "in-process"), "checked": profile.extra.get("checked"),
        "compile_baseline": not profile.extra.get("compile_skipped"),
    }


def bench_main(argv: list[str] | None = None) -> int:
    """``kforge bench``: build, verify, then time through the checked path (module docstring)."""
    from kforge.config import ProfileConfig
    from kforge.verifier.profiling import time_against_baselines
    from kforge.verifier.verify import verify_candidate

    parser = _parser("kforge bench", "Verify a candidate, then time it against eager and torch.compile.")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    defaults = ProfileConfig()  # the pipeline's own: bench times as select does
    parser.add_argument("--reps", type=int, default=defaults.reps)
    parser.add_argument("--warmup", type=int, default=defaults.warmup)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--eager-only", action="store_true",
                        help="time eager alone, not torch.compile (its build costs ~20 s on two cores)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    try:
        source, build_dir = prepare(args.candidate, args.problem, args.platform, args.build_dir)
    except UserError as err:
        return report_user_error("kforge bench", err)
    verdict = verify_candidate(source, args.problem, platform=args.platform, policy=args.policy,
                               preset=args.preset, trials=args.trials, timeout_s=args.timeout,
                               build_dir=build_dir, compare=args.compare)
    out: dict[str, Any] = {"verified": verdict.ok, "reason": verdict.reason, "policy": args.policy,
                           "preset": args.preset, "platform": args.platform}
    if verdict.ok:
        profile = time_against_baselines(
            source, args.problem, platform=args.platform, policy=args.policy, preset=args.preset,
            build_dir=build_dir, warmup=args.warmup, reps=args.reps, threads=args.threads,
            timeout_s=max(args.timeout, 300), peaks=_peaks(verdict.device, args.policy),
            remeasure=lambda: _peaks(verdict.device, args.policy, fresh=True), compile_baseline=not args.eager_only)
        if profile.ok and profile.candidate is not None:
            out.update(summary(profile))
        else:
            out.update(reason=profile.reason, detail=profile.detail)
    else:
        out["detail"] = verdict.detail
    ok = out["reason"] == "ok"
    if args.json:
        print(json.dumps(out))
        return 0 if ok else 1
    if not ok:
        print(f"REJECTED reason={out['reason']} policy={args.policy}\n{out.get('detail', '')}".rstrip())
        return 1
    print(f"{'':10}{'median ms':>12}{'cv':>8}")
    for name in ("candidate", "eager", "compiled"):
        t = out.get(name)
        if t:
            print(f"{name:10}{t['median_ms']:12.4f}{t['cv']:8.3f}")
    for key in ("speedup_vs_eager", "speedup_vs_compile", "speedup_vs_best"):
        if out.get(key) is not None:
            print(f"{key}: {out[key]:.3f}x")
    print(f"{out['status']}: {out['detail']} [clock: {out['clock']}; outputs {out['checked']}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
