"""CUDA templates for the expert's ``elementwise`` and ``row_reduction`` patterns.

Each ``*_parts(ir, knobs, cvars)`` returns :class:`CudaParts`: kernel + host launcher text for
``CUDA_SOURCE`` (a standalone TU: raw pointers, run-time sizes, a ``cudaStream_t``), the
launcher's declaration and the body of the torch wrapper for ``CPP_SOURCE``. ``cvars`` maps
each tensor name to the wrapper's contiguous, checked ``torch::Tensor`` variable.

    elementwise     grid-stride loop; with ``vector_width`` 4 and 16-byte aligned full-size
                    operands, float4 loads/stores and a scalar tail (any numel)
    row_reduction   one block (``block_size`` threads) per row, grid-stride over rows; warp
                    shuffles then one value per warp through shared memory; float4 row
                    access when ``cols % 4 == 0`` and the pointers are aligned; softmax and
                    log_softmax in 3 passes or, with ``online_softmax``, an online
                    (max, sum) pass plus the write pass; layernorm mean then centred
                    variance (no cancellation); epilogue fused into the write
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kforge.agents.expert.cuda_pointwise import chain_function, cpp_chain_checks
from kforge.agents.expert.graph import ElementwisePattern, KernelGraph, RowReductionPattern


@dataclass(frozen=True)
class CudaParts:
    cuda: str  # kernels + launcher (goes after the prelude in CUDA_SOURCE)
    decl: str  # the launcher's declaration, for CPP_SOURCE
    wrapper: str  # statements of kf_forward: defines `out` and launches
    summary: str


def ptr(cvar: str) -> str:
    return f"{cvar}.data_ptr<float>()"


# --------------------------------------------------------------------------- elementwise


def elementwise_parts(ir: KernelGraph, knobs: dict[str, Any], cvars: dict[str, str]) -> CudaParts:
    pattern = ir.pattern
    assert isinstance(pattern, ElementwisePattern)
    chain, sig = chain_function(pattern.ops, pattern.result)
    if not sig.tensors:
        from kforge.agents.expert.errors import UnsupportedError

        raise UnsupportedError("an elementwise chain that reads no tensor")
    bs, vw = knobs["block_size"], knobs["vector_width"]
    rc = (
        "const int64_t r_ = e / cols; const int64_t c_ = e - r_ * cols; "
        if sig.needs_row_col
        else ""
    )
    # float4 lanes: one division per 4 elements, then (row, col) stepped along the row.
    lanes = ["            int64_t r_ = i / cols, c_ = i - r_ * cols;"] if sig.needs_row_col else []
    for lane, comp in enumerate("xyzw"):
        fulls = {t.name: f"l_{t.var}.{comp}" for t in sig.fulls}
        lanes.append(f"            r.{comp} = {sig.call('0.0f', 'e', 'r_', 'c_', fulls)};")
        if sig.needs_row_col and lane < 3:
            lanes.append("            if (++c_ == cols) { c_ = 0; ++r_; }")
    loads4 = "".join(
        f"            const float4 l_{t.var} = reinterpret_cast<const float4*>({t.var})[j];\n"
        for t in sig.fulls
    )
    scalar_call = sig.call("0.0f", "e", "r_", "c_")
    aligned = " && ".join(["kf_aligned16(out)"] + [f"kf_aligned16({t.var})" for t in sig.fulls])
    params = sig.kernel_params()
    cuda = f"""
{chain}
constexpr int KF_BS = {bs};

// Grid-stride over the output; VEC == 4: float4 over full-size operands, then a scalar tail.
template <int VEC>
__global__ void __launch_bounds__(KF_BS) kf_elementwise_kernel({params}float* __restrict__ out,
                                                              int64_t numel, int64_t cols) {{
    const int64_t stride = (int64_t)gridDim.x * KF_BS;
    const int64_t start = (int64_t)blockIdx.x * KF_BS + threadIdx.x;
    int64_t done = 0;
    if (VEC == 4) {{
        const int64_t n4 = numel >> 2;
        for (int64_t j = start; j < n4; j += stride) {{
            const int64_t i = j << 2;
{loads4}            float4 r;
{chr(10).join(lanes)}
            reinterpret_cast<float4*>(out)[j] = r;
        }}
        done = n4 << 2;
    }}
    for (int64_t e = done + start; e < numel; e += stride) {{
        {rc}out[e] = {scalar_call};
    }}
}}

