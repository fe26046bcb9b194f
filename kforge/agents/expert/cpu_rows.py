"""C++ for the memory-bound patterns: fused elementwise chains, row reductions (softmax,
log_softmax, sum/mean/amax/max, layernorm, rmsnorm) and the stand-alone epilogue kernel.

Every kernel is one ``extern "C"`` function over raw pointers; sizes come at run time.
"""

from __future__ import annotations

from kforge.agents.expert.cpu_chain import (
    Index,
    TensorArg,
    chain_code,
    chain_tensors,
    lane_reduce,
    omp_for,
    tensor_params,
)
from kforge.agents.expert.graph import ElementwisePattern, Operand, PointwiseOp, RowReductionPattern
from kforge.agents.expert.plans import CpuPlan

FLAT = Index(full="i", col="i", row="i")  # unused col/row in the flat form


def is_flat(ops: list[PointwiseOp]) -> bool:
    """True when no operand broadcasts by row or column: one flat loop will do."""
    return all(a.broadcast in ("full", "scalar") for op in ops for a in op.args)


def elementwise_kernel(
    name: str, ops: list[PointwiseOp], result: Operand, plan: CpuPlan, core_ptr: bool
) -> tuple[str, list[TensorArg]]:
    """``name(tensors..., [core,] out, rows, cols, nthreads)``: out = chain(...), flat or 2-D.

    With ``core_ptr`` the chain's ``core`` operand is read from ``core`` (full shape), which
    is how an unfused epilogue runs after its reduction/GEMM (in place is allowed)."""
    tensors = chain_tensors(ops)
    core_param = "const float* core, " if core_ptr else ""
    sig = (
        f'extern "C" void {name}({tensor_params(tensors)}{core_param}float* out, '
        f"int64_t rows, int64_t cols, int64_t nthreads)"
    )
    if is_flat(ops):
        body, res = chain_code(ops, result, tensors, FLAT, "core[i]", plan.simd)
        code = (
            f"{sig} {{\n  const int64_t n = rows * cols;\n  {omp_for(plan.threads, plan.simd)}\n"
            f"  for (int64_t i = 0; i < n; ++i) {{ {body} out[i] = {res}; }}\n}}\n"
        )
        return code, tensors
    idx = Index(full="r * cols + c", col="c", row="r")
    body, res = chain_code(ops, result, tensors, idx, "core[r * cols + c]", plan.simd)
    inner = "#pragma omp simd" if plan.simd else ""
    code = (
        f"{sig} {{\n  {omp_for(plan.threads)}\n  for (int64_t r = 0; r < rows; ++r) {{\n"
        f"    {inner}\n    for (int64_t c = 0; c < cols; ++c) {{ {body} out[r * cols + c] = {res}; }}\n"
        f"  }}\n}}\n"
    )
    return code, tensors


