"""The expert's performance analysis for Triton candidates: profile -> next knob change.

Reads the GPU :class:`~kforge.schema.Profile` (candidate median time, the problem's FLOPs and
minimum bytes, kernel table, ncu metrics in ``profile.extra`` when present), places the
candidate against the device ceilings for the precision step its dominant kernel uses, and
proposes at most three :class:`~kforge.schema.Action` s, best first. Every action's ``params``
are knob names of the dominant kernel's record or the program's (``plan/knobs.py``), applied
by ``plan/rounds.py`` in the next round. Precision changes never leave the policy.

Device ceilings are the H200's measured numbers (the precision table's peaks, below the copy
bandwidth) unless ``profile.peak_gflops`` / ``profile.peak_gbps`` carry the profiler's own.
"""

from __future__ import annotations

import math
from typing import Any

from kforge.agents.expert.codegen.triton.tiles import fit_registers, fit_shared_memory
from kforge.agents.expert.errors import PlanError
from kforge.agents.expert.plan.knobs import (
    ProgramKnobs,
    TritonGemm,
    TritonPointwise,
    TritonProgram,
    TritonRow,
    TritonScan,
)
from kforge.agents.expert.plan.precision import STEPS
from kforge.agents.expert.plan.record import ExpertPlan
from kforge.schema import (
    GRAPH_LAUNCH_ROW,
    Action,
    AnalysisRequest,
    KernelStat,
    Profile,
    Recommendation,
)

PEAK_GBPS = 4_300.0
SM_COUNT = 132
LAUNCH_BOUND_MS = 0.02
NEAR_ROOFLINE = 0.7

# ncu metric names read from profile.extra when present.
OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"
REGISTERS = "launch__registers_per_thread"
SPILLS = "spilled_bytes"


