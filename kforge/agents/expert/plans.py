"""CPU plans: the knobs the code generator understands, and how actions change them.

A plan is a small pydantic record; it rides (with the IR) in ``GenerationResult.plan`` and
comes back as ``GenerationRequest.previous_plan``. ``apply_actions`` turns an analysis'
:class:`~kforge.schema.Action` list into the next plan; ``safer_plan`` steps back after a
compile error or a failed verification. Both are pure functions (deterministic).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kforge.schema import Action

GemmKernel = Literal["naive", "packed", "avx2"]
GEMM_ORDER: tuple[GemmKernel, ...] = ("naive", "packed", "avx2")


class CpuPlan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    threads: bool = True  # OpenMP over rows / tiles
    simd: bool = False  # `#pragma omp simd` + vectorisable kf_* math (else libm, scalar)
    unroll: int = Field(1, ge=1, le=8)  # independent accumulators per lane in reductions
    passes: int = Field(3, ge=2, le=3)  # softmax/log_softmax: 2 = online; layernorm: 2 = sum+sumsq
    fuse_epilogue: bool = False  # epilogue inside the core kernel (else a second kernel)
    gemm_kernel: GemmKernel = "naive"
    mr: int = Field(6, ge=1, le=6)
    nr: int = Field(16, ge=8, le=16)
    kc: int = Field(256, ge=16, le=4096)
    mc: int = Field(96, ge=6, le=4096)
    nc: int = Field(1024, ge=16, le=65536)
    notes: list[str] = Field(default_factory=list)  # why the plan is what it is, in order

    def knobs(self) -> dict[str, Any]:
        return self.model_dump(exclude={"notes"})


def initial_plan(kind: str) -> CpuPlan:
    """Round 0: correct and conservative (threads on, scalar libm math, unfused tail)."""
    return CpuPlan(notes=[f"round 0: conservative {kind} plan (threads, scalar math, unfused tail)"])


def plan_from_dict(data: dict[str, Any]) -> CpuPlan:
    return CpuPlan.model_validate(data) if data else CpuPlan()


def _set(plan: CpuPlan, note: str, **changes: Any) -> CpuPlan:
    data = plan.model_dump()
    real = {k: v for k, v in changes.items() if data.get(k) != v}
    if not real:
        return plan
    data.update(real)
    data["notes"] = [*plan.notes, note]
    return CpuPlan.model_validate(data)


def apply_action(plan: CpuPlan, action: Action) -> CpuPlan:
    """One action on a plan; unknown kinds and out-of-range params are ignored (recorded)."""
    p = action.params
    kind = action.kind
    note = f"{kind} {p}"
    if kind == "parallelize":
        return _set(plan, note, threads=bool(p.get("threads", True)))
    if kind == "vectorize":
        return _set(plan, note, simd=bool(p.get("simd", True)))
    if kind == "unroll":
        return _set(plan, note, unroll=max(1, min(8, int(p.get("unroll", 4)))))
    if kind == "fuse":
        changes: dict[str, Any] = {"fuse_epilogue": bool(p.get("epilogue", True))}
        if "passes" in p:
            changes["passes"] = max(2, min(3, int(p["passes"])))
        return _set(plan, note, **changes)
    if kind == "tile":
        changes = {}
        if p.get("gemm_kernel") in GEMM_ORDER:
            changes["gemm_kernel"] = p["gemm_kernel"]
        for key, hi in (("mr", 6), ("nr", 16), ("kc", 4096), ("mc", 4096), ("nc", 65536)):
            if key in p:
                changes[key] = max(1, min(hi, int(p[key])))
        if "nr" in changes:
            changes["nr"] = 16 if changes["nr"] > 8 else 8
        if "mc" in changes:
            changes["mc"] = max(6, changes["mc"])
        return _set(plan, note, **changes)
    if kind == "block_size":
        return _set(plan, note, **{k: int(v) for k, v in p.items() if k in ("kc", "mc", "nc")})
    return _set(plan, f"ignored unknown action {kind}", notes=plan.notes)


def apply_actions(plan: CpuPlan, actions: list[Action]) -> CpuPlan:
    for action in actions:
        plan = apply_action(plan, action)
    return plan


def safer_plan(plan: CpuPlan, reason: str) -> CpuPlan:
    """Step back after a functional failure: undo the riskiest knob still enabled."""
    note = f"functional failure ({reason}): "
    if plan.gemm_kernel != "naive":
        lower = GEMM_ORDER[GEMM_ORDER.index(plan.gemm_kernel) - 1]
        return _set(plan, note + f"gemm kernel {plan.gemm_kernel} -> {lower}", gemm_kernel=lower)
    if plan.passes == 2:
        return _set(plan, note + "back to 3 passes", passes=3)
    if plan.unroll > 1:
        return _set(plan, note + "no unrolling", unroll=1)
    if plan.simd:
        return _set(plan, note + "scalar libm math", simd=False)
    if plan.fuse_epilogue:
        return _set(plan, note + "unfused epilogue", fuse_epilogue=False)
    if plan.threads:
        return _set(plan, note + "single thread", threads=False)
    return plan
