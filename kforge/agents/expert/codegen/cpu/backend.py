"""The CPU backend: one set of knobs for the whole translation unit (:class:`~kforge.agents.
expert.plan.knobs.CpuKnobs`, the host compiler's vector ISA picking the defaults, the same
every round unless the analysis changes them), no
precision ladder (every GEMM is fp32 FMA), the C++ / OpenMP module of :mod:`.render`."""

from __future__ import annotations

from kforge.agents.expert.analysis.cpu import recommend_cpu
from kforge.agents.expert.codegen.cpu.ops import CPU_OPS
from kforge.agents.expert.codegen.cpu.render import render_cpu
from kforge.agents.expert.codegen.cstyle import render_expr
from kforge.agents.expert.codegen.optable import OpTable
from kforge.agents.expert.errors import PlanError
from kforge.agents.expert.plan.expr import E
from kforge.agents.expert.plan.kernels import GemmKernel, Program
from kforge.agents.expert.plan.knobs import CpuKnobs, KernelKnobs, ProgramKnobs
from kforge.agents.expert.plan.precision import Step
from kforge.agents.expert.plan.record import ExpertPlan
from kforge.platforms import cpu_runtime


class CpuBackend:
    platform = "cpu"
    steps: tuple[str, ...] = ()  # fp32 FMA only: no step to move along
    storage: frozenset[str] = frozenset()  # f32 pointers only

    def op_tables(self) -> tuple[OpTable, ...]:
        return (CPU_OPS[True], CPU_OPS[False])

    def render_expr(self, e: E, table: OpTable) -> str:
        return render_expr(e, table)

    def default_knobs(self, program: Program, policy: str) -> ProgramKnobs:
        return ProgramKnobs({}, CpuKnobs.for_isa(cpu_runtime.vector_isa()))

    def at_step(self, program: Program, kernel: GemmKernel, knobs: KernelKnobs, step: Step) -> KernelKnobs:
        raise PlanError("the cpu backend's GEMMs have no precision steps")

    def fit(self, program: Program, knobs: ProgramKnobs, policy: str) -> ProgramKnobs:
        return knobs

    def render(self, program: Program, knobs: ProgramKnobs, policy: str, problem_source: str) -> str:
        assert isinstance(knobs.program, CpuKnobs)
        return render_cpu(program, knobs.program, problem_source)

    def knobs_of(self, plan: ExpertPlan) -> ProgramKnobs:
        return ProgramKnobs.from_record(plan.knobs, {}, {}, plan.program_knobs, CpuKnobs)

    recommend = staticmethod(recommend_cpu)


BACKEND = CpuBackend()