def _gemm_actions(plan: ExpertPlan, gemm: TritonGemm, policy: str, compute_frac: float,
                  evidence: dict[str, float]) -> list[Action]:
    actions: list[Action] = []
    precision = gemm.precision
    failed = set(plan.failed_precisions)  # the ladder never goes back to these
    if policy == "relaxed" and precision in ("ieee", "tf32x3", "tf32") and "fp16" not in failed:
        actions.append(
            Action(
                kind="precision",
                params={"precision": "fp16", "precast": 1, "b_regs": 1, "BLOCK_M": 256, "BLOCK_N": 128,
                        "BLOCK_K": 64, "num_stages": 3},
                expected_gain=STEPS["fp16"].peak_gflops / STEPS[precision].peak_gflops * 0.6,
                rationale="relaxed policy allows fp16 operands with fp32 accumulation: 2x the TF32 "
                "tensor rate; if verification then fails on accuracy, use fp16x3 (hi/lo split)",
            )
        )
    elif policy == "strict" and precision == "ieee" and "tf32x3" not in failed:
        actions.append(
            Action(
                kind="precision",
                params={"precision": "tf32x3"},
                expected_gain=3.0,
                rationale="ieee runs on FMA units; error-compensated TF32 keeps fp32 accuracy on tensor cores",
            )
        )
    if compute_frac >= NEAR_ROOFLINE:
        return actions
    bm, bn = gemm.BLOCK_M, gemm.BLOCK_N
    pattern = plan.graph.pattern
    if pattern.m is not None and pattern.n is not None:
        tiles = math.ceil(pattern.m / bm) * math.ceil(pattern.n / bn)
        evidence["tiles"] = float(tiles)
        waves = tiles / SM_COUNT
        evidence["waves"] = waves
        if waves < 1.0 and bm * bn > 64 * 128:
            actions.append(
                Action(
                    kind="tile",
                    params={"BLOCK_N": max(64, bn // 2)},
                    expected_gain=1.0 / max(waves, 0.25),
                    rationale=f"{tiles} tiles for {SM_COUNT} SMs: smaller tiles fill the chip",
                )
            )
            return actions
    if precision == "tf32x3" or (precision in ("bf16x3", "fp16x3") and not gemm.precast):
        # Split modes hold 2-3x the operand registers: on the H200 (benchmarks/results/
        # gemm_epilogue_h200.md) 128x256 tiles lost 25% to 128x128, and 128x64 with 4 warps won.
        if (bm, bn) != (128, 64):
            actions.append(
                Action(
                    kind="tile",
                    params={"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 4},
                    expected_gain=1.05,
                    rationale="split-precision dots are register-bound: smaller tiles, more programs",
                )
            )
    elif bn < 256 and bm * bn < 128 * 256:
        actions.append(
            Action(
                kind="tile",
                params={"BLOCK_N": bn * 2},
                expected_gain=1.2,
                rationale="a wider tile raises arithmetic intensity per byte of shared memory",
            )
        )
    if gemm.num_stages < 4:
        actions.append(
            Action(
                kind="stages",
                params={"num_stages": gemm.num_stages + 1},
                expected_gain=1.1,
                rationale="deeper K-loop pipelining hides global-load latency",
            )
        )
    occupancy = evidence.get("occupancy_pct")
    if occupancy is not None and occupancy < 25 and gemm.num_warps > 4:
        actions.append(
            Action(
                kind="warps",
                params={"num_warps": 4},
                expected_gain=1.1,
                rationale=f"achieved occupancy {occupancy:.0f}%: fewer warps per program, more programs per SM",
            )
        )
    return [a for a in actions if a.kind == "precision" or _changes_tiles(gemm, a.params)]


TILE_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages")


def _changes_tiles(gemm: TritonGemm, params: dict[str, Any]) -> bool:
    """Does the action still change the GEMM's tiles once they are fitted to shared memory and
    the accumulators' registers (what the backend's ``fit`` does to the next round's knobs)?
    A deeper pipeline that does not fit comes back as the same kernel: a round spent on nothing."""
    try:
        fitted = fit_shared_memory(fit_registers(gemm.with_params(params)[0]))
    except PlanError:
        return False
    return any(getattr(fitted, k) != getattr(gemm, k) for k in TILE_KEYS)


def _memory_actions(knobs: TritonPointwise | TritonRow | TritonScan, bw_frac: float) -> list[Action]:
    if bw_frac >= NEAR_ROOFLINE:
        return []
    actions: list[Action] = []
    if isinstance(knobs, TritonPointwise) and knobs.BLOCK < 8192:
        actions.append(
            Action(
                kind="block_size",
                params={"BLOCK": knobs.BLOCK * 2},
                expected_gain=1.15,
                rationale="more bytes in flight per program",
            )
        )
    if knobs.num_warps < 32:
        actions.append(
            Action(
                kind="warps",
                params={"num_warps": knobs.num_warps * 2},
                expected_gain=1.1,
                rationale=f"{bw_frac:.0%} of copy bandwidth: more warps keep more loads in flight",
            )
        )
    return actions


HOST_GAP_MIN_MS = 0.02  # an idle gap below this is launch noise
HOST_GAP_SHARE = 0.15  # ... or below this share of the call


def device_rows(profile: Profile) -> list[KernelStat]:
    """The kernel table's rows of device work: an operator's row (``aten::clone`` around the
    graph's copy-out, a ``kforge::`` range) repeats the time of the kernels it launched, and a
    graph launch's row is the host's."""
    return [k for k in profile.kernels if not k.name.startswith(("aten::", "kforge::")) and k.name != GRAPH_LAUNCH_ROW]


def replayed(profile: Profile) -> bool:
    """Did the profiled calls replay a CUDA graph? Each replay is a ``cudaGraphLaunch`` row of
    the table, which the eager path of a Triton candidate never makes; tables recorded before
    that row was kept show the replay as the copy of its output (a device-to-device memcpy on
    every call). A replayed call still leaves the GPU idle for the host's part of it (~0.02-0.05
    ms on the H100, ``benchmarks/results/call_overhead_gpu.md``): that gap is no reason to turn
    the graph off, which costs more (0.47 against 0.40 ms there)."""
    rows = device_rows(profile)
    calls = min((k.calls for k in rows), default=0)
    if calls <= 0:
        return False
    return any(k.name == GRAPH_LAUNCH_ROW and k.calls >= calls for k in profile.kernels) or \
        any(k.name.startswith("Memcpy DtoD") and k.calls >= calls for k in rows)


def host_gap_ms(profile: Profile) -> float | None:
    """Per call, the candidate's median time less the device time of its kernels (the select /
    profile kernel table: a few calls under the profiler; each kernel runs at least once per
    call, so the least-called kernel's count is the number of calls). None without a table."""
    rows = device_rows(profile)
    if profile.candidate is None or not rows or profile.device != "cuda":
        return None
    calls = min(k.calls for k in rows)
    if calls <= 0:
        return None
    busy_ms = sum(k.total_us for k in rows) / calls / 1000.0
    return max(0.0, profile.candidate.median_ms - busy_ms)


def recommend_triton(request: AnalysisRequest, plan: ExpertPlan, knobs: ProgramKnobs) -> Recommendation:
    """Recommend the next change for a profiled Triton candidate (see module docstring)."""
    profile = request.profile
    assert profile.candidate is not None  # analysis/__init__.py answers an unusable profile
    kind = plan.graph.pattern.kind
    dom = knobs.kernels.get(plan.dominant or "")
    level = knobs.program if isinstance(knobs.program, TritonProgram) else TritonProgram()
    ms = profile.candidate.median_ms
    precision = dom.precision if isinstance(dom, TritonGemm) else "ieee"
    peak_gflops = profile.peak_gflops or STEPS[precision].peak_gflops
    if isinstance(dom, TritonGemm) and precision != "ieee" and not profile.peak_gflops:
        peak_gflops = STEPS[precision].peak_gflops
    peak_gbps = profile.peak_gbps or PEAK_GBPS
    gflops = profile.achieved_gflops or (profile.flops / (ms * 1e6) if ms > 0 else 0.0)
    gbps = profile.achieved_gbps or (profile.min_bytes / (ms * 1e6) if ms > 0 else 0.0)
    compute_frac, bw_frac = gflops / peak_gflops, gbps / peak_gbps
    kernels = device_rows(profile) if profile.device == "cuda" else profile.kernels
    evidence: dict[str, float] = {
        "median_ms": ms,
        "achieved_gflops": gflops,
        "achieved_gbps": gbps,
        "compute_fraction": compute_frac,
        "bandwidth_fraction": bw_frac,
        "kernels": float(len(kernels)),
    }
    for key, name in ((OCCUPANCY, "occupancy_pct"), (REGISTERS, "registers"), (SPILLS, "spills")):
        value = profile.extra.get(key)
        if isinstance(value, int | float):
            evidence[name] = float(value)
    baseline = min(
        (t.median_ms for t in (profile.eager, profile.compiled) if t is not None), default=0.0
    )
    if baseline:
        evidence["speedup"] = baseline / ms
    # the compiler's kernels, plus the 16-bit GEMMs' precasts (A only with b_regs)
    precasts = sum(1 if kv.b_regs else 2 for kv in knobs.kernels.values()
                   if isinstance(kv, TritonGemm) and kv.precast and STEPS[kv.precision].parts is not None)
    expected_kernels = max(1, len(plan.kernels) + precasts)
    if level.cuda_graph and profile.device == "cuda":  # a copy out of the graph's memory, at most
        expected_kernels += 1
    if len(kernels) > expected_kernels:
        return Recommendation(
            bottleneck="launch",
            evidence=evidence,
            actions=[
                Action(
                    kind="fuse",
                    params={},
                    expected_gain=float(len(kernels)) / expected_kernels,
                    rationale=f"{len(kernels)} kernels where {expected_kernels} suffice",
                )
            ],
            summary="more kernel launches than the pattern needs",
        )
    gap = host_gap_ms(profile)
    if gap is not None:
        evidence["host_gap_ms"] = gap
        idle = gap > max(HOST_GAP_MIN_MS, HOST_GAP_SHARE * ms)
        if level.graphable and not level.cuda_graph and idle:
            return Recommendation(
                bottleneck="launch",
                evidence=evidence,
                actions=[Action(kind="graph", params={"cuda_graph": 1}, expected_gain=ms / max(ms - gap, 1e-3),
                                rationale=f"the GPU is idle {gap * 1000:.0f} us of a {ms * 1000:.0f} us call "
                                          "(Python launches, allocations): replay the launches from a CUDA graph")],
                summary="host-side launch overhead leaves the GPU idle",
            )
        if level.cuda_graph and idle and not replayed(profile):  # the graph never ran
            return Recommendation(
                bottleneck="launch",
                evidence=evidence,
                actions=[Action(kind="graph", params={"cuda_graph": 0}, expected_gain=1.0 + HOST_GAP_MIN_MS / ms,
                                rationale=f"the GPU is idle {gap * 1000:.0f} us of a {ms * 1000:.0f} us call with the "
                                          "graph knob on: the calls come on buffers the graphs were not captured "
                                          "for, so each runs eagerly plus the graph's bookkeeping; turn it off")],
                summary="the CUDA graph is not replayed: the host side still leaves the GPU idle",
            )
    if ms < LAUNCH_BOUND_MS:
        return Recommendation(
            bottleneck="latency",
            evidence=evidence,
            summary=f"{ms * 1000:.1f} us per call: launch latency dominates, knobs will not help",
        )
    if isinstance(dom, TritonGemm):
        actions = _gemm_actions(plan, dom, request.policy, compute_frac, evidence)
        bottleneck = "compute" if compute_frac >= bw_frac else "memory"
        where = f"{compute_frac:.0%} of the {precision} peak ({peak_gflops / 1000:.0f} TFLOP/s)"
    else:
        actions = _memory_actions(dom, bw_frac) if dom is not None else []
        bottleneck = "memory"
        where = f"{bw_frac:.0%} of copy bandwidth ({peak_gbps:.0f} GB/s)"
    if spills := evidence.get("spills"):
        warps = dom.num_warps if dom is not None else 4
        actions.insert(
            0,
            Action(
                kind="tile",
                params={"num_warps": min(16, warps * 2)},
                expected_gain=1.3,
                rationale=f"{spills:.0f} bytes of register spills: spread the tile over more warps",
            ),
        )
    near = max(compute_frac, bw_frac) >= NEAR_ROOFLINE
    summary = f"{kind} at {where}" + ("" if actions else "; near the roofline" if near else "; no knob change left that fits")
    return Recommendation(
        bottleneck=bottleneck, evidence=evidence, actions=actions[:3], summary=summary
    )
