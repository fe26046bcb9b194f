"""The knobs of a candidate: frozen, validated records per backend and kernel kind.

    backend   per kernel                                              whole candidate
    triton    TritonPointwise  BLOCK num_warps                        TritonProgram  cuda_graph
              TritonRow        BLOCK_O BLOCK_R num_warps
              TritonScan       BLOCK_S num_warps
              TritonGemm       GROUP_M precast precision BLOCK_M/N/K num_warps num_stages b_regs tma
                               gather
    cpu       (none)                                                  CpuKnobs  fast chunk col_block
                                                                                par_min mr nr kc mc nc
    cuda      CudaPointwise    threads
              CudaRow          threads (per row; 1: a thread per row) rows (per block)
              CudaScan         threads (per row)
              CudaGemm         precision block_m/n/k thread_m/n warp_m/n

A record is built by its backend's ``default_knobs`` (the round-0 values, which the GPU
results depend on) and changed only through :meth:`Knobs.with_params` (an analysis action's
params; an alias such as a row kernel's ``BLOCK_N`` for ``BLOCK_R`` is resolved here) or
:func:`dataclasses.replace`; every construction validates, and a value a kernel cannot take is
a :class:`~kforge.agents.expert.errors.PlanError` naming the knob. The plan record carries the
records as JSON (:meth:`Knobs.to_json`, field order kept: the Triton candidate's header prints
it), and the next round reads them back with :meth:`Knobs.from_json` over the defaults.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Self

from kforge.agents.expert.errors import PlanError
from kforge.agents.expert.plan.precision import STEPS

JSON = int | float | str | bool


@dataclass(frozen=True)
class Knobs:
    """Base of every knob record: JSON in field order, params applied by name or alias."""

    ALIASES: ClassVar[Mapping[str, str]] = {}  # an analysis rule's name -> the field

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:  # each record checks its own ranges
        pass

    def to_json(self) -> dict[str, JSON]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def describe(self) -> str:
        return repr(self.to_json())

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def with_params(self, params: Mapping[str, Any]) -> tuple[Self, list[str]]:
        """These knobs with ``params`` (knob names or aliases) applied, and the params' names
        that are no knob of this record (left alone, for the caller to report)."""
        changes: dict[str, Any] = {}
        unknown: list[str] = []
        names = self.names()
        for key, value in params.items():
            name = self.ALIASES.get(key, key)
            if name in names:
                changes[name] = value
            else:
                unknown.append(key)
        return (dataclasses.replace(self, **changes) if changes else self), unknown

    @classmethod
    def from_json(cls, data: Mapping[str, Any], base: Self) -> Self:
        """``base`` with the values of ``data`` it has a field for (a previous round's record)."""
        return dataclasses.replace(base, **{k: v for k, v in data.items() if k in cls.names()})

    @classmethod
    def from_record(cls, data: Mapping[str, Any]) -> Self:
        """The record a plan carries (every field there), validated."""
        try:
            return cls(**{k: v for k, v in data.items() if k in cls.names()})
        except TypeError as err:
            raise PlanError(f"{cls.__name__} from {dict(data)}: {err}") from None


def _pow2(record: Knobs, *names: str, low: int = 1, high: int = 1 << 16) -> None:
    for name in names:
        v = getattr(record, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < low or v > high or v & (v - 1):
            raise PlanError(f"{type(record).__name__}.{name} must be a power of two in {low}..{high}, got {v!r}")


def _positive(record: Knobs, *names: str) -> None:
    for name in names:
        v = getattr(record, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise PlanError(f"{type(record).__name__}.{name} must be a positive integer, got {v!r}")


def _flag(record: Knobs, *names: str) -> None:
    """0 or 1 (True / False compare equal and are kept as the integers)."""
    for name in names:
        v = getattr(record, name)
        if v not in (0, 1) or isinstance(v, float):
            raise PlanError(f"{type(record).__name__}.{name} must be 0 or 1, got {v!r}")
        object.__setattr__(record, name, int(v))


def _precision(record: Knobs) -> None:
    if record.precision not in STEPS:
        raise PlanError(f"{type(record).__name__}.precision must be a step of the ladder "
                        f"({', '.join(STEPS)}), got {record.precision!r}")


# ------------------------------------------------------------------ triton

WARPS = (1, 2, 4, 8, 16, 32)


def _warps(record: Knobs) -> None:
    if record.num_warps not in WARPS:
        raise PlanError(f"{type(record).__name__}.num_warps must be one of {WARPS}, got {record.num_warps!r}")


@dataclass(frozen=True)
class TritonPointwise(Knobs):
    BLOCK: int = 1024
    num_warps: int = 4

    def validate(self) -> None:
        _pow2(self, "BLOCK")
        _warps(self)


@dataclass(frozen=True)
class TritonRow(Knobs):
    """``BLOCK_O`` outer rows a program, the reduced space in ``BLOCK_R`` chunks."""

    ALIASES: ClassVar[Mapping[str, str]] = {"BLOCK_N": "BLOCK_R"}
    BLOCK_O: int
    BLOCK_R: int
    num_warps: int = 4

    def validate(self) -> None:
        _pow2(self, "BLOCK_O", "BLOCK_R")
        _warps(self)


@dataclass(frozen=True)
class TritonScan(Knobs):
    BLOCK_S: int
    num_warps: int = 4

    def validate(self) -> None:
        _pow2(self, "BLOCK_S")
        _warps(self)


@dataclass(frozen=True)
class TritonGemm(Knobs):
    """A GEMM's tiles and precision step (``codegen/triton/tiles.py`` fits them to the H100's
    registers and shared memory)."""

    GROUP_M: int
    precast: int
    precision: str
    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    num_warps: int
    num_stages: int
    b_regs: int
    tma: int
    gather: int = 0  # A read through its index map inside the K loop (an implicit GEMM: no prologue buffer)

    def validate(self) -> None:
        _precision(self)
        _pow2(self, "BLOCK_M", "BLOCK_N", "BLOCK_K", low=16)
        _positive(self, "GROUP_M", "num_stages")
        _warps(self)
        _flag(self, "precast", "b_regs", "tma", "gather")


@dataclass(frozen=True)
class TritonProgram(Knobs):
    """``cuda_graph``: ``forward`` replayed from a CUDA graph (``codegen/triton/graph.py``);
    ``graphable``: whether the program can be captured at all (not a knob: the analysis turns
    the graph on and off only where it can)."""

    cuda_graph: int = 0
    graphable: bool = field(default=False, metadata={"fixed": True})

    def validate(self) -> None:
        _flag(self, "cuda_graph")
        if self.cuda_graph and not self.graphable:
            raise PlanError("TritonProgram.cuda_graph is on for a program that cannot be captured "
                            "(it writes module state or takes a Python scalar)")

    def to_json(self) -> dict[str, JSON]:
        return {"cuda_graph": self.cuda_graph} if self.graphable else {}

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return ("cuda_graph",)

    def with_params(self, params: Mapping[str, Any]) -> tuple[TritonProgram, list[str]]:
        if not self.graphable:  # no graph to turn on or off
            return self, list(params)
        return super().with_params(params)

    @classmethod
    def from_record(cls, data: Mapping[str, Any]) -> TritonProgram:
        return cls(cuda_graph=data.get("cuda_graph", 0), graphable="cuda_graph" in data)


# ------------------------------------------------------------------ cpu

@dataclass(frozen=True)
class CpuKnobs(Knobs):
    """One set for every kernel of the translation unit: ``fast`` (the branch-free ``kf_*``
    math), the pointwise / row chunk, the column block of column reductions, the work below
    which a loop stays serial, and the GEMM's micro-tile (``mr`` x ``nr``) and cache blocks."""

    fast: bool = True
    chunk: int = 4096
    col_block: int = 64
    par_min: int = 16384
    mr: int = 6
    nr: int = 16
    kc: int = 256
    mc: int = 96
    nc: int = 1024

    def validate(self) -> None:
        if not isinstance(self.fast, bool):
            raise PlanError(f"CpuKnobs.fast must be True or False, got {self.fast!r}")
        _positive(self, "chunk", "col_block", "par_min", "mr", "nr", "kc", "mc", "nc")
        if self.nr % 8:
            raise PlanError(f"CpuKnobs.nr must be a multiple of 8 (AVX2 lanes), got {self.nr}")

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.to_json().items())

    @classmethod
    def for_isa(cls, isa: str) -> CpuKnobs:
        """The defaults for a host whose compiler targets ``isa``: the GEMM tile fills its
        vector registers (AVX-512: 12 rows x 2 zmm = 24 accumulators of 32; AVX2: 6 x 2 ymm)."""
        return cls(**CPU_TILES.get(isa, {}))


CPU_TILES: dict[str, dict[str, int]] = {"avx512": {"mr": 12, "nr": 32}}


# ------------------------------------------------------------------ cuda

@dataclass(frozen=True)
class CudaPointwise(Knobs):
    threads: int = 256

    def validate(self) -> None:
        _pow2(self, "threads", low=32, high=1024)


@dataclass(frozen=True)
class CudaRow(Knobs):
    """``threads`` cooperate on one outer row (a power of two >= 32; 1: each thread reduces
    a row of its own), ``rows`` rows a block."""

    threads: int
    rows: int

    def validate(self) -> None:
        if self.threads != 1:
            _pow2(self, "threads", low=32, high=1024)
        _pow2(self, "rows", high=1024)
        if not 32 <= self.threads * self.rows <= 1024:
            raise PlanError(f"CudaRow: {self.threads} threads x {self.rows} rows is {self.threads * self.rows} "
                            "threads a block; it must be 32..1024")


@dataclass(frozen=True)
class CudaScan(Knobs):
    threads: int = 256

    def validate(self) -> None:
        _pow2(self, "threads", low=32, high=1024)


@dataclass(frozen=True)
class CudaGemm(Knobs):
    """``block_m`` x ``block_n`` output tiles over ``block_k`` slices of K; ``ieee``: each
    thread a ``thread_m`` x ``thread_n`` register micro-tile of fp32 FMAs; ``tf32``: each warp a
    ``warp_m`` x ``warp_n`` tile of wmma fragments (``codegen/cuda/gemm.py`` checks the rest)."""

    precision: str
    block_m: int
    block_n: int
    block_k: int
    thread_m: int = 8
    thread_n: int = 8
    warp_m: int = 64
    warp_n: int = 32

    def validate(self) -> None:
        _precision(self)
        _pow2(self, "block_m", "block_n", low=16, high=256)
        _pow2(self, "block_k", high=128)
        _pow2(self, "thread_m", "thread_n", high=16)
        _pow2(self, "warp_m", "warp_n", low=16, high=256)


KernelKnobs = TritonPointwise | TritonRow | TritonScan | TritonGemm | CudaPointwise | CudaRow | CudaScan | CudaGemm
ProgramLevel = TritonProgram | CpuKnobs


@dataclass(frozen=True)
class ProgramKnobs:
    """A candidate's knobs: per kernel (by name, in program order) and for the whole program."""

    kernels: Mapping[str, KernelKnobs]
    program: ProgramLevel | None = None

    def with_kernel(self, name: str, knobs: KernelKnobs) -> ProgramKnobs:
        return ProgramKnobs({**self.kernels, name: knobs}, self.program)

    def with_program(self, program: ProgramLevel) -> ProgramKnobs:
        return ProgramKnobs(self.kernels, program)

    def with_params(self, record: type[KernelKnobs], params: Mapping[str, Any]) -> ProgramKnobs:
        """Every kernel's knobs of type ``record`` with ``params`` applied (a benchmark's sweep)."""
        return ProgramKnobs({name: k.with_params(params)[0] if isinstance(k, record) else k
                             for name, k in self.kernels.items()}, self.program)

    def precisions(self) -> dict[str, str]:
        """Kernel name -> its GEMM's precision step."""
        return {n: str(k.precision) for n, k in self.kernels.items() if hasattr(k, "precision")}

    def kernels_json(self) -> dict[str, dict[str, JSON]]:
        return {name: k.to_json() for name, k in self.kernels.items()}

    def program_json(self) -> dict[str, JSON]:
        return self.program.to_json() if self.program is not None else {}

    @staticmethod
    def from_record(kernels: Mapping[str, Mapping[str, Any]], kinds: Mapping[str, str],
                    records: Mapping[str, type[KernelKnobs]], program: Mapping[str, Any],
                    level: type[ProgramLevel] | None) -> ProgramKnobs:
        """A plan's knobs as the backend's records: each kernel's by its kind (``records``)."""
        parsed: dict[str, KernelKnobs] = {}
        for name, data in kernels.items():
            if kinds.get(name) not in records:
                raise PlanError(f"kernel {name} of kind {kinds.get(name)!r} has no knob record here")
            parsed[name] = records[kinds[name]].from_record(data)
        return ProgramKnobs(parsed, level.from_record(program) if level is not None else None)

    def from_json(self, kernels: Mapping[str, Any], program: Mapping[str, Any]) -> ProgramKnobs:
        """These knobs (a round's defaults) with a previous plan's values of the same kernels."""
        merged = {name: type(k).from_json(kernels.get(name) or {}, k) for name, k in self.kernels.items()}
        level = type(self.program).from_json(program, self.program) if self.program is not None else None
        return ProgramKnobs(merged, level)
