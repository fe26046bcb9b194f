"""The expert as a fusion compiler: problem -> program -> knobs -> candidate, per round.

    capture (make_fx, symbolic sizes) -> ir (core ops) -> planner (kernels) -> knobs -> render

Knobs are per kernel (``{"k0": {"BLOCK_M": 128, ...}, "k1": {...}}``). Round 0 takes the
backend's defaults; later rounds start from the previous round's knobs and apply the
analysis agent's actions to the *dominant* kernel (the one with the most work at the traced
sizes, :func:`kernel_work`); a functional failure moves the GEMMs one step up the precision
ladder (bf16, fp16 -> bf16x2, fp16x2, tf32 -> bf16x3, fp16x3 -> tf32x3 -> ieee, the steps the policy
allows; round 0 starts at fp16 under relaxed and fp16x3 under strict) or back to the defaults; a
pass by a wide margin lets the analysis move down to a cheaper step (:func:`step_down`).

The plan recorded with the candidate carries the kernel list, the knobs, and a ``graph``
summary of the dominant kernel in the shape the analysis rules read
(``pattern.kind`` gemm | row_reduction | elementwise, with m, n, k for a GEMM).
"""

from __future__ import annotations

from typing import Any

from kforge.agents.expert.plan.kernels import (
    GemmKernel,
    Kernel,
    PointwiseKernel,
    Program,
    RowKernel,
    ScanKernel,
)
from kforge.schema import GenerationRequest

FUNCTIONAL_STAGES = ("compile", "verify", "profile")
# Ordered by cost (tensor-core products at the bf16 rate, STEP_COST), then by accuracy.
PRECISION_LADDER = ("bf16", "fp16", "bf16x2", "fp16x2", "tf32", "bf16x3", "fp16x3", "tf32x3", "ieee")
STEP_COST = {"bf16": 1, "fp16": 1, "bf16x2": 2, "fp16x2": 2, "tf32": 2, "bf16x3": 3, "fp16x3": 3, "tf32x3": 6,
             "ieee": 16}
STEP_DOWN_MARGIN = 0.02  # max |err| / allowed below this on every case: a cheaper step is tried
# Max error of each step: the bf16, tf32 and ieee steps measured on the H200
# (benchmarks/results/gemm_ladder_h200.md: one 1024 x 8192 x 8192 GEMM + epilogue); the fp16
# steps scaled from their bf16 / tf32 counterparts by a CPU simulation of a 256 x 8192 x 8192
# nn.Linear GEMM (benchmarks/results/half_split_error_cpu.md; relative error norm, fp16 / bf16:
# 0.125 for one and two products; fp16x3, its lo parts stored times 2^11, against tf32x3: the
# same norm, 1.06x its worst element against float64, so a hair above it and tf32x3 stays the
# step after it). An accuracy repair predicts each step's margin as (failed margin) x (its
# error / the failed step's) and takes the cheapest step predicted at or below STEP_UP_TARGET,
# instead of climbing one step a round.
STEP_ERROR = {"bf16": 9.8e-3, "fp16": 1.2e-3, "bf16x2": 6.7e-3, "fp16x2": 8.4e-4, "tf32": 4.3e-3,
              "bf16x3": 1.6e-4, "fp16x3": 2.4e-5, "tf32x3": 2.3e-5, "ieee": 9.5e-7}
STEP_UP_TARGET = 0.7
ROW_ALIASES = {"BLOCK_N": "BLOCK_R"}  # the analysis rules' name for a row kernel's chunk


def kernel_work(program: Program, kernel: Kernel) -> int:
    """Points a kernel visits at the traced sizes: 2 * K per output for a GEMM (a multiply and
    an add), the whole iteration space otherwise."""
    if isinstance(kernel, GemmKernel):
        batch = program.hint(kernel.batch) if kernel.batch is not None else 1
        return 2 * batch * program.hint(kernel.m) * program.hint(kernel.n) * program.hint(kernel.k)
    if isinstance(kernel, RowKernel):
        dims = (*kernel.outer, *kernel.red)
    elif isinstance(kernel, ScanKernel):
        dims = (*kernel.outer, kernel.length)
    else:
        dims = tuple(getattr(kernel, "space", ()))
    total = 1
    for dim in dims:
        total *= program.hint(dim)
    return total


