"""The knobs of each round: problem -> program -> knobs, then the backend renders.

    capture (make_fx, symbolic sizes) -> ir (the op table) -> planner (kernels) -> knobs -> render

Round 0 takes the backend's defaults. Later rounds start from the previous round's knobs (the
plan record's, over the defaults) and:

* after a functional failure on accuracy, move every GEMM up the precision ladder
  (:func:`~.precision.step_up`: as far as the failed margin says, never to a step that already
  failed; an fp16 overflow leaves the fp16 steps), else go back to the defaults;
* after a pass with room to spare, try the next cheaper step (:func:`~.precision.step_down`);
* apply the analysis agent's actions to the *dominant* kernel (the one with the most work at
  the traced sizes, :func:`~.record.dominant`), and what is no knob of that kernel to the
  program's knobs; a param that is neither is noted, not dropped.

Knobs a backend cannot take (:class:`~kforge.agents.expert.errors.PlanError`) send the round
back to the defaults, saying why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kforge.agents.expert.errors import PlanError
from kforge.agents.expert.plan.kernels import GemmKernel, Program
from kforge.agents.expert.plan.knobs import ProgramKnobs
from kforge.agents.expert.plan.precision import STEPS, step_down, step_up
from kforge.agents.expert.plan.record import dominant, read_plan
from kforge.schema import GenerationRequest

if TYPE_CHECKING:
    from kforge.agents.expert.codegen.backend import Backend

FUNCTIONAL_STAGES = ("compile", "verify", "profile")


def _failures(request: GenerationRequest) -> list[str]:
    return [f"{f.stage}:{f.reason}" for f in request.feedback if f.stage in FUNCTIONAL_STAGES]


def _is_accuracy_failure(request: GenerationRequest) -> bool:
    failures = _failures(request)
    return bool(failures) and any(w in failures[0] for w in ("mismatch", "precision", "nonfinite"))


def failed_precisions(request: GenerationRequest) -> list[str]:
    """Precisions that already failed this problem's accuracy check (the ladder never returns)."""
    plan = read_plan(request.previous_plan) if request.round > 0 else None
    if plan is None:
        return []
    failed = list(plan.failed_precisions)
    if _is_accuracy_failure(request):
        for kv in plan.knobs.values():
            p = kv.get("precision")
            if isinstance(p, str) and p not in failed:
                failed.append(p)
    return failed


def set_precision(backend: Backend, program: Program, knobs: ProgramKnobs, name: str, precision: str) -> ProgramKnobs:
    kernel = next(k for k in program.kernels if k.name == name)
    assert isinstance(kernel, GemmKernel), f"{name} has a precision knob but is no GEMM"
    return knobs.with_kernel(name, backend.at_step(program, kernel, knobs.kernels[name], STEPS[precision]))


def round_knobs(backend: Backend, program: Program, request: GenerationRequest) -> tuple[ProgramKnobs, list[str]]:
    """(knobs for this round, notes saying why), fitted by the backend."""
    defaults = backend.default_knobs(program, request.policy)
    try:
        knobs, notes = _changed(backend, program, defaults, request)
        return backend.fit(program, knobs, request.policy), notes
    except PlanError as err:
        return defaults, [f"rejected ({err}): back to the defaults"]


def _changed(backend: Backend, program: Program, defaults: ProgramKnobs,
             request: GenerationRequest) -> tuple[ProgramKnobs, list[str]]:
    previous = read_plan(request.previous_plan) if request.round > 0 else None
    if previous is None or set(previous.knobs) != set(defaults.kernels):
        return defaults, ["round 0: the backend's default knobs"] if request.round == 0 else \
            ["defaults (no usable previous plan)"]
    knobs = defaults.from_json(previous.knobs, previous.program_knobs)
    failures = _failures(request)
    if failures:
        reason = failures[0]
        changed = []
        precisions = knobs.precisions()
        overflow = "nonfinite" in reason and any(p.startswith("fp16") for p in precisions.values())
        if "mismatch" in reason or "precision" in reason or overflow:
            for name, precision in precisions.items():
                up = step_up(precision, request.policy, request.failed_margin, overflow, backend.steps)
                if up is not None:
                    knobs = set_precision(backend, program, knobs, name, up)
                    why = f" (failed at margin {request.failed_margin:.3g})" if request.failed_margin else ""
                    changed.append(f"{name} precision -> {up}{why}")
        if changed:
            return knobs, [f"repair after {reason}: " + ", ".join(changed)]
        return defaults, [f"repair after {reason}: back to the default knobs"]
    notes = ["carried the previous knobs"]
    failed = failed_precisions(request)
    for name, precision in knobs.precisions().items():
        down = step_down(precision, request.policy, request.verified_margin, backend.steps)
        if down is not None and down not in failed:
            knobs = set_precision(backend, program, knobs, name, down)
            notes.append(f"{name} precision -> {down} (verified with margin {request.verified_margin:.3g})")
    target = dominant(program)
    if request.recommendation is not None:
        for action in request.recommendation.actions:
            knobs, note = apply_action(knobs, target, action.kind, action.params)
            notes += note
    return knobs, notes


def apply_action(knobs: ProgramKnobs, target: str | None, kind: str,
                 params: dict[str, object]) -> tuple[ProgramKnobs, list[str]]:
    """An action's params applied to the dominant kernel's knobs, the rest to the program's."""
    notes = []
    rest = dict(params)
    if target is not None and target in knobs.kernels:
        before = knobs.kernels[target]
        after, unknown = before.with_params(rest)
        rest = {k: v for k, v in rest.items() if k in unknown}
        if after != before:
            knobs = knobs.with_kernel(target, after)
            notes.append(f"{target}: {kind} {params}")
    if rest and knobs.program is not None:
        before_p = knobs.program
        after_p, unknown = before_p.with_params(rest)
        rest = {k: v for k, v in rest.items() if k in unknown}
        if after_p != before_p:
            knobs = knobs.with_program(after_p)
            notes.append(f"program: {kind} {params}")
    if rest:
        where = f"{target} or of the program" if target in knobs.kernels else "the program"
        notes.append(f"{kind}: {sorted(rest)} is no knob of {where}, left alone")
    return knobs, notes