cudaError_t kf_launch_elementwise({sig.launcher_params()}float* out, int64_t numel, int64_t cols,
                                  cudaStream_t stream) {{
    if (numel <= 0) return cudaSuccess;
    if (cols <= 0) return cudaErrorInvalidValue;
    int sms = 0;
    cudaError_t err = kf_sm_count(&sms);
    if (err != cudaSuccess) return err;
    const bool vec = {vw} == 4 && {aligned};
    const int64_t work = vec ? (numel + 3) / 4 : numel;
    int64_t blocks = (work + KF_BS - 1) / KF_BS;
    const int64_t cap = (int64_t)sms * (2048 / KF_BS) * 8;
    if (blocks > cap) blocks = cap;
    if (blocks < 1) blocks = 1;
    if (vec) kf_elementwise_kernel<4><<<(unsigned)blocks, KF_BS, 0, stream>>>({sig.kernel_args()}out, numel, cols);
    else kf_elementwise_kernel<1><<<(unsigned)blocks, KF_BS, 0, stream>>>({sig.kernel_args()}out, numel, cols);
    return cudaGetLastError();
}}
"""
    decl = (
        f"cudaError_t kf_launch_elementwise({sig.launcher_params()}float* out, int64_t numel, int64_t cols,"
        " cudaStream_t stream);"
    )
    first = cvars[sig.tensors[0].name]
    shape = "".join(
        f"    kf_shape = at::infer_size(kf_shape, {cvars[t.name]}.sizes());\n"
        for t in sig.tensors[1:]
    )
    args = "".join(f"{ptr(cvars[t.name])}, " for t in sig.tensors)
    wrapper = (
        f"    std::vector<int64_t> kf_shape = {first}.sizes().vec();\n{shape}"
        f"    torch::Tensor out = torch::empty(kf_shape, {first}.options());\n"
        "    const int64_t numel = out.numel();\n"
        "    const int64_t cols = out.dim() > 0 ? out.size(-1) : 1;\n"
        "    const int64_t rows = cols > 0 ? numel / cols : 0;\n"
        "    (void)rows;\n"
        + cpp_chain_checks(sig, cvars, "numel", "rows", "cols")
        + f"    kf_check_launch(kf_launch_elementwise({args}{ptr('out')}, numel, cols,\n"
        '        at::cuda::getCurrentCUDAStream()), "kf_elementwise_kernel");\n'
    )
    summary = f"fused elementwise chain of {len(pattern.ops)} ops (block {bs}, vector {vw})"
    return CudaParts(cuda, decl, wrapper, summary)


# --------------------------------------------------------------------------- row reductions

ROW_HELPERS = r"""
constexpr int KF_RB = {block};
static_assert(KF_RB % 32 == 0 && KF_RB <= 1024, "block_size must be a multiple of 32, <= 1024");

