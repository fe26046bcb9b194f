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
    src = f"""
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
"""
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
        store = "\n".join(
            [*chain_lines, f"    tl.store(out_ptr + row * n_cols + c, {result}, mask=m)"]
        )
    else:
        store = "\n".join(
            ["    ok = row < n_rows", *chain_lines, f"    tl.store(out_ptr + row, {result})"]
        )
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
            final=final,
            affine=affine,
            scale=" / n_cols" if op == "mean" else "",
            chunk=_indent(store, 4),
        )
        body = (
            "    cb = tl.arange(0, BLOCK_N)\n" + stats + ("" if pattern.keeps_row else "\n" + store)
        )
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
    src = f"""
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
"""
    how = "one tile per row" if single else f"chunks of {block}"
    return src, f"row {pattern.op} ({how}), epilogue of {len(pattern.epilogue)} ops fused"
