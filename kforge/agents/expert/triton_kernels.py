"""Triton kernel templates for the expert's three patterns (source text + launcher).

Each ``*_source(ir, knobs)`` returns ``(source, summary)``: one ``@triton.jit`` kernel and a
``launch(<forward inputs>, <params>)`` function that allocates the output, computes the grid
from the *runtime* shapes and launches. :mod:`kforge.agents.expert.triton_codegen` wraps it
in a module with ``ModelNew``. Pointwise chains come from
:mod:`kforge.agents.expert.triton_pointwise`.
"""

from __future__ import annotations

from typing import Any

from kforge.agents.expert.graph import (
    ElementwisePattern,
    GemmPattern,
    KernelGraph,
    RowReductionPattern,
    UnsupportedError,
)
from kforge.agents.expert.triton_pointwise import IndexVars, chain_tensors, emit_chain, pointer_arg


def _launch_params(ir: KernelGraph) -> list[str]:
    return [t.name for t in ir.inputs] + [pointer_arg(p.name) for p in ir.params]


def _arg(ir: KernelGraph, name: str) -> str:
    """The launcher's variable for tensor ``name`` (forward input or parameter)."""
    return name if any(t.name == name for t in ir.inputs) else pointer_arg(name)


def _chain_ptr_args(ir: KernelGraph, names: list[str]) -> tuple[str, str]:
    """(kernel parameter list, launcher argument list) for the chain's extra tensors."""
    params = "".join(f"{pointer_arg(n)}, " for n in names)
    args = "".join(f"{_arg(ir, n)}.contiguous(), " for n in names)
    return params, args


# --------------------------------------------------------------------------- elementwise


def elementwise_source(ir: KernelGraph, knobs: dict[str, Any]) -> tuple[str, str]:
    pattern = ir.pattern
    assert isinstance(pattern, ElementwisePattern)
    names = chain_tensors(pattern.ops, pattern.result)
    if not names:
        raise UnsupportedError("an elementwise chain that reads no tensor")
    idx = IndexVars(flat="offs", row="rows_i", col="cols_i", mask="mask")
    lines, result = emit_chain(pattern.ops, pattern.result, idx, core=None)
    body = "\n".join(lines)
    need_rc = "rows_i" in body or "cols_i" in body
    kparams, kargs = _chain_ptr_args(ir, names)
    src = f'''
@triton.jit
def fused_elementwise_kernel({kparams}out_ptr, numel, n_cols, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
{"    rows_i = offs // n_cols" + chr(10) + "    cols_i = offs % n_cols" if need_rc else "    # every operand is full-size or scalar: no row/column index needed"}
{body}
    tl.store(out_ptr + offs, {result}, mask=mask)


def launch({", ".join(_launch_params(ir))}):
    shape = torch.broadcast_shapes({", ".join(f"{_arg(ir, n)}.shape" for n in names)},)
    out = torch.empty(shape, device={_arg(ir, names[0])}.device, dtype=torch.float32)
    numel = out.numel()
    n_cols = shape[-1] if len(shape) else 1
    grid = (triton.cdiv(numel, {knobs["BLOCK"]}),)
    fused_elementwise_kernel[grid]({kargs}out, numel, n_cols, BLOCK={knobs["BLOCK"]}, num_warps={knobs["num_warps"]})
    return out
'''
    return src, f"fused elementwise chain of {len(pattern.ops)} ops, one pass"


# --------------------------------------------------------------------------- row reductions

