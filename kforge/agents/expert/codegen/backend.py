"""One protocol for every backend, and the registry that picks one by platform.

A backend turns a planned :class:`~kforge.agents.expert.plan.kernels.Program` into a candidate
module for its platform: it names the precision steps its GEMMs render, picks round 0's knobs,
moves a GEMM to another step, fits knobs to what its kernels allow, renders, and reads its
candidates' profiles. The agent and the analysis call only this protocol; adding a platform
is a module that defines ``BACKEND`` (an object of this shape, its op table rendering every
op of ``ir/ops.py`` itself or by decomposition) and one :class:`BackendEntry` row here.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from kforge.agents.expert.errors import UnsupportedError

if TYPE_CHECKING:
    from kforge.agents.expert.codegen.optable import OpTable
    from kforge.agents.expert.plan.expr import E
    from kforge.agents.expert.plan.kernels import GemmKernel, Program
    from kforge.agents.expert.plan.knobs import KernelKnobs, ProgramKnobs, ProgramLevel
    from kforge.agents.expert.plan.precision import Step
    from kforge.agents.expert.plan.record import ExpertPlan
    from kforge.schema import AnalysisRequest, Recommendation


class Backend(Protocol):
    platform: str
    steps: tuple[str, ...]  # the precision steps its GEMMs render (ladder order)
    storage: frozenset[str]  # the storage-only types (bf16, f16) its kernels load and store

    def op_tables(self) -> tuple[OpTable, ...]:
        """Every op table the backend renders with (one per math flavour)."""

    def render_expr(self, e: E, table: OpTable) -> str:
        """One expression in the backend's language (the op table's tests)."""

    def default_knobs(self, program: Program, policy: str) -> ProgramKnobs:
        """Round 0's knobs for ``program`` under ``policy``."""

    def at_step(self, program: Program, kernel: GemmKernel, knobs: KernelKnobs, step: Step) -> KernelKnobs:
        """A GEMM's knobs moved to another precision step (with that step's tiles)."""

    def fit(self, program: Program, knobs: ProgramKnobs, policy: str) -> ProgramKnobs:
        """The knobs checked against the policy and fitted to the kernels' limits; PlanError
        where they cannot be."""

    def render(self, program: Program, knobs: ProgramKnobs, policy: str, problem_source: str) -> str:
        """The candidate module."""

    def knobs_of(self, plan: ExpertPlan) -> ProgramKnobs:
        """A plan record's knobs as this backend's typed records (PlanError if they are not)."""

    def recommend(self, request: AnalysisRequest, plan: ExpertPlan, knobs: ProgramKnobs) -> Recommendation:
        """The next round's knob changes for a profiled candidate of this backend."""


@dataclass(frozen=True)
class BackendEntry:
    """A registered backend: its platform and the module that defines ``BACKEND``."""

    platform: str
    module: str

    def __post_init__(self) -> None:
        if not self.module.startswith("kforge.agents.expert.codegen.") or not self.platform.isidentifier():
            raise ValueError(f"backend entry {self}: a platform name and a module under codegen/")

    def load(self) -> Backend:
        backend: Backend = importlib.import_module(self.module).BACKEND
        if backend.platform != self.platform:
            raise ValueError(f"{self.module}.BACKEND renders {backend.platform!r}, registered as {self.platform!r}")
        return backend


BACKENDS: Mapping[str, BackendEntry] = {e.platform: e for e in (
    BackendEntry("triton", "kforge.agents.expert.codegen.triton.backend"),
    BackendEntry("cpu", "kforge.agents.expert.codegen.cpu.backend"),
    BackendEntry("cuda", "kforge.agents.expert.codegen.cuda.backend"),
)}


class KernelRecords:
    """What the backends with a knob record per kernel kind share (triton, cuda): reading a
    plan's knobs back as those records, fitting each GEMM's with the backend's rules."""

    records: Mapping[str, type[KernelKnobs]]  # kernel kind -> its record
    level: type[ProgramLevel] | None = None  # the whole program's record, if any

    def fit_gemm(self, knobs: KernelKnobs, policy: str) -> KernelKnobs:
        raise NotImplementedError

    def fit(self, program: Program, knobs: ProgramKnobs, policy: str) -> ProgramKnobs:
        for name, kv in knobs.kernels.items():
            if isinstance(kv, self.records["gemm"]):
                knobs = knobs.with_kernel(name, self.fit_gemm(kv, policy))
        return knobs

    def knobs_of(self, plan: ExpertPlan) -> ProgramKnobs:
        from kforge.agents.expert.plan.knobs import ProgramKnobs

        kinds = {k.name: k.kind for k in plan.kernels}
        return ProgramKnobs.from_record(plan.knobs, kinds, self.records, plan.program_knobs, self.level)


def get_backend(platform: str) -> Backend:
    """The backend of ``platform``; UnsupportedError for a platform the expert has none for."""
    entry = BACKENDS.get(platform)
    if entry is None:
        raise UnsupportedError(f"the expert has no {platform!r} code generator (it has: {', '.join(BACKENDS)})")
    return entry.load()


def check_storage(backend: Backend, program: Program) -> None:
    """UnsupportedError where ``program`` holds a buffer in a type ``backend`` cannot load."""
    held = sorted({b.storage for b in program.buffers.values() if b.storage} - backend.storage)
    if held:
        raise UnsupportedError(f"dtype {', '.join(held)} on the {backend.platform} backend (its kernels read "
                               f"and write {', '.join(sorted(backend.storage)) or 'no type but f32'} besides f32)")


def render_default(program: Program, platform: str, policy: str, problem_source: str) -> str:
    """``program``'s candidate for ``platform`` with round 0's knobs (coverage, tests, benchmarks)."""
    backend = get_backend(platform)
    check_storage(backend, program)
    knobs = backend.fit(program, backend.default_knobs(program, policy), policy)
    return backend.render(program, knobs, policy, problem_source)
