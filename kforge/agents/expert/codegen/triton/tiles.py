"""The Triton GEMM's tiles per precision step, and their fit to the H100's registers and
shared memory (:class:`~kforge.agents.expert.plan.knobs.TritonGemm` records).

Each step of the ladder (:mod:`kforge.agents.expert.plan.precision`) brings its own tiles, from
H200 / H100 sweeps of 1024 x 8192 x 8192 GEMMs + epilogue (``benchmarks/results/
gemm_epilogue_h200.md``, ``gemm_ladder_h100_bregs.md``, ``gemm_ladder_h200.md``), and whether its
B operand (the weight) is rounded in registers (``b_regs``): on the H100, bf16 with b_regs at
256x128x64 ran 0.34 ms against 0.375 ms for the best precast plan, 1024 x 8192 x 8192 (the
weight's per-call pass is gone); bf16x2 / bf16x3 lost with it (twice the in-register
splitting per tile). fp16x3 (lo scaled, 128 x 128 x 64) won with it on the H100: 0.848-1.162 ms
against 0.907-1.253 ms precast, on 001, 020, 045 and 048 (``gemm_fp16x3_scaled_h100.md``).
``tma`` follows ``b_regs`` (host TMA descriptors for the register path: 0.281 against 0.360 ms a
call for 001 relaxed on the H100, ``call_overhead_gpu.md``).

The split steps' two accumulators take 128 x 128 tiles at 8 warps (:func:`fit_registers`: at
most :data:`ACC_REGS_LIMIT` accumulator registers a thread); a pipeline that does not fit
:data:`SMEM_LIMIT` loses stages, then BLOCK_K (:func:`fit_shared_memory`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from kforge.agents.expert.codegen.triton.args import next_pow2
from kforge.agents.expert.errors import PlanError
from kforge.agents.expert.plan.knobs import TritonGemm
from kforge.agents.expert.plan.precision import LADDER, STEPS, Step, check_allowed, first_step

SMEM_LIMIT = 232448  # bytes of shared memory a Triton program may use on the H100/H200
# fp32 accumulator registers a thread may hold: a 128 x 256 tile over 8 warps is 128 (Hopper's
# wgmma keeps the accumulator in registers; twice that spills)
ACC_REGS_LIMIT = 128


class Tile(NamedTuple):
    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    num_warps: int
    num_stages: int
    b_regs: int  # the weight rounded [and split] in registers (A precast only)


STEP_TILES: dict[str, Tile] = {
    "bf16": Tile(256, 128, 64, 8, 3, 1),
    "fp16": Tile(256, 128, 64, 8, 3, 1),  # fp16: bf16's tiles (same rate, same bytes; not swept)
    "bf16x2": Tile(128, 256, 64, 8, 3, 0),
    "fp16x2": Tile(128, 128, 64, 8, 3, 0),  # split fp16 steps: two accumulators, half bf16x3's tile
    "tf32": Tile(128, 256, 32, 8, 3, 0),
    "bf16x3": Tile(128, 256, 32, 8, 3, 0),
    "fp16x3": Tile(128, 128, 64, 8, 3, 1),
    "tf32x3": Tile(128, 64, 32, 4, 4, 0),
    "ieee": Tile(128, 128, 32, 8, 3, 0),
}
assert set(STEP_TILES) == set(STEPS), "every step of the ladder has its Triton tiles"
TRITON_STEPS = tuple(s.name for s in LADDER)  # the Triton GEMM renders every step


def at_step(knobs: TritonGemm, step: Step, m: int, n: int) -> TritonGemm:
    """``knobs`` moved to ``step`` with that step's tiles (a new step is a new kernel)."""
    t = STEP_TILES[step.name]
    out = dataclasses.replace(knobs, precision=step.name, BLOCK_M=t.BLOCK_M, BLOCK_N=t.BLOCK_N, BLOCK_K=t.BLOCK_K,
                              num_warps=t.num_warps, num_stages=t.num_stages, precast=1,
                              b_regs=0 if knobs.gather else t.b_regs, tma=0 if knobs.gather else t.b_regs)
    if knobs.gather:  # an implicit GEMM (a conv): tall M, N = the output channels
        out = dataclasses.replace(out, **gather_tile(m, n))
    elif m <= 64 or n <= 64:  # skinny: smaller tiles keep more programs busy
        out = dataclasses.replace(out, BLOCK_M=64 if m > 64 else 32, BLOCK_N=64 if n > 64 else 32, num_warps=4)
    return fit_shared_memory(fit_registers(out))