def dominant(program: Program) -> str | None:
    """The kernel the analysis acts on: the one with the most work (after rewrites a problem's
    GEMM may be gone and its GEMV is a row kernel beside tiny bias sums); ties go to the first."""
    if not program.kernels:
        return None
    return max(program.kernels, key=lambda k: kernel_work(program, k)).name


def graph_summary(program: Program, name: str | None) -> dict[str, Any]:
    kernel = next((k for k in program.kernels if k.name == name), None)
    if isinstance(kernel, GemmKernel):
        batch = program.hint(kernel.batch) if kernel.batch is not None else 1
        return {"pattern": {"kind": "gemm", "m": batch * program.hint(kernel.m),
                            "n": program.hint(kernel.n), "k": program.hint(kernel.k)}}
    if isinstance(kernel, RowKernel):
        return {"pattern": {"kind": "row_reduction"}}
    return {"pattern": {"kind": "elementwise"}}


def flat_view(knobs: dict[str, dict[str, Any]], name: str | None) -> dict[str, Any]:
    """The dominant kernel's knobs under the names the analysis rules use."""
    if name is None:
        return {}
    own = dict(knobs.get(name, {}))
    for alias, real in ROW_ALIASES.items():
        if real in own:
            own[alias] = own[real]
    return own


def apply_params(knobs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    out = dict(knobs)
    for key, value in params.items():
        key = ROW_ALIASES.get(key, key) if "BLOCK_R" in out else key
        if key in out:
            out[key] = value
    return out


def _allowed(policy: str) -> tuple[str, ...]:
    from kforge.agents.expert.codegen.triton.gemm import allowed_precisions

    return tuple(p for p in PRECISION_LADDER if p in allowed_precisions(policy))


def step_up(precision: str, policy: str, margin: float | None = None, overflow: bool = False) -> str | None:
    """A more accurate precision the policy allows (None at the top): the next one, or, given
    the failed verdict's ``margin`` (max |err| / allowed > 1), the cheapest one whose predicted
    margin (``margin`` scaled by :data:`STEP_ERROR`) is at most :data:`STEP_UP_TARGET`; the most
    accurate allowed step when none is predicted to pass. ``overflow``: the step's outputs were
    NaN or inf where the reference's are finite; the fp16 steps share that range and are skipped."""
    ladder = _allowed(policy)
    if precision not in PRECISION_LADDER:
        return None
    above = [p for p in ladder if PRECISION_LADDER.index(p) > PRECISION_LADDER.index(precision)]
    if overflow:  # NaN/inf where the reference is finite: fp16's range (+-65504), not its bits
        above = [p for p in above if not p.startswith("fp16")]
    else:
        above = [p for p in above if STEP_ERROR[p] < STEP_ERROR[precision]]
    # of the steps of one cost, only the most accurate (fp16x3 before bf16x3)
    above = [p for p in above if STEP_ERROR[p] == min(STEP_ERROR[q] for q in above if STEP_COST[q] == STEP_COST[p])]
    if not above:
        return None
    if margin is None or not margin > 1.0 or precision not in STEP_ERROR:
        return above[0]
    for step in above:
        if margin * STEP_ERROR[step] / STEP_ERROR[precision] <= STEP_UP_TARGET:
            return step
    return above[-1]


def step_down(precision: str, policy: str, margin: float | None) -> str | None:
    """The next cheaper precision the policy allows, when the last pass had room to spare
    (``margin`` = max |err| / allowed over the verified cases, below :data:`STEP_DOWN_MARGIN`)."""
    if margin is None or not margin < STEP_DOWN_MARGIN or precision not in PRECISION_LADDER:
        return None
    below = [p for p in _allowed(policy) if STEP_COST[p] < STEP_COST[precision]]
    if not below:
        return None
    cost = max(STEP_COST[p] for p in below)  # the next cheaper cost, its most accurate step
    return min((p for p in below if STEP_COST[p] == cost), key=lambda p: STEP_ERROR[p])


def set_precision(program: Program, name: str, knobs: dict[str, Any], precision: str) -> dict[str, Any]:
    """A kernel's knobs at another precision step, with that step's tiles for a GEMM."""
    kernel = next((k for k in program.kernels if k.name == name), None)
    if isinstance(kernel, GemmKernel) and "BLOCK_M" in knobs:
        from kforge.agents.expert.codegen.triton.gemm import step_knobs

        return step_knobs(knobs, precision, program.hint(kernel.m), program.hint(kernel.n))
    return {**knobs, "precision": precision}


def _is_accuracy_failure(request: GenerationRequest) -> bool:
    failures = [f for f in request.feedback if f.stage in FUNCTIONAL_STAGES]
    return bool(failures) and any(w in failures[0].reason for w in ("mismatch", "precision", "nonfinite"))


def failed_precisions(request: GenerationRequest) -> list[str]:
    """Precisions that already failed this problem's accuracy check (the ladder never returns)."""
    plan = request.previous_plan if request.round > 0 else {}
    failed = [str(p) for p in plan.get("failed_precisions", []) if isinstance(p, str)]
    if _is_accuracy_failure(request):
        for kv in (plan.get("knobs") or {}).values():
            p = kv.get("precision") if isinstance(kv, dict) else None
            if isinstance(p, str) and p not in failed:
                failed.append(p)
    return failed


def round_knobs(program: Program, defaults: dict[str, dict[str, Any]], request: GenerationRequest) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """(knobs for this round, notes saying why)."""
    previous = request.previous_plan.get("knobs") if request.round > 0 else None
    if not isinstance(previous, dict) or set(previous) != set(defaults):
        return defaults, ["round 0: the backend's default knobs"] if request.round == 0 else ["defaults (no usable previous plan)"]
    knobs = {name: {**defaults[name], **{k: v for k, v in previous[name].items() if k in defaults[name]}} for name in defaults}
    failures = [f for f in request.feedback if f.stage in FUNCTIONAL_STAGES]
    if failures:
        reason = f"{failures[0].stage}:{failures[0].reason}"
        changed = []
        overflow = "nonfinite" in reason and any(str(kv.get("precision", "")).startswith("fp16") for kv in knobs.values())
        if "mismatch" in reason or "precision" in reason or overflow:
            for name, kv in knobs.items():
                up = step_up(str(kv.get("precision", "")), request.policy, request.failed_margin, overflow)
                if up is not None:
                    knobs[name] = set_precision(program, name, kv, up)
                    why = f" (failed at margin {request.failed_margin:.3g})" if request.failed_margin else ""
                    changed.append(f"{name} precision -> {up}{why}")
        if changed:
            return knobs, [f"repair after {reason}: " + ", ".join(changed)]
        return defaults, [f"repair after {reason}: back to the default knobs"]
    name = dominant(program)
    notes = ["carried the previous knobs"]
    failed = failed_precisions(request)
    for kname, kv in knobs.items():
        down = step_down(str(kv.get("precision", "")), request.policy, request.verified_margin)
        if down is not None and down not in failed:
            knobs[kname] = set_precision(program, kname, kv, down)
            notes.append(f"{kname} precision -> {down} (verified with margin {request.verified_margin:.3g})")
    if request.recommendation is not None and name is not None:
        for action in request.recommendation.actions:
            before = knobs[name]
            knobs[name] = apply_params(before, action.params)
            if knobs[name] != before:
                notes.append(f"{name}: {action.kind} {action.params}")
    return knobs, notes


def plan_record(program: Program, knobs: dict[str, dict[str, Any]], notes: list[str], platform: str,
                failed: list[str] | None = None) -> dict[str, Any]:
    name = dominant(program)
    kernels = []
    for k in program.kernels:
        entry: dict[str, Any] = {"name": k.name, "kind": k.kind}
        if isinstance(k, GemmKernel):
            entry["stores"] = len(k.stores)
        elif isinstance(k, RowKernel):
            entry.update(passes=k.passes, reductions=[r.kind for r in k.reductions],
                         outer_stores=len(k.outer_stores), full_stores=len(k.full_stores))
        elif isinstance(k, PointwiseKernel):
            entry["stores"] = len(k.stores)
        kernels.append(entry)
    precisions = sorted({str(kv["precision"]) for kv in knobs.values() if "precision" in kv},
                        key=lambda p: PRECISION_LADDER.index(p) if p in PRECISION_LADDER else -1)
    extra: dict[str, Any] = {"precision": precisions[-1]} if precisions else {}
    return {"platform": platform, "compiler": "fusion-v2", "kernels": kernels, "knobs": knobs,
            **extra, "failed_precisions": failed or [],
            "dominant": name, "graph": graph_summary(program, name), "notes": notes,
            **flat_view(knobs, name)}
