"""Profile-driven rules for CPU candidates: classify the bottleneck, rank concrete actions.

Evidence comes from the :class:`~kforge.schema.Profile` (median, CV, achieved vs measured peak
GB/s and GFLOP/s, roofline floor, ``kforge::*`` kernel table) and from the plan the candidate
was generated with; every action names plan knobs that :mod:`plans` understands.
"""

from __future__ import annotations

from typing import Any

from kforge.agents.expert.graph import KernelGraph
from kforge.agents.expert.plans import CpuPlan
from kforge.schema import Action, Profile, Recommendation

LATENCY_MS = 0.02  # below this, thread start-up and call overhead dominate
ROW_CACHE_BYTES = 256 * 1024  # a row larger than this does not stay in L2 between passes


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


def classify(graph: KernelGraph, profile: Profile, ev: dict[str, float]) -> str:
    if ev.get("median_ms", 1.0) < LATENCY_MS:
        return "latency"
    if "intensity_flop_per_byte" in ev and "ridge_flop_per_byte" in ev:
        return "compute" if ev["intensity_flop_per_byte"] > ev["ridge_flop_per_byte"] else "memory"
    return "compute" if graph.kind == "gemm" else "memory"


def _fmt(ev: dict[str, float], *keys: str) -> str:
    return ", ".join(f"{k}={ev[k]:.3g}" for k in keys if k in ev)


def recommend_cpu(graph: KernelGraph, plan: CpuPlan, profile: Profile) -> Recommendation:
    ev = evidence(profile)
    bottleneck = classify(graph, profile, ev)
    actions: list[Action] = []
    nums = _fmt(ev, "median_ms", "bw_util", "flop_util", "roofline_frac", "kforge_kernels")

    def add(kind: str, params: dict[str, Any], gain: float, why: str) -> None:
        actions.append(Action(kind=kind, params=params, expected_gain=gain, rationale=f"{why} ({nums})"))

    chain = graph.chain()
    transcendental = any(op.op in ("exp", "log", "tanh", "sigmoid", "gelu", "gelu_tanh", "silu", "pow")
                         for op in chain) or graph.kind == "row_reduction"
    if bottleneck == "latency":
        if plan.threads:
            add("parallelize", {"threads": False}, 1.3,
                "the whole call is shorter than OpenMP fork/join costs; run it on one thread")
    elif not plan.threads:
        add("parallelize", {"threads": True}, 1.8, f"{bottleneck}-bound work on one core; spread rows/tiles over all cores")
    if not plan.simd:
        add("vectorize", {"simd": True}, 4.0 if transcendental else 2.0,
            "scalar loops and libm calls: use omp simd loops and the vectorisable kf_* math (8 fp32 lanes)")
    if chain and not plan.fuse_epilogue:
        add("fuse", {"epilogue": True}, 1.0 + 0.5 * len(chain),
            f"the {len(chain)}-op epilogue runs as a second kernel: one extra read+write of the output")
    if graph.kind == "gemm":
        _gemm_actions(plan, bottleneck, ev, add)
    elif graph.kind == "row_reduction":
        _row_actions(graph, plan, bottleneck, add)
    actions.sort(key=lambda a: -a.expected_gain)
    if actions:
        summary = f"{bottleneck}-bound; {len(actions)} action(s), best: {actions[0].kind} {actions[0].params}"
    else:
        summary = f"{bottleneck}-bound; the plan already uses every applicable optimisation ({nums})"
    return Recommendation(bottleneck=bottleneck, evidence=ev, actions=actions, summary=summary)


def _gemm_actions(plan: CpuPlan, bottleneck: str, ev: dict[str, float], add: Any) -> None:
    if plan.gemm_kernel != "avx2":
        add("tile", {"gemm_kernel": "avx2", "mr": 6, "nr": 16, "kc": 256, "mc": 96, "nc": 1024}, 4.0,
            "the GEMM re-reads operands from memory: pack B into NR=16 panels and A into MR=6 panels, "
            "run a 6x16 FMA register-blocked micro-kernel")
        return
    if bottleneck == "compute" and ev.get("flop_util", 1.0) < 0.5 and plan.kc < 384:
        add("block_size", {"kc": 384, "mc": 72}, 1.1,
            "micro-kernel below half of peak FLOP/s: deeper K blocks amortise the C-tile loads/stores")


def _row_actions(graph: KernelGraph, plan: CpuPlan, bottleneck: str, add: Any) -> None:
    pat = graph.pattern
    op = getattr(pat, "op", "")
    cols = getattr(pat, "cols", 0)
    if plan.simd and plan.unroll < 4:
        add("unroll", {"unroll": 4}, 1.3,
            "one accumulator vector per reduction is bound by FP add latency; keep 4 independent ones")
    if plan.simd and op == "layernorm" and plan.passes == 3:
        add("fuse", {"passes": 2}, 1.2, "mean and variance in one read of the row (shifted sums)")
    if plan.simd and op in ("softmax", "log_softmax") and plan.passes == 3 and bottleneck == "memory" \
            and cols * 4 > ROW_CACHE_BYTES:
        add("fuse", {"passes": 2}, 1.3, "rows overflow L2: online max+sum reads each row once less")