_SINGLE = {
    "softmax": """    x = tl.load(x_row + c, mask=m, other=float('-inf'))
    e = tl.where(m, tl.exp(x - tl.max(x, axis=0)), 0.0)
    core = e / tl.sum(e, axis=0)""",
    "log_softmax": """    x = tl.load(x_row + c, mask=m, other=float('-inf'))
    z = x - tl.max(x, axis=0)
    core = z - tl.log(tl.sum(tl.where(m, tl.exp(z), 0.0), axis=0))""",
    "sum": "    core = tl.sum(tl.load(x_row + c, mask=m, other=0.0), axis=0)",
    "mean": "    core = tl.sum(tl.load(x_row + c, mask=m, other=0.0), axis=0) / n_cols",
    "amax": "    core = tl.max(tl.load(x_row + c, mask=m, other=float('-inf')), axis=0)",
    "layernorm": """    x = tl.load(x_row + c, mask=m, other=0.0)
    mean = tl.sum(x, axis=0) / n_cols
    d = tl.where(m, x - mean, 0.0)
    rstd = tl.rsqrt(tl.sum(d * d, axis=0) / n_cols + eps)
    core = d * rstd{affine}""",
    "rmsnorm": """    x = tl.load(x_row + c, mask=m, other=0.0)
    core = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps){affine}""",
}

# Chunked: statistics over BLOCK_N-wide chunks first, then (for row-shaped results) a last
# pass that recomputes each chunk's output; ``{chunk}`` marks where that pass goes.
_LOOP = {
    "softmax": """    m_vec = tl.full((BLOCK_N,), float('-inf'), tl.float32)
    s_vec = tl.zeros((BLOCK_N,), tl.float32)
    for c0 in range(0, n_cols, BLOCK_N):
        x = tl.load(x_row + c0 + cb, mask=c0 + cb < n_cols, other=float('-inf'))
        new_m = tl.maximum(m_vec, x)
        safe = tl.where(new_m == float('-inf'), 0.0, new_m)
        s_vec = s_vec * tl.exp(m_vec - safe) + tl.exp(x - safe)
        m_vec = new_m
    mx = tl.max(m_vec, axis=0)
    total = tl.sum(tl.where(m_vec == float('-inf'), 0.0, s_vec * tl.exp(m_vec - mx)), axis=0)
    for c0 in range(0, n_cols, BLOCK_N):
        c = c0 + cb
        m = c < n_cols
        x = tl.load(x_row + c, mask=m, other=float('-inf'))
        core = {final}
{chunk}""",
    "sum": """    acc = tl.zeros((BLOCK_N,), tl.float32)
    for c0 in range(0, n_cols, BLOCK_N):
        acc += tl.load(x_row + c0 + cb, mask=c0 + cb < n_cols, other=0.0)
    core = tl.sum(acc, axis=0){scale}""",
    "amax": """    acc = tl.full((BLOCK_N,), float('-inf'), tl.float32)
    for c0 in range(0, n_cols, BLOCK_N):
        acc = tl.maximum(acc, tl.load(x_row + c0 + cb, mask=c0 + cb < n_cols, other=float('-inf')))
    core = tl.max(acc, axis=0)""",
    "layernorm": """    acc = tl.zeros((BLOCK_N,), tl.float32)
    for c0 in range(0, n_cols, BLOCK_N):
        acc += tl.load(x_row + c0 + cb, mask=c0 + cb < n_cols, other=0.0)
    mean = tl.sum(acc, axis=0) / n_cols
    acc = tl.zeros((BLOCK_N,), tl.float32)
    for c0 in range(0, n_cols, BLOCK_N):
        x = tl.load(x_row + c0 + cb, mask=c0 + cb < n_cols, other=0.0)
        d = tl.where(c0 + cb < n_cols, x - mean, 0.0)
        acc += d * d
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
    for c0 in range(0, n_cols, BLOCK_N):
        c = c0 + cb
        m = c < n_cols
        x = tl.load(x_row + c, mask=m, other=0.0)
        core = (x - mean) * rstd{affine}
{chunk}""",
    "rmsnorm": """    acc = tl.zeros((BLOCK_N,), tl.float32)
    for c0 in range(0, n_cols, BLOCK_N):
        x = tl.load(x_row + c0 + cb, mask=c0 + cb < n_cols, other=0.0)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
    for c0 in range(0, n_cols, BLOCK_N):
        c = c0 + cb
        m = c < n_cols
        x = tl.load(x_row + c, mask=m, other=0.0)
        core = x * rstd{affine}
{chunk}""",
}


