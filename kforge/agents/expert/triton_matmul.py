"""Triton GEMM template for a :class:`~.kernels.GemmKernel`: strided operands, fused epilogue.

``out[b, m, n] = epilogue(sum_k A[b, m, k] * B[b, k, n])``; A and B are read through the
strides the planner found (a transposed ``nn.Linear`` weight, a batch, a broadcast operand
are all just strides), tiles are GROUP_M-swizzled, the K loop accumulates in fp32 and the
epilogue's stores run on the finished tile. Precision modes (the ``precision`` knob)::

    ieee     fp32 x fp32, exact fp32 FMA (no tensor cores)                  strict
    tf32x3   fp32, error-compensated TF32 (3 tensor-core passes, ~1e-6)     strict
    tf32     fp32 rounded to TF32 (10-bit mantissa, ~1e-3)                  relaxed
    bf16     operands rounded to bf16, fp32 accumulate (~1e-2)              relaxed
    bf16x3   hi/lo bf16 split: hi*hi + hi*lo + lo*hi (~1e-5)                relaxed

The CPU interpreter's bf16 ``tl.dot`` is wrong (Triton 3.9), so under ``TRITON_INTERPRET=1``
bf16 products are computed as fp32 products of the bf16-rounded operands: the same
arithmetic, checkable on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy

from kforge.agents.expert.candidate import py_expr
from kforge.agents.expert.kernels import GemmKernel, Program
from kforge.agents.expert.triton_expr import TritonEmitter

STRICT_PRECISIONS = ("tf32x3", "ieee")
RELAXED_PRECISIONS = ("bf16", "tf32", "bf16x3", "tf32x3", "ieee")
SMEM_LIMIT = 232448  # bytes of shared memory a Triton program may use on the H100/H200


class PlanError(ValueError):
    """Knobs the kernel or the precision policy does not allow."""


def allowed_precisions(policy: str) -> tuple[str, ...]:
    if policy == "strict":
        return STRICT_PRECISIONS
    if policy == "relaxed":
        return RELAXED_PRECISIONS
    raise PlanError(f"unknown precision policy {policy!r}: 'strict' or 'relaxed'")


def default_gemm_knobs(program: Program, k: GemmKernel, policy: str) -> dict[str, Any]:
    relaxed = policy == "relaxed"
    knobs = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64 if relaxed else 32, "GROUP_M": 8,
             "num_warps": 8, "num_stages": 3, "precision": "bf16" if relaxed else "tf32x3"}
    m, n = program.hint(k.m), program.hint(k.n)
    if m <= 64 or n <= 64:  # skinny: smaller tiles keep more programs busy
        knobs.update(BLOCK_M=64 if m > 64 else 32, BLOCK_N=64 if n > 64 else 32, num_warps=4)
    return fit_shared_memory(knobs)


def check_knobs(knobs: dict[str, Any], policy: str) -> dict[str, Any]:
    if knobs["precision"] not in allowed_precisions(policy):
        raise PlanError(f"precision {knobs['precision']!r} is not allowed under the {policy} policy "
                        f"(allowed: {', '.join(allowed_precisions(policy))})")
    for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
        v = knobs[key]
        if not isinstance(v, int) or v < 16 or v & (v - 1):
            raise PlanError(f"{key} must be a power of two >= 16, got {v!r}")
    return fit_shared_memory(knobs)


def gemm_smem_bytes(knobs: dict[str, Any]) -> int:
    return int(knobs["num_stages"]) * (knobs["BLOCK_M"] + knobs["BLOCK_N"]) * knobs["BLOCK_K"] * 4


def fit_shared_memory(knobs: dict[str, Any], limit: int = SMEM_LIMIT,
                      smem_bytes: Callable[[dict[str, Any]], int] = gemm_smem_bytes) -> dict[str, Any]:
    """Fewer stages (down to 2), then a shorter BLOCK_K, until the pipeline fits ``limit``
    (``smem_bytes`` says what a tile configuration needs)."""
    fitted = dict(knobs)
    while smem_bytes(fitted) > limit:
        if fitted["num_stages"] > 2:
            fitted["num_stages"] -= 1
        elif fitted["BLOCK_K"] > 16:
            fitted["BLOCK_K"] //= 2
        else:
            raise PlanError(f"GEMM tiles {knobs} cannot fit {limit} bytes of shared memory")
    return fitted


def _bf16_dot(x: str, y: str) -> list[str]:
    return ["if INTERPRETED:",
            f"    acc = tl.dot({x}.to(tl.float32), {y}.to(tl.float32), acc, input_precision='ieee')",
            "else:",
            f"    acc = tl.dot({x}, {y}, acc)"]


def loop_body(precision: str) -> list[str]:
    if precision not in ("bf16", "bf16x3"):
        return [f"acc = tl.dot(a, b, acc, input_precision={precision!r})"]
    lines = ["a_hi = a.to(tl.bfloat16)", "b_hi = b.to(tl.bfloat16)"]
    if precision == "bf16x3":
        lines += ["a_lo = (a - a_hi.to(tl.float32)).to(tl.bfloat16)",
                  "b_lo = (b - b_hi.to(tl.float32)).to(tl.bfloat16)"]
        lines += _bf16_dot("a_hi", "b_lo") + _bf16_dot("a_lo", "b_hi")
    return lines + _bf16_dot("a_hi", "b_hi")


def gemm_kernel(k: GemmKernel, knobs: dict[str, Any], policy: str) -> tuple[str, list[str]]:
    from kforge.agents.expert.triton_render import Args, _resolver

    args = Args()
    args.buffer(k.a.buffer)
    args.buffer(k.b.buffer)
    for st in k.stores:
        args.collect(st.index, st.value)
        args.buffer(st.buffer)
    sizes = {n: args.size(v) for n, v in (("M", k.m), ("N", k.n), ("K", k.k))}

    def stride(e: Any) -> str:
        return str(e.v) if e.op == "const" else args.size(e.v)

    sa = [stride(e) for e in k.a.strides]
    sb = [stride(e) for e in k.b.strides]
    oa, ob = stride(k.a.offset), stride(k.b.offset)
    emit = TritonEmitter(_resolver(args, {"e0": "bb", "e1": "rm2", "e2": "rn2"}, {"acc": "acc"}), "out_mask")
    stores = [f"    tl.store({st.buffer} + {emit.index(st.index)}, {emit(st.value)}, mask=out_mask)" for st in k.stores]
    body = "\n".join("        " + line for line in loop_body(knobs["precision"]))
    M, N, K = sizes["M"], sizes["N"], sizes["K"]
    src = f"""@triton.jit
