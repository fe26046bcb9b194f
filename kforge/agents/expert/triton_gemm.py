"""Triton GEMM + fused epilogue template for the expert's ``gemm`` pattern.

``out = epilogue(A @ B + bias)`` with ``B`` either an ``nn.Linear`` weight ``[N, K]``
(``nk``) or a plain ``[K, N]`` operand (``kn``); both are read through strides. Precision
modes (the ``precision`` plan key) and the operands each ``tl.dot`` sees::

    ieee     fp32 x fp32, exact fp32 FMA (no tensor cores)                  strict
    tf32x3   fp32, error-compensated TF32 (3 tensor-core passes, ~1e-6)     strict
    tf32     fp32 rounded to TF32 (10-bit mantissa, ~1e-3)                  relaxed
    bf16     operands rounded to bf16, fp32 accumulate (~1e-2)              relaxed
    bf16x3   hi/lo bf16 split: hi*hi + hi*lo + lo*hi (~1e-5)                relaxed

With ``precast`` (bf16 modes), a small Triton kernel writes the bf16 hi (and lo) operands
once per call, so the GEMM streams half the bytes and the tensor cores read bf16 tiles
straight from shared memory; otherwise the split happens on each tile in registers.
The CPU interpreter's bf16 ``tl.dot`` is wrong (Triton 3.9), so under ``TRITON_INTERPRET=1``
bf16 products are computed as exact fp32 products of the bf16-rounded operands: the same
arithmetic, checkable on a CPU.
"""

from __future__ import annotations

from typing import Any

from kforge.agents.expert.graph import GemmPattern, KernelGraph
from kforge.agents.expert.triton_pointwise import IndexVars, chain_tensors, emit_chain, pointer_arg

BF16_MODES = ("bf16", "bf16x3")


def _arg(ir: KernelGraph, name: str) -> str:
    return name if any(t.name == name for t in ir.inputs) else pointer_arg(name)


def _bf16_dot(x: str, y: str) -> list[str]:
    return [
        "if INTERPRETED:",
        f"    acc = tl.dot({x}.to(tl.float32), {y}.to(tl.float32), acc, input_precision='ieee')",
        "else:",
        f"    acc = tl.dot({x}, {y}, acc)",
    ]


def _loop_body(precision: str, precast: bool) -> list[str]:
    """Lines (8-space indent) after ``a``/``b`` (and ``a_lo``/``b_lo``) are loaded."""
    if precision not in BF16_MODES:
        return [f"acc = tl.dot(a, b, acc, input_precision={precision!r})"]
    lines = []
    if not precast:
        lines += ["a_hi = a.to(tl.bfloat16)", "b_hi = b.to(tl.bfloat16)"]
        if precision == "bf16x3":
            lines += [
                "a_lo = (a - a_hi.to(tl.float32)).to(tl.bfloat16)",
                "b_lo = (b - b_hi.to(tl.float32)).to(tl.bfloat16)",
            ]
    else:
        lines += ["a_hi = a", "b_hi = b"]
    if precision == "bf16x3":  # small terms first
        lines += _bf16_dot("a_hi", "b_lo") + _bf16_dot("a_lo", "b_hi")
    lines += _bf16_dot("a_hi", "b_hi")
    return lines


_SPLIT_KERNEL = """
@triton.jit
def split_bf16_kernel(x_ptr, hi_ptr, lo_ptr, numel, WITH_LO: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    hi = x.to(tl.bfloat16)
    tl.store(hi_ptr + offs, hi, mask=mask)
    if WITH_LO:
        tl.store(lo_ptr + offs, (x - hi.to(tl.float32)).to(tl.bfloat16), mask=mask)


def split_bf16(x, with_lo):
    x = x.contiguous()
    hi = torch.empty(x.shape, device=x.device, dtype=torch.bfloat16)
    lo = torch.empty(x.shape, device=x.device, dtype=torch.bfloat16) if with_lo else hi
    grid = (triton.cdiv(x.numel(), 4096),)
    split_bf16_kernel[grid](x, hi, lo, x.numel(), WITH_LO=with_lo, BLOCK=4096, num_warps=8)
    return hi, lo
"""