def reduction_kernel(
    name: str, pat: RowReductionPattern, plan: CpuPlan
) -> tuple[str, list[TensorArg], list[str]]:
    """``name(x, [weight,] [bias,] tensors..., out, rows, cols, ocols, nthreads)``.

    Returns the code, the epilogue tensors (when fused) and the names of the normalisation
    parameters in argument order. ``ocols`` is the output's last dimension, used to index
    epilogue operands of per-row results (sum, mean, amax, max)."""
    fused = plan.fuse_epilogue and bool(pat.epilogue)
    ops = pat.epilogue if fused else []
    result = pat.result if fused else Operand(kind="core")
    tensors = chain_tensors(ops)
    norm_params = [p for p in (pat.weight, pat.bias) if p is not None]
    norm_sig = "".join(f"const float* __restrict {c}, " for c in ("w", "b")[: len(norm_params)])
    if pat.weight is None and pat.bias is not None:
        norm_sig = "const float* __restrict b, "
    sig = (
        f'extern "C" void {name}(const float* __restrict x, {norm_sig}{tensor_params(tensors)}'
        f"float* __restrict out, int64_t rows, int64_t cols, int64_t ocols, int64_t nthreads)"
    )
    s, u = plan.simd, plan.unroll
    exp_ = "kf_exp" if s else "std::exp"
    if pat.keeps_row:
        idx = Index(full="rr * cols + cc", col="cc", row="rr")
    else:
        idx = Index(full="rr", col="rr % ocols", row="rr / ocols")
    body, res = chain_code(ops, result, tensors, idx, "core", s)
    store = f"{{ {body} {{out_at}} = {res}; }}"
    vec = "#pragma omp simd" if s else ""
    lines = ["const float* xr = x + rr * cols;"]
    if pat.keeps_row:
        lines.append("float* yr = out + rr * cols;")
    write_row = (
        f"{vec}\nfor (int64_t cc = 0; cc < cols; ++cc) {{ const float core = {{expr}}; "
        f"{store.replace('{out_at}', 'yr[cc]')} }}\n"
    )
    op = pat.op
    if op in ("sum", "mean"):
        lines.append(lane_reduce("acc", "0.0f", "A + B", "", "xr[cc]", "cols", s, u))
        scale = " / (float)cols" if op == "mean" else ""
        lines.append(f"{{ const float core = acc{scale}; {store.replace('{out_at}', 'out[rr]')} }}")
    elif op in ("amax", "max"):
        lines.append(lane_reduce("acc", "-INFINITY", "kf_max(A, B)", "", "xr[cc]", "cols", s, u))
        lines.append(f"{{ const float core = acc; {store.replace('{out_at}', 'out[rr]')} }}")
    elif op in ("softmax", "log_softmax") and plan.passes == 2:
        lines.append(_online_max_sum(s, u, exp_))
        if op == "softmax":
            lines.append("const float inv = 1.0f / ssum;")
            lines.append(write_row.replace("{expr}", f"{exp_}(xr[cc] - mx) * inv"))
        else:
            lines.append("const float lse = mx + std::log(ssum);")
            lines.append(write_row.replace("{expr}", "xr[cc] - lse"))
    elif op == "softmax":
        lines.append(lane_reduce("mx", "-INFINITY", "kf_max(A, B)", "", "xr[cc]", "cols", s, u))
        lines.append(lane_reduce(
            "ssum", "0.0f", "A + B", f"const float e = {exp_}(xr[cc] - mx); yr[cc] = e;", "e", "cols", s, u))
        lines.append("const float inv = 1.0f / ssum;")
        lines.append(write_row.replace("{expr}", "yr[cc] * inv"))
    elif op == "log_softmax":
        lines.append(lane_reduce("mx", "-INFINITY", "kf_max(A, B)", "", "xr[cc]", "cols", s, u))
        lines.append(lane_reduce("ssum", "0.0f", "A + B", "", f"{exp_}(xr[cc] - mx)", "cols", s, u))
        lines.append("const float lse = mx + std::log(ssum);")
        lines.append(write_row.replace("{expr}", "xr[cc] - lse"))
    else:
        lines.append(_norm_stats(pat, plan))
        affine = "(xr[cc] - mean) * rstd"
        if pat.weight is not None:
            affine += " * w[cc]"
        if pat.bias is not None:
            affine += " + b[cc]"
        lines.append(write_row.replace("{expr}", affine))
    row_body = "\n".join(lines).replace("\n", "\n    ")
    code = (
        f"{sig} {{\n  {omp_for(plan.threads)}\n  for (int64_t rr = 0; rr < rows; ++rr) {{\n"
        f"    {row_body}\n  }}\n}}\n"
    )
    return code, tensors, norm_params


