"""The plan recorded with every expert candidate (``GenerationResult.plan``): what the compiler
made and why, read back by the next round and by the analysis.

    ExpertPlan
      platform, compiler          "fusion-v2": an expert candidate's plan
      kernels [KernelEntry]       name, kind and shape of the work of each kernel
      knobs {kernel: {knob: v}}   each kernel's knob record (plan/knobs.py), as JSON
      program_knobs {knob: v}     the knobs of the whole candidate (cpu: all; triton: cuda_graph)
      precision                   the most accurate GEMM step in use (None: no GEMM step)
      failed_precisions           steps that failed this problem's accuracy check (never again)
      dominant, graph             the kernel the analysis acts on, and its pattern summary
      notes                       why the knobs are what they are, one line per decision
      rewrites, rewrite_notes     the algebraic rules applied (ir/rewrites.py)
      refusals [Refusal]          every fusion the planner refused, and why

``stages/report.py`` reads ``knobs[dominant]["precision"]`` and ``precision``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kforge.agents.expert.plan.kernels import (
    GemmKernel,
    PointwiseKernel,
    Program,
    Refusal,
    RowKernel,
)
from kforge.agents.expert.plan.knobs import ProgramKnobs
from kforge.agents.expert.plan.precision import LADDER, STEPS

COMPILER = "fusion-v2"


class Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)  # older plans carry more keys


class KernelEntry(Record):
    name: str
    kind: Literal["pointwise", "row", "gemm", "scan"]
    stores: int | None = None
    passes: int | None = None
    reductions: list[str] | None = None
    outer_stores: int | None = None
    full_stores: int | None = None


class Pattern(Record):
    kind: Literal["gemm", "row_reduction", "elementwise"]
    m: int | None = None
    n: int | None = None
    k: int | None = None


class GraphSummary(Record):
    pattern: Pattern


class ExpertPlan(Record):
    platform: str
    compiler: Literal["fusion-v2"] = COMPILER
    kernels: list[KernelEntry] = Field(default_factory=list)
    knobs: dict[str, dict[str, Any]] = Field(default_factory=dict)
    program_knobs: dict[str, Any] = Field(default_factory=dict)
    precision: str | None = None
    failed_precisions: list[str] = Field(default_factory=list)
    dominant: str | None = None
    graph: GraphSummary = GraphSummary(pattern=Pattern(kind="elementwise"))
    notes: list[str] = Field(default_factory=list)
    rewrites: list[str] = Field(default_factory=list)
    rewrite_notes: list[str] = Field(default_factory=list)
    refusals: list[Refusal] = Field(default_factory=list)

    def kernel(self, name: str | None) -> KernelEntry | None:
        return next((k for k in self.kernels if k.name == name), None)


def read_plan(data: dict[str, Any]) -> ExpertPlan | None:
    """A previous round's plan, or None when it is not an expert plan (another agent's, or none)."""
    if data.get("compiler") != COMPILER:
        return None
    try:
        return ExpertPlan.model_validate(data)
    except ValueError:
        return None


# ------------------------------------------------------------------ the program's work

def kernel_work(program: Program, kernel: Any) -> int:
    """Points a kernel visits at the traced sizes: 2 * K per output for a GEMM (a multiply and
    an add), the whole iteration space otherwise."""
    if isinstance(kernel, GemmKernel):
        batch = program.hint(kernel.batch) if kernel.batch is not None else 1
        return 2 * batch * program.hint(kernel.m) * program.hint(kernel.n) * program.hint(kernel.k)
    dims = kernel.work_dims()
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


def graph_summary(program: Program, name: str | None) -> GraphSummary:
    kernel = next((k for k in program.kernels if k.name == name), None)
    if isinstance(kernel, GemmKernel):
        batch = program.hint(kernel.batch) if kernel.batch is not None else 1
        return GraphSummary(pattern=Pattern(kind="gemm", m=batch * program.hint(kernel.m), n=program.hint(kernel.n),
                                            k=program.hint(kernel.k)))
    if isinstance(kernel, RowKernel):
        return GraphSummary(pattern=Pattern(kind="row_reduction"))
    return GraphSummary(pattern=Pattern(kind="elementwise"))


def kernel_entry(k: Any) -> KernelEntry:
    if isinstance(k, RowKernel):
        return KernelEntry(name=k.name, kind="row", passes=k.passes, reductions=[r.kind for r in k.reductions],
                           outer_stores=len(k.outer_stores), full_stores=len(k.full_stores))
    if isinstance(k, GemmKernel | PointwiseKernel):
        return KernelEntry(name=k.name, kind=k.kind, stores=len(k.stores))
    return KernelEntry(name=k.name, kind=k.kind)


def plan_record(program: Program, knobs: ProgramKnobs, notes: list[str], platform: str,
                failed: list[str] | None = None) -> ExpertPlan:
    name = dominant(program)
    steps = sorted(set(knobs.precisions().values()), key=lambda p: LADDER.index(STEPS[p]) if p in STEPS else -1)
    return ExpertPlan(platform=platform, kernels=[kernel_entry(k) for k in program.kernels],
                      knobs=knobs.kernels_json(), program_knobs=knobs.program_json(),
                      precision=steps[-1] if steps else None, failed_precisions=list(failed or []), dominant=name,
                      graph=graph_summary(program, name), notes=list(notes), rewrites=list(program.rewrites),
                      rewrite_notes=list(program.rewrite_notes), refusals=list(program.refusals))
