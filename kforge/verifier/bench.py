"""``kforge bench CANDIDATE.py --problem P [--platform cpu] [--policy strict] [--preset ci] [--json]``.

The pipeline's ``select`` on one file: build (``preflight.py``), verify, then time the
candidate, eager and torch.compile alternately in one sandboxed process through the checked
timing path (``profiling.time_against_baselines``: sampled outputs compared with the reference,
on the CPU the parent's clock), and judge the result with the select stage's own ship rule.

Exit codes: 0 timed (whether or not it beats the baselines), 1 rejected by the verifier or the
timing checks (reason code printed) or build failed, 2 bad usage, 3-8 as ``kforge verify``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from kforge.schema import Profile, Timing
from kforge.verifier.preflight import UserError, prepare


def _peaks(device: str, policy: str) -> Any:
    from kforge.verifier.peaks import measure_peaks, policy_matmul_gflops
    from kforge.verifier.verify import reference_cache_dir

    peaks = measure_peaks(device, reference_cache_dir().parent / "host")
    return peaks.model_copy(update={"matmul_gflops": policy_matmul_gflops(peaks, policy)})


def summary(profile: Profile) -> dict[str, Any]:
    """Milliseconds, CVs, speedups and the ship verdict, computed as ``select`` computes them."""
    from kforge.stages.select import _ratio, ship_status, ship_threshold

    def timing(t: Timing | None) -> dict[str, float] | None:
        return None if t is None else {"median_ms": round(t.median_ms, 6), "cv": round(t.cv, 4)}

    cand = profile.candidate
    assert cand is not None
    timed = [t for t in (profile.eager, profile.compiled) if t and t.median_ms]
    faster = min(timed, key=lambda t: t.median_ms) if timed else None
    ratio = _ratio(faster.median_ms, cand.median_ms) if faster else None
    threshold = ship_threshold(cand.cv, faster.cv) if faster else None
    status, detail = ship_status(ratio, threshold, bool(profile.extra.get("beats_roofline")))
    return {
        "status": status, "detail": detail, "device": profile.device,
        "candidate": timing(cand), "eager": timing(profile.eager), "compiled": timing(profile.compiled),
        "speedup_vs_eager": _ratio(profile.eager.median_ms, cand.median_ms) if profile.eager else None,
        "speedup_vs_compile": _ratio(profile.compiled.median_ms, cand.median_ms) if profile.compiled else None,
        "speedup_vs_best": ratio, "ship_threshold": threshold,
        "clock": profile.extra.get("clock", "in-process"), "checked": profile.extra.get("checked"),
    }


def main(argv: list[str] | None = None) -> int:
    from kforge.verifier.cli import _parser, report_user_error
    from kforge.verifier.profiling import time_against_baselines
    from kforge.verifier.verify import verify_candidate

    parser = _parser("kforge bench", "Verify a candidate, then time it against eager and torch.compile.")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
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
                               build_dir=build_dir)
    out: dict[str, Any] = {"verified": verdict.ok, "reason": verdict.reason, "policy": args.policy,
                           "preset": args.preset, "platform": args.platform}
    if verdict.ok:
        profile = time_against_baselines(
            source, args.problem, platform=args.platform, policy=args.policy, preset=args.preset,
            build_dir=build_dir, warmup=args.warmup, reps=args.reps, threads=args.threads,
            timeout_s=max(args.timeout, 300), peaks=_peaks(verdict.device, args.policy),
            remeasure=None)
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