__device__ __forceinline__ float kf_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float kf_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = kf_maximum(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Block-wide reductions: every thread gets the result. The leading barrier keeps a previous
// call's readers of `red` from racing with this call's writers.
__device__ __forceinline__ float kf_block_sum(float v, float* red) {
    v = kf_warp_sum(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (threadIdx.x & 31) < KF_RB / 32 ? red[threadIdx.x & 31] : 0.0f;
    return kf_warp_sum(v);
}
__device__ __forceinline__ float kf_block_max(float v, float* red) {
    v = kf_warp_max(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (threadIdx.x & 31) < KF_RB / 32 ? red[threadIdx.x & 31] : -INFINITY;
    return kf_warp_max(v);
}
// Online softmax statistics: running max m and sum s of exp(x - m).
__device__ __forceinline__ void kf_online_add(float& m, float& s, float v) {
    if (v > m) { s = s * expf(m - v) + 1.0f; m = v; }
    else if (v != -INFINITY) s += expf(v - m);
}
__device__ __forceinline__ void kf_online_merge(float& m, float& s, float m2, float s2) {
    const float mn = fmaxf(m, m2);
    const float a = m == -INFINITY ? 0.0f : s * expf(m - mn);
    const float b = m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mn);
    m = mn;
    s = a + b;
}
__device__ __forceinline__ void kf_block_online(float& m, float& s, float* red_m, float* red_s) {
    for (int o = 16; o > 0; o >>= 1)
        kf_online_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) { red_m[threadIdx.x >> 5] = m; red_s[threadIdx.x >> 5] = s; }
    __syncthreads();
    const bool live = (threadIdx.x & 31) < KF_RB / 32;
    m = live ? red_m[threadIdx.x & 31] : -INFINITY;
    s = live ? red_s[threadIdx.x & 31] : 0.0f;
    for (int o = 16; o > 0; o >>= 1)
        kf_online_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
}
// f(c, x[c]) for this thread's columns; VEC == 4 needs a 16-byte aligned row.
template <int VEC, typename F>
__device__ __forceinline__ void kf_row_visit(const float* __restrict__ xr, int64_t cols, F&& f) {
    int64_t done = 0;
    if (VEC == 4) {
        const int64_t n4 = cols >> 2;
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        for (int64_t j = threadIdx.x; j < n4; j += KF_RB) {
            const float4 v = x4[j];
            const int64_t c = j << 2;
            f(c, v.x); f(c + 1, v.y); f(c + 2, v.z); f(c + 3, v.w);
        }
        done = n4 << 2;
    }
    for (int64_t c = done + threadIdx.x; c < cols; c += KF_RB) f(c, xr[c]);
}
// outr[c] = g(c, x[c]) for this thread's columns; VEC == 4 needs both rows aligned.
template <int VEC, typename G>
__device__ __forceinline__ void kf_row_map(const float* __restrict__ xr, float* __restrict__ outr,
                                           int64_t cols, G&& g) {
    int64_t done = 0;
    if (VEC == 4) {
        const int64_t n4 = cols >> 2;
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        float4* o4 = reinterpret_cast<float4*>(outr);
        for (int64_t j = threadIdx.x; j < n4; j += KF_RB) {
            const float4 v = x4[j];
            const int64_t c = j << 2;
            float4 r;
            r.x = g(c, v.x); r.y = g(c + 1, v.y); r.z = g(c + 2, v.z); r.w = g(c + 3, v.w);
            o4[j] = r;
        }
        done = n4 << 2;
    }
    for (int64_t c = done + threadIdx.x; c < cols; c += KF_RB) outr[c] = g(c, xr[c]);
}
"""

# Statistics for each op, then either `core` for the row (reductions) or `value` (the
# per-element expression of v at column c, row-shaped ops).
_STATS = {
    "sum": (
        "float acc = 0.0f;\nkf_row_visit<VEC>(xr, cols, [&](int64_t, float v) { acc += v; });\n"
        "const float core = kf_block_sum(acc, kf_red);",
        None,
    ),
    "mean": (
        "float acc = 0.0f;\nkf_row_visit<VEC>(xr, cols, [&](int64_t, float v) { acc += v; });\n"
        "const float core = kf_block_sum(acc, kf_red) / (float)cols;",
        None,
    ),
    "amax": (
        "float acc = -INFINITY;\n"
        "kf_row_visit<VEC>(xr, cols, [&](int64_t, float v) { acc = kf_maximum(acc, v); });\n"
        "const float core = kf_block_max(acc, kf_red);",
        None,
    ),
    "softmax3": (
        "float mx = -INFINITY;\n"
        "kf_row_visit<VEC>(xr, cols, [&](int64_t, float v) { mx = kf_maximum(mx, v); });\n"
        "mx = kf_block_max(mx, kf_red);\n"
        "float sm = 0.0f;\n"
        "kf_row_visit<VEC>(xr, cols, [&](int64_t, float v) { sm += expf(v - mx); });\n"
        "sm = kf_block_sum(sm, kf_red);",
        "{final}",
    ),
    "softmax_online": (
        "float mx = -INFINITY, sm = 0.0f;\n"
        "kf_row_visit<VEC>(xr, cols, [&](int64_t, float v) { kf_online_add(mx, sm, v); });\n"
        "kf_block_online(mx, sm, kf_red, kf_red2);",
        "{final}",
    ),
    "layernorm": (
        "float acc = 0.0f;\nkf_row_visit<VEC>(xr, cols, [&](int64_t, float v) { acc += v; });\n"
        "const float mean = kf_block_sum(acc, kf_red) / (float)cols;\n"
        "float sq = 0.0f;\n"
        "kf_row_visit<VEC>(xr, cols, [&](int64_t, float v) { const float d = v - mean; sq += d * d; });\n"
        "const float rstd = 1.0f / sqrtf(kf_block_sum(sq, kf_red) / (float)cols + eps);",
        "(v - mean) * rstd{affine}",
    ),
    "rmsnorm": (
        "float sq = 0.0f;\nkf_row_visit<VEC>(xr, cols, [&](int64_t, float v) { sq += v * v; });\n"
        "const float rstd = 1.0f / sqrtf(kf_block_sum(sq, kf_red) / (float)cols + eps);",
        "v * rstd{affine}",
    ),
}
_FINAL = {"softmax": "expf(v - mx) / sm", "log_softmax": "(v - mx) - logf(sm)"}


def _indent(text: str, spaces: int) -> str:
    return "\n".join(" " * spaces + line if line else line for line in text.split("\n"))


def row_reduction_parts(ir: KernelGraph, knobs: dict[str, Any], cvars: dict[str, str]) -> CudaParts:
    pattern = ir.pattern
    assert isinstance(pattern, RowReductionPattern)
    op = "amax" if pattern.op == "max" else pattern.op
    online = bool(knobs.get("online_softmax", 0))
    key = op if op not in _FINAL else ("softmax_online" if online else "softmax3")
    stats, value = _STATS[key]
    chain, sig = chain_function(pattern.epilogue, pattern.result)
    affine = ("* w[c]" if pattern.weight else "") + (" + b[c]" if pattern.bias else "")
    if pattern.keeps_row:
        assert value is not None
        expr = value.format(final=_FINAL.get(op, ""), affine=f" {affine}" if affine else "")
        call = sig.call(expr, "row * cols + c", "row", "c")
        write = f"kf_row_map<VEC>(xr, out + row * cols, cols, [&](int64_t c, float v) {{ return {call}; }});"
    else:
        call = sig.call("core", "row", "o_row", "o_col")
        write = (
            "if (threadIdx.x == 0) {\n"
            "    const int64_t o_row = row / out_cols, o_col = row - o_row * out_cols;\n"
            "    (void)o_row; (void)o_col;\n"
            f"    out[row] = {call};\n"
            "}"
        )
    wb_params = ("const float* __restrict__ w, " if pattern.weight else "") + (
        "const float* __restrict__ b, " if pattern.bias else ""
    )
    wb_args = ("w, " if pattern.weight else "") + ("b, " if pattern.bias else "")
    params = sig.kernel_params()
    body = _indent(stats + "\n" + write, 8)
    out_aligned = " && kf_aligned16(out)" if pattern.keeps_row else ""
    decl_wb = ("const float* w, " if pattern.weight else "") + (
        "const float* b, " if pattern.bias else ""
    )
    cuda = (
        ROW_HELPERS.replace("{block}", str(knobs["block_size"]))
        + f"""
{chain}
// One block per row (grid-stride over rows): row {pattern.op}, epilogue fused.
template <int VEC>
__global__ void __launch_bounds__(KF_RB) kf_row_kernel(const float* __restrict__ x, {wb_params}{params}
        float* __restrict__ out, int64_t rows, int64_t cols, int64_t out_cols, float eps) {{
    __shared__ float kf_red[32];
    __shared__ float kf_red2[32];
    (void)kf_red2; (void)eps; (void)out_cols;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {{
        const float* __restrict__ xr = x + row * cols;
{body}
    }}
}}

cudaError_t kf_launch_row({decl_wb}const float* x, {sig.launcher_params()}float* out, int64_t rows,
                          int64_t cols, int64_t out_cols, float eps, cudaStream_t stream) {{
    if (rows <= 0) return cudaSuccess;
    if (out_cols <= 0) return cudaErrorInvalidValue;
    const bool vec = {knobs["vector_width"]} == 4 && cols % 4 == 0 && kf_aligned16(x){out_aligned};
    const unsigned blocks = (unsigned)(rows < (1 << 30) ? rows : (1 << 30));
    if (vec) kf_row_kernel<4><<<blocks, KF_RB, 0, stream>>>(x, {wb_args}{sig.kernel_args()}out, rows, cols, out_cols, eps);
    else kf_row_kernel<1><<<blocks, KF_RB, 0, stream>>>(x, {wb_args}{sig.kernel_args()}out, rows, cols, out_cols, eps);
    return cudaGetLastError();
}}
"""
    )
    decl = (
        f"cudaError_t kf_launch_row({decl_wb}const float* x, {sig.launcher_params()}float* out, int64_t rows,"
        " int64_t cols, int64_t out_cols, float eps, cudaStream_t stream);"
    )
    x = cvars[pattern.input]
    if pattern.keeps_row:
        out_shape = f"{x}.sizes().vec()"
    else:
        out_shape = f"std::vector<int64_t>({x}.sizes().begin(), {x}.sizes().end() - 1)"
    keepdim = "    kf_shape.push_back(1);\n" if pattern.keepdim and not pattern.keeps_row else ""
    wb_check = "".join(
        f'    kf_check_numel({cvars[n]}, cols, "{n}");\n'
        for n in (pattern.weight, pattern.bias)
        if n
    )
    wb_ptrs = "".join(f"{ptr(cvars[n])}, " for n in (pattern.weight, pattern.bias) if n)
    chain_ptrs = "".join(f"{ptr(cvars[t.name])}, " for t in sig.tensors)
    wrapper = (
        f'    TORCH_CHECK({x}.dim() >= 1, "{pattern.input} must have at least one dimension");\n'
        f"    const int64_t cols = {x}.size(-1);\n"
        "    int64_t rows = 1;  // product of the leading dimensions (right even when cols == 0)\n"
        f"    for (int64_t d = 0; d + 1 < {x}.dim(); ++d) rows *= {x}.size(d);\n"
        f"    std::vector<int64_t> kf_shape = {out_shape};\n{keepdim}"
        f"    torch::Tensor out = torch::empty(kf_shape, {x}.options());\n"
        "    const int64_t out_cols = out.dim() > 0 ? out.size(-1) : 1;\n"
        "    const int64_t out_rows = out_cols > 0 ? out.numel() / out_cols : 0;\n"
        "    (void)out_rows;\n"
        + (f"    if (rows > 0) {{\n    {wb_check.strip()}\n    }}\n" if wb_check else "")
        + cpp_chain_checks(sig, cvars, "out.numel()", "out_rows", "out_cols")
        + f"    kf_check_launch(kf_launch_row({wb_ptrs}{ptr(x)}, {chain_ptrs}{ptr('out')}, rows, cols,\n"
        f'        out_cols, {float(pattern.eps)!r}f, at::cuda::getCurrentCUDAStream()), "kf_row_kernel");\n'
    )
    how = (
        "online softmax"
        if key == "softmax_online"
        else "3-pass"
        if key == "softmax3"
        else "block per row"
    )
    summary = (
        f"row {pattern.op} ({how}, block {knobs['block_size']}, vector {knobs['vector_width']}), "
        f"epilogue of {len(pattern.epilogue)} ops fused"
    )
    return CudaParts(cuda, decl, wrapper, summary)