def gemm_source(ir: KernelGraph, knobs: dict[str, Any]) -> tuple[str, str]:
    pattern = ir.pattern
    assert isinstance(pattern, GemmPattern)
    precision = knobs["precision"]
    precast = bool(knobs.get("precast", 0)) and precision in BF16_MODES
    split = precision == "bf16x3" and precast
    names = chain_tensors(pattern.epilogue, pattern.result)
    idx = IndexVars(flat="flat", row="rm2", col="rn2", mask="out_mask")
    chain_lines, result = emit_chain(pattern.epilogue, pattern.result, idx, core="core")
    kparams = "".join(f"{pointer_arg(n)}, " for n in names)
    kargs = "".join(f"{_arg(ir, n)}.contiguous(), " for n in names)
    bias_param = "bias_ptr, " if pattern.bias else ""
    bias_arg = f"{_arg(ir, pattern.bias)}.contiguous(), " if pattern.bias else ""
    bias_line = (
        "    core = acc + tl.load(bias_ptr + rn, mask=rn < N, other=0.0)[None, :]"
        if pattern.bias
        else "    core = acc"
    )
    lo_params = "a_lo_ptr, b_lo_ptr, " if split else ""
    loads_even = ["a = tl.load(a_ptrs)", "b = tl.load(b_ptrs)"]
    loads_mask = [
        "a = tl.load(a_ptrs, mask=rk[None, :] < K - k0, other=0.0)",
        "b = tl.load(b_ptrs, mask=rk[:, None] < K - k0, other=0.0)",
    ]
    if split:
        loads_even += ["a_lo = tl.load(a_lo_ptrs)", "b_lo = tl.load(b_lo_ptrs)"]
        loads_mask += [
            "a_lo = tl.load(a_lo_ptrs, mask=rk[None, :] < K - k0, other=0.0)",
            "b_lo = tl.load(b_lo_ptrs, mask=rk[:, None] < K - k0, other=0.0)",
        ]
    body = _loop_body(precision, precast)
    lo_ptr_init = (
        "    a_lo_ptrs = a_lo_ptr + (rm % M)[:, None] * stride_am + rk[None, :] * stride_ak\n"
        "    b_lo_ptrs = b_lo_ptr + rk[:, None] * stride_bk + (rn % N)[None, :] * stride_bn\n"
        if split
        else ""
    )
    lo_advance = (
        "        a_lo_ptrs += BLOCK_K * stride_ak\n        b_lo_ptrs += BLOCK_K * stride_bk\n"
        if split
        else ""
    )
    b_strides = (
        "b_op.stride(1), b_op.stride(0)"
        if pattern.b_layout == "nk"
        else "b_op.stride(0), b_op.stride(1)"
    )
    n_expr = "b.shape[0]" if pattern.b_layout == "nk" else "b.shape[1]"
    bm, bn, bk = knobs["BLOCK_M"], knobs["BLOCK_N"], knobs["BLOCK_K"]
    if precast:
        prep = (
            f"    a_op, a_lo = split_bf16(a2, {split})\n    b_op, b_lo = split_bf16(b, {split})\n"
        )
        operands = "a_op, b_op, " + ("a_lo, b_lo, " if split else "")
    else:
        prep = "    a_op, b_op = a2, b\n"
        operands = "a_op, b_op, "
    ind8 = "\n".join("            " + line for line in loads_even)
    ind8m = "\n".join("            " + line for line in loads_mask)
    dots = "\n".join("        " + line for line in body)
    src = f"""
@triton.jit
def gemm_epilogue_kernel(a_ptr, b_ptr, {lo_params}{bias_param}{kparams}out_ptr, M, N, K,
                         stride_am, stride_ak, stride_bk, stride_bn,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, INTERPRETED: tl.constexpr):
    # GROUP_M-swizzled program order: consecutive programs share B tiles while in L2.
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    # Rows/columns past the edge are wrapped for loads and masked at the store.
    a_ptrs = a_ptr + (rm % M)[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + (rn % N)[None, :] * stride_bn
{lo_ptr_init}    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
{ind8}
        else:
{ind8m}
{dots}
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
{lo_advance}{bias_line}
    rm2 = rm.to(tl.int64)[:, None]
    rn2 = rn[None, :]
    flat = rm2 * N + rn2
    out_mask = (rm2 < M) & (rn2 < N)
{chr(10).join(chain_lines)}
    tl.store(out_ptr + flat, {result}, mask=out_mask)
{_SPLIT_KERNEL if precast else ""}

def launch({", ".join([t.name for t in ir.inputs] + [pointer_arg(p.name) for p in ir.params])}):
    a2 = {pattern.a}.reshape(-1, {pattern.a}.shape[-1])
    b = {_arg(ir, pattern.b)}
    M, K = a2.shape
    N = {n_expr}
{prep}    out = torch.empty({pattern.a}.shape[:-1] + (N,), device=a2.device, dtype=torch.float32)
    grid = (triton.cdiv(M, {bm}) * triton.cdiv(N, {bn}),)
    gemm_epilogue_kernel[grid]({operands}{bias_arg}{kargs}out, M, N, K,
                               a_op.stride(0), a_op.stride(1), {b_strides},
                               BLOCK_M={bm}, BLOCK_N={bn}, BLOCK_K={bk}, GROUP_M={knobs["GROUP_M"]},
                               EVEN_K=(K % {bk} == 0), INTERPRETED=_INTERPRETED,
                               num_warps={knobs["num_warps"]}, num_stages={knobs["num_stages"]})
    return out
"""
    how = f"{precision}{' precast' if precast else ''}"
    summary = f"GEMM {bm}x{bn}x{bk} ({how}) + bias/epilogue of {len(pattern.epilogue)} ops fused"
    return src, summary
