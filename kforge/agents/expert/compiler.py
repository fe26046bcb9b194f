"""The expert as a fusion compiler: problem -> program -> knobs -> candidate, per round.

    capture (make_fx, symbolic sizes) -> ir (core ops) -> planner (kernels) -> knobs -> render

Knobs are per kernel (``{"k0": {"BLOCK_M": 128, ...}, "k1": {...}}``). Round 0 takes the
backend's defaults; later rounds start from the previous round's knobs and apply the
analysis agent's actions to the *dominant* kernel (the GEMM when there is one, else the
kernel with the most work); a functional failure moves the GEMMs one step up the precision
ladder (bf16 -> bf16x3 -> tf32x3 -> ieee) or back to the defaults.

The plan recorded with the candidate carries the kernel list, the knobs, and a ``graph``
summary of the dominant kernel in the shape the analysis rules read
(``pattern.kind`` gemm | row_reduction | elementwise, with m, n, k for a GEMM).
"""

from __future__ import annotations

from typing import Any

from kforge.agents.expert.kernels import GemmKernel, PointwiseKernel, Program, RowKernel
from kforge.schema import GenerationRequest

FUNCTIONAL_STAGES = ("compile", "verify", "profile")
PRECISION_LADDER = ("bf16", "bf16x3", "tf32x3", "ieee")
ROW_ALIASES = {"BLOCK_N": "BLOCK_R"}  # the analysis rules' name for a row kernel's chunk


def dominant(program: Program) -> str | None:
    gemms = [k for k in program.kernels if isinstance(k, GemmKernel)]
    if gemms:
        return gemms[0].name
    rows = [k for k in program.kernels if isinstance(k, RowKernel)]
    if rows:
        return rows[0].name
    return program.kernels[0].name if program.kernels else None


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


def step_up(precision: str, policy: str) -> str | None:
    """The next more accurate precision the policy allows (None at the top)."""
    if precision not in PRECISION_LADDER:
        return None
    i = PRECISION_LADDER.index(precision)
    return PRECISION_LADDER[i + 1] if i + 1 < len(PRECISION_LADDER) else None


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
        if "mismatch" in reason or "precision" in reason:
            for name, kv in knobs.items():
                up = step_up(str(kv.get("precision", "")), request.policy)
                if up is not None:
                    kv["precision"] = up
                    changed.append(f"{name} precision -> {up}")
        if changed:
            return knobs, [f"repair after {reason}: " + ", ".join(changed)]
        return defaults, [f"repair after {reason}: back to the default knobs"]
    name = dominant(program)
    notes = ["carried the previous knobs"]
    if request.recommendation is not None and name is not None:
        for action in request.recommendation.actions:
            before = knobs[name]
            knobs[name] = apply_params(before, action.params)
            if knobs[name] != before:
                notes.append(f"{name}: {action.kind} {action.params}")
    return knobs, notes


def plan_record(program: Program, knobs: dict[str, dict[str, Any]], notes: list[str], platform: str) -> dict[str, Any]:
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
    return {"platform": platform, "compiler": "fusion-v2", "kernels": kernels, "knobs": knobs,
            "dominant": name, "graph": graph_summary(program, name), "notes": notes,
            **flat_view(knobs, name)}