def {k.name}({args.params()},
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, INTERPRETED: tl.constexpr):
    pid = tl.program_id(0)
    bb = tl.program_id(1).to(tl.int64)
    num_m = tl.cdiv({M}, BLOCK_M)
    num_n = tl.cdiv({N}, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = {k.a.buffer} + {oa} + bb * {sa[0]} + (rm % {M}).to(tl.int64)[:, None] * {sa[1]} + rk[None, :] * {sa[2]}
    b_ptrs = {k.b.buffer} + {ob} + bb * {sb[0]} + rk[:, None] * {sb[1]} + (rn % {N}).to(tl.int64)[None, :] * {sb[2]}
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, {K}, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=rk[None, :] < {K} - k0, other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < {K} - k0, other=0.0)
{body}
        a_ptrs += BLOCK_K * {sa[2]}
        b_ptrs += BLOCK_K * {sb[1]}
    rm2 = rm.to(tl.int64)[:, None]
    rn2 = rn.to(tl.int64)[None, :]
    out_mask = (rm2 < {M}) & (rn2 < {N})
{chr(10).join(emit.lines)}
{chr(10).join(stores)}"""
    bm, bn, bk = knobs["BLOCK_M"], knobs["BLOCK_N"], knobs["BLOCK_K"]
    batch = py_expr(k.batch) if k.batch is not None else "1"
    grid = f"(triton.cdiv({py_expr(k.m)}, {bm}) * triton.cdiv({py_expr(k.n)}, {bn}), {batch})"
    even = f"({py_expr(k.k)}) % {bk} == 0" if not sympy.sympify(k.k).is_Integer else str(int(k.k) % bk == 0)
    launch = [f"{k.name}[{grid}]({args.launch_args()}, BLOCK_M={bm}, BLOCK_N={bn}, BLOCK_K={bk}, "
              f"GROUP_M={knobs['GROUP_M']}, EVEN_K={even}, INTERPRETED=_INTERPRETED, "
              f"num_warps={knobs['num_warps']}, num_stages={knobs['num_stages']})"]
    return src, launch
