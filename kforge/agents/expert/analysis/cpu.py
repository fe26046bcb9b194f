"""Performance analysis for CPU candidates of the fusion compiler (``compiler: fusion-v2``).

Reads the profile against the host's measured peaks (roofline position, intensity), names
the bottleneck, and proposes knob changes for the dominant kernel only where its knobs still
have room (threads, vectorisation, GEMM blocking). Every action's ``params`` are knob names
of :mod:`.cpu_render`, applied by :func:`.compiler.round_knobs` in the next round.
"""

from __future__ import annotations

from typing import Any

from kforge.schema import Action, AnalysisRequest, Profile, Recommendation

NEAR_ROOFLINE = 0.6


def evidence(profile: Profile) -> dict[str, float]:
    ev: dict[str, float] = {}
    if profile.candidate is not None:
        ev["median_ms"] = profile.candidate.median_ms
        ev["cv"] = profile.candidate.cv
    if profile.eager is not None:
        ev["eager_ms"] = profile.eager.median_ms
    if profile.peak_gbps > 0:
        ev["bw_util"] = profile.achieved_gbps / profile.peak_gbps
    if profile.peak_gflops > 0:
        ev["flop_util"] = profile.achieved_gflops / profile.peak_gflops
    if profile.roofline_ms > 0 and profile.candidate is not None and profile.candidate.median_ms > 0:
        ev["roofline_frac"] = profile.roofline_ms / profile.candidate.median_ms
    ours = [k for k in profile.kernels if k.name.startswith("kforge::")]
    ev["kforge_kernels"] = float(len(ours))
    if profile.flops > 0 and profile.min_bytes > 0:
        ev["intensity_flop_per_byte"] = profile.flops / profile.min_bytes
    if profile.peak_gflops > 0 and profile.peak_gbps > 0:
        ev["ridge_flop_per_byte"] = profile.peak_gflops / profile.peak_gbps
    return ev


def recommend_compiled_cpu(request: AnalysisRequest) -> Recommendation:
    profile = request.profile
    ev = evidence(profile)
    plan = request.plan
    kind = (plan.get("graph") or {}).get("pattern", {}).get("kind", "elementwise")
    knobs: dict[str, Any] = (plan.get("knobs") or {}).get(plan.get("dominant") or "", {})
    if "intensity_flop_per_byte" in ev and "ridge_flop_per_byte" in ev:
        bottleneck = "compute" if ev["intensity_flop_per_byte"] > ev["ridge_flop_per_byte"] else "memory"
    else:
        bottleneck = "compute" if kind == "gemm" else "memory"
    actions: list[Action] = []
    frac = ev.get("roofline_frac", 0.0)
    nums = f"roofline fraction {frac:.2f}, {ev.get('median_ms', 0.0):.3f} ms"
    if knobs.get("threads") is False:
        actions.append(Action(kind="parallelize", params={"threads": True}, expected_gain=1.8,
                              rationale=f"single-threaded kernel ({nums})"))
    if knobs.get("simd") is False:
        actions.append(Action(kind="vectorize", params={"simd": True}, expected_gain=1.5,
                              rationale=f"scalar inner loops ({nums})"))
    if kind == "gemm" and bottleneck == "compute" and frac < NEAR_ROOFLINE:
        for key, bigger in (("MC", 2), ("KC", 2)):
            if isinstance(knobs.get(key), int) and knobs[key] * bigger <= 1024:
                actions.append(Action(kind="tile", params={key: knobs[key] * bigger}, expected_gain=1.1,
                                      rationale=f"GEMM below the compute roof: larger {key} ({nums})"))
                break
    summary = (f"{bottleneck}-bound {kind} candidate at {frac:.0%} of the roofline; "
               + ("; ".join(a.rationale for a in actions) if actions else "no knob left to turn"))
    return Recommendation(bottleneck=bottleneck, evidence=ev, actions=actions[:3], summary=summary)  # type: ignore[arg-type]