def gather_tile(m: int, n: int) -> dict[str, int]:
    """An implicit GEMM's tile: every gathered A element is loaded once per BLOCK_N columns, so
    BLOCK_N spans the output channels (up to 128); 128 rows, a K step of 32 (the fp32 A tile is
    staged in shared memory and rounded in registers)."""
    bn = min(max(next_pow2(n), 16), 128)
    bm = 128 if m > 64 else 64
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 32, "num_warps": 8 if bm * bn >= 128 * 128 else 4,
            "num_stages": 3}


def default_gemm(policy: str, m: int, n: int) -> TritonGemm:
    """Round 0's step for the policy (the verifier decides whether it is enough)."""
    start = first_step(policy, TRITON_STEPS)
    t = STEP_TILES[start.name]
    base = TritonGemm(GROUP_M=8, precast=1, precision=start.name, BLOCK_M=t.BLOCK_M, BLOCK_N=t.BLOCK_N,
                      BLOCK_K=t.BLOCK_K, num_warps=t.num_warps, num_stages=t.num_stages, b_regs=t.b_regs, tma=t.b_regs)
    return at_step(base, start, m, n)


def check(knobs: TritonGemm, policy: str) -> TritonGemm:
    """``knobs`` under the policy, fitted to registers and shared memory (PlanError otherwise).
    A gathered A (``gather``) is rounded in registers itself, so B is precast, not ``b_regs``."""
    check_allowed(knobs.precision, policy, TRITON_STEPS)
    if knobs.gather and (knobs.b_regs or knobs.tma):
        knobs = dataclasses.replace(knobs, b_regs=0, tma=0)
    return fit_shared_memory(fit_registers(knobs))


def acc_regs(knobs: TritonGemm) -> int:
    """fp32 accumulator registers per thread: the tile over the program's threads, twice for a
    split fp16 step (lo products in an accumulator of their own)."""
    accumulators = 2 if STEPS[knobs.precision].scaled_lo else 1
    return accumulators * knobs.BLOCK_M * knobs.BLOCK_N // (32 * knobs.num_warps)


def fit_registers(knobs: TritonGemm, limit: int = ACC_REGS_LIMIT) -> TritonGemm:
    """The larger of BLOCK_M / BLOCK_N halved until the accumulators fit ``limit`` registers
    a thread (a tile that spills its accumulator runs at a fraction of the tensor cores' rate)."""
    fitted = knobs
    while acc_regs(fitted) > limit and max(fitted.BLOCK_M, fitted.BLOCK_N) > 16:
        if fitted.BLOCK_N >= fitted.BLOCK_M:
            fitted = dataclasses.replace(fitted, BLOCK_N=fitted.BLOCK_N // 2)
        else:
            fitted = dataclasses.replace(fitted, BLOCK_M=fitted.BLOCK_M // 2)
    return fitted


def b_in_registers(knobs: TritonGemm) -> bool:
    """The ``b_regs`` knob in effect: a 16-bit step with A precast."""
    return bool(knobs.b_regs) and bool(knobs.precast) and STEPS[knobs.precision].parts is not None


def operand_bytes(knobs: TritonGemm) -> tuple[int, int]:
    """Bytes per element that one pipeline stage holds for A and for B."""
    s = STEPS[knobs.precision]
    if s.parts is not None and knobs.precast:
        split_a, split_b = s.split
        return (4 if split_a or knobs.gather else 2), (4 if split_b or knobs.b_regs else 2)
    return 4, 4


def gemm_smem_bytes(knobs: TritonGemm) -> int:
    ea, eb = operand_bytes(knobs)
    return knobs.num_stages * (knobs.BLOCK_M * ea + knobs.BLOCK_N * eb) * knobs.BLOCK_K


def fit_shared_memory(knobs: TritonGemm, limit: int = SMEM_LIMIT) -> TritonGemm:
    """Fewer stages (down to 2), then a shorter BLOCK_K, until the pipeline fits ``limit``."""
    fitted = knobs
    while gemm_smem_bytes(fitted) > limit:
        if fitted.num_stages > 2:
            fitted = dataclasses.replace(fitted, num_stages=fitted.num_stages - 1)
        elif fitted.BLOCK_K > 16:
            fitted = dataclasses.replace(fitted, BLOCK_K=fitted.BLOCK_K // 2)
        else:
            raise PlanError(f"GEMM tiles {knobs.describe()} cannot fit {limit} bytes of shared memory")
    return fitted
