"""Performance analysis for CPU candidates of the fusion compiler.

Reads the profile against the host's measured peaks (roofline position, intensity), names the
bottleneck, and proposes changes to the program's knobs (:class:`~kforge.agents.expert.plan.
knobs.CpuKnobs`, one set for every kernel) where they still have room: a compute-bound GEMM
below the roof gets larger cache blocks (``mc``, then ``kc``, up to 1024). A GEMM's fraction is
its rate against the FMA peak of the cores it was timed on (a CPU profile times on every core
but one; against the whole host's peak an AVX-512 GEMM at 71% of one core's read as 35%, and
three rounds of larger blocks changed nothing but noise).
"""

from __future__ import annotations

from kforge.agents.expert.analysis.evidence import evidence
from kforge.agents.expert.plan.knobs import CpuKnobs, ProgramKnobs
from kforge.agents.expert.plan.record import ExpertPlan
from kforge.schema import Action, AnalysisRequest, Recommendation

NEAR_ROOFLINE = 0.6
BLOCK_MAX = 1024


def recommend_cpu(request: AnalysisRequest, plan: ExpertPlan, knobs: ProgramKnobs) -> Recommendation:
    ev = evidence(request.profile)
    kind = plan.graph.pattern.kind
    cpu = knobs.program if isinstance(knobs.program, CpuKnobs) else CpuKnobs()
    if "intensity_flop_per_byte" in ev and "ridge_flop_per_byte" in ev:
        bottleneck = "compute" if ev["intensity_flop_per_byte"] > ev["ridge_flop_per_byte"] else "memory"
    else:
        bottleneck = "compute" if kind == "gemm" else "memory"
    actions: list[Action] = []
    frac = ev.get("roofline_frac", 0.0)
    if kind == "gemm" and "flop_util_threads" in ev:  # against the FMA rate of the cores it was timed on
        frac = ev["flop_util_threads"]
    nums = f"roofline fraction {frac:.2f}, {ev.get('median_ms', 0.0):.3f} ms"
    if kind == "gemm" and bottleneck == "compute" and frac < NEAR_ROOFLINE:
        for key in ("mc", "kc"):
            value = getattr(cpu, key)
            if value * 2 <= BLOCK_MAX:
                actions.append(Action(kind="tile", params={key: value * 2}, expected_gain=1.1,
                                      rationale=f"GEMM below the compute roof: larger {key} ({nums})"))
                break
    summary = (f"{bottleneck}-bound {kind} candidate at {frac:.0%} of the roofline; "
               + ("; ".join(a.rationale for a in actions) if actions else "no knob left to turn"))
    return Recommendation(bottleneck=bottleneck, evidence=ev, actions=actions[:3], summary=summary)  # type: ignore[arg-type]