def _online_max_sum(simd: bool, unroll: int, exp_: str) -> str:
    """One read of the row: running max ``mx`` and rescaled sum ``ssum`` per lane."""
    upd = (
        "{ const float mn = kf_max(M, v); S = S * " + exp_ + "(M - mn) + " + exp_ + "(v - mn); M = mn; }"
    )
    if not simd:
        return (
            "float mx = -INFINITY, ssum = 0.0f;\n"
            "for (int64_t cc = 0; cc < cols; ++cc) { const float v = xr[cc]; "
            + upd.replace("M", "mx").replace("S", "ssum") + " }\n"
        )
    lanes = 8 * unroll
    return (
        f"float m_l[{lanes}], s_l[{lanes}];\n"
        f"for (int l = 0; l < {lanes}; ++l) {{ m_l[l] = -INFINITY; s_l[l] = 0.0f; }}\n"
        f"int64_t c0 = 0;\n"
        f"for (; c0 + {lanes} <= cols; c0 += {lanes}) {{\n"
        f"  #pragma omp simd\n"
        f"  for (int l = 0; l < {lanes}; ++l) {{ const float v = xr[c0 + l]; "
        + upd.replace("M", "m_l[l]").replace("S", "s_l[l]") + " }\n}\n"
        f"float mx = -INFINITY;\n"
        f"for (int l = 0; l < {lanes}; ++l) mx = kf_max(mx, m_l[l]);\n"
        f"float ssum = 0.0f;\n"
        f"for (int l = 0; l < {lanes}; ++l) ssum += m_l[l] == -INFINITY ? 0.0f : s_l[l] * std::exp(m_l[l] - mx);\n"
        f"for (int64_t cc = c0; cc < cols; ++cc) {{ const float v = xr[cc]; "
        + upd.replace("M", "mx").replace("S", "ssum") + " }\n"
    )


def _norm_stats(pat: RowReductionPattern, plan: CpuPlan) -> str:
    """``mean`` and ``rstd`` of the row (layernorm: biased variance; rmsnorm: mean = 0)."""
    s, u = plan.simd, plan.unroll
    eps = f"{float(pat.eps)!r}f"
    if pat.op == "rmsnorm":
        return (
            lane_reduce("sq", "0.0f", "A + B", "", "xr[cc] * xr[cc]", "cols", s, u)
            + f"const float mean = 0.0f;\nconst float rstd = 1.0f / std::sqrt(sq / (float)cols + {eps});\n"
        )
    if plan.passes == 2:  # one read: shifted sum and sum of squares together
        lanes = 8 * u if s else 1
        vec = "#pragma omp simd" if s else ""
        return (
            "const float shift = cols > 0 ? xr[0] : 0.0f;\n"
            f"float a1[{lanes}], a2[{lanes}];\n"
            f"for (int l = 0; l < {lanes}; ++l) {{ a1[l] = 0.0f; a2[l] = 0.0f; }}\n"
            "int64_t c0 = 0;\n"
            f"for (; c0 + {lanes} <= cols; c0 += {lanes}) {{\n"
            f"  {vec}\n"
            f"  for (int l = 0; l < {lanes}; ++l) {{ const float d = xr[c0 + l] - shift; "
            "a1[l] += d; a2[l] += d * d; }\n}\n"
            "float s1 = 0.0f, s2 = 0.0f;\n"
            f"for (int l = 0; l < {lanes}; ++l) {{ s1 += a1[l]; s2 += a2[l]; }}\n"
            "for (int64_t cc = c0; cc < cols; ++cc) { const float d = xr[cc] - shift; s1 += d; s2 += d * d; }\n"
            "const double dm = (double)s1 / (double)cols;\n"
            "const float mean = (float)(dm + shift);\n"
            "const float var = (float)((double)s2 / (double)cols - dm * dm);\n"
            f"const float rstd = 1.0f / std::sqrt((var > 0.0f ? var : 0.0f) + {eps});\n"
        )
    return (
        lane_reduce("s1", "0.0f", "A + B", "", "xr[cc]", "cols", s, u)
        + "const float mean = s1 / (float)cols;\n"
        + lane_reduce("s2", "0.0f", "A + B", "const float d = xr[cc] - mean;", "d * d", "cols", s, u)
        + f"const float rstd = 1.0f / std::sqrt(s2 / (float)cols + {eps});\n"
    )


def elementwise_pattern_kernel(pat: ElementwisePattern, plan: CpuPlan) -> tuple[str, list[TensorArg]]:
    return elementwise_kernel("kf_elementwise", pat.ops, pat.result, plan, core_ptr=False)