def _indent(text: str, spaces: int) -> str:
    return "\n".join((" " * spaces + line) if line.strip() else line for line in text.split("\n"))


def row_reduction_source(ir: KernelGraph, knobs: dict[str, Any]) -> tuple[str, str]:
    pattern = ir.pattern
    assert isinstance(pattern, RowReductionPattern)
    op = "amax" if pattern.op == "max" else pattern.op
    block = knobs["BLOCK_N"]
    single = block >= pattern.cols
    affine = (" * tl.load(w_ptr + c, mask=m, other=0.0)" if pattern.weight else "") + (
        " + tl.load(b_ptr + c, mask=m, other=0.0)" if pattern.bias else ""
    )
    names = chain_tensors(pattern.epilogue, pattern.result)
    if pattern.keeps_row:
        idx = IndexVars(flat="row * n_cols + c", row="row", col="c", mask="m")
    else:
        idx = IndexVars(flat="row", row="row // out_cols", col="row % out_cols", mask="ok")
    chain_lines, result = emit_chain(pattern.epilogue, pattern.result, idx, core="core")
    if pattern.keeps_row:
        store = "\n".join([*chain_lines, f"    tl.store(out_ptr + row * n_cols + c, {result}, mask=m)"])
    else:
        store = "\n".join(["    ok = row < n_rows", *chain_lines, f"    tl.store(out_ptr + row, {result})"])
    if single:
        stats = _SINGLE[op].format(affine=affine)
        body = "    c = tl.arange(0, BLOCK_N)\n    m = c < n_cols\n" + stats + "\n" + store
    else:
        loop_op = {"mean": "sum", "log_softmax": "softmax"}.get(op, op)
        if loop_op not in _LOOP:
            raise UnsupportedError(f"chunked {pattern.op} (row longer than BLOCK_N)")
        final = "tl.exp(x - mx) / total" if op == "softmax" else "x - mx - tl.log(total)"
        text = _LOOP[loop_op]
        stats = text.format(
            final=final, affine=affine, scale=" / n_cols" if op == "mean" else "", chunk=_indent(store, 4)
        )
        body = "    cb = tl.arange(0, BLOCK_N)\n" + stats + ("" if pattern.keeps_row else "\n" + store)
    kparams, kargs = _chain_ptr_args(ir, names)
    wb_params = ("w_ptr, " if pattern.weight else "") + ("b_ptr, " if pattern.bias else "")
    wb_args = (f"{_arg(ir, pattern.weight)}.contiguous(), " if pattern.weight else "") + (
        f"{_arg(ir, pattern.bias)}.contiguous(), " if pattern.bias else ""
    )
    if pattern.keeps_row:
        out_shape = "x.shape"
    else:
        out_shape = "x.shape[:-1] + (1,)" if pattern.keepdim else "x.shape[:-1]"
    xname = pattern.input
    src = f'''
@triton.jit
def row_{op}_kernel(x_ptr, {wb_params}{kparams}out_ptr, n_rows, n_cols, out_cols, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * n_cols
{body}


def launch({", ".join(_launch_params(ir))}):
    x = {xname}.contiguous()
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols
    out = torch.empty({out_shape}, device=x.device, dtype=torch.float32)
    out_cols = out.shape[-1] if out.dim() else 1
    row_{op}_kernel[(n_rows,)](x, {wb_args}{kargs}out, n_rows, n_cols, out_cols, {float(pattern.eps)!r},
                              BLOCK_N={block}, num_warps={knobs["num_warps"]})
    return out
'''
    how = "one tile per row" if single else f"chunks of {block}"
    return src, f"row {pattern.op} ({how}), epilogue of {len(pattern.epilogue)} ops fused"


# --------------------------------------------------------------------------- GEMM


def gemm_source(ir: KernelGraph, knobs: dict[str, Any]) -> tuple[str, str]:
    pattern = ir.pattern
    assert isinstance(pattern, GemmPattern)
    names = chain_tensors(pattern.epilogue, pattern.result)
    idx = IndexVars(flat="flat", row="rm2", col="rn2", mask="out_mask")
    chain_lines, result = emit_chain(pattern.epilogue, pattern.result, idx, core="core", indent="    ")
    bias_param = "bias_ptr, " if pattern.bias else ""
    bias_arg = f"{_arg(ir, pattern.bias)}.contiguous(), " if pattern.bias else ""
    bias_line = (
        "    core = acc + tl.load(bias_ptr + rn, mask=rn < N, other=0.0)[None, :]"
        if pattern.bias
        else "    core = acc"
    )
    kparams, kargs = _chain_ptr_args(ir, names)
    precision = knobs["precision"]
    if precision == "bf16":
        # The CPU interpreter's bf16 dot is broken (Triton 3.9): there, round operands to bf16
        # and multiply exactly in fp32, which is the same arithmetic as a bf16 tensor-core dot.
        dot = (
            "if INTERPRETED:\n"
            "            acc = tl.dot(a.to(tl.bfloat16).to(tl.float32), b.to(tl.bfloat16).to(tl.float32), acc, input_precision='ieee')\n"
            "        else:\n"
            "            acc = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)"
        )
    else:
        dot = f"acc = tl.dot(a, b, acc, input_precision={precision!r})"
    b_strides = "b.stride(1), b.stride(0)" if pattern.b_layout == "nk" else "b.stride(0), b.stride(1)"
    n_expr = "b.shape[0]" if pattern.b_layout == "nk" else "b.shape[1]"
    bm, bn, bk = knobs["BLOCK_M"], knobs["BLOCK_N"], knobs["BLOCK_K"]
    src = f'''
@triton.jit
def gemm_epilogue_kernel(a_ptr, b_ptr, {bias_param}{kparams}out_ptr, M, N, K,
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
    # Rows/columns past the edge are clamped (wrapped) for loads and masked at the store.
    a_ptrs = a_ptr + (rm % M)[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + (rn % N)[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=rk[None, :] < K - k0, other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < K - k0, other=0.0)
        {dot}
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
{bias_line}
    rm2 = rm.to(tl.int64)[:, None]
    rn2 = rn[None, :]
    flat = rm2 * N + rn2
    out_mask = (rm2 < M) & (rn2 < N)
{chr(10).join(chain_lines)}
    tl.store(out_ptr + flat, {result}, mask=out_mask)


def launch({", ".join(_launch_params(ir))}):
    a2 = {pattern.a}.reshape(-1, {pattern.a}.shape[-1])
    b = {_arg(ir, pattern.b)}
    M, K = a2.shape
    N = {n_expr}
    out = torch.empty({pattern.a}.shape[:-1] + (N,), device=a2.device, dtype=torch.float32)
    grid = (triton.cdiv(M, {bm}) * triton.cdiv(N, {bn}),)
    gemm_epilogue_kernel[grid](a2, b, {bias_arg}{kargs}out, M, N, K,
                               a2.stride(0), a2.stride(1), {b_strides},
                               BLOCK_M={bm}, BLOCK_N={bn}, BLOCK_K={bk}, GROUP_M={knobs["GROUP_M"]},
                               EVEN_K=(K % {bk} == 0), INTERPRETED=_INTERPRETED, num_warps={knobs["num_warps"]},
                               num_stages={knobs["num_stages"]})
    return out
'''
    summary = f"GEMM {bm}x{bn}x{bk} ({precision}) + bias/epilogue of {len(pattern.epilogue)} ops fused"
    return src, summary
