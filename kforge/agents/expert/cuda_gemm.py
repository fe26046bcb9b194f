"""CUDA GEMM + fused bias/epilogue templates for the expert's ``gemm`` pattern.

``out[M, N] = epilogue(A[M, K] @ B + bias)`` with ``B`` an ``nn.Linear`` weight ``[N, K]``
(``nk``) or a plain ``[K, N]`` operand (``kn``), both row-major and contiguous. One block
computes a ``block_m x block_n`` tile (1-D grid, GROUP_M-swizzled so neighbouring blocks
share B tiles in L2), looping over K in ``block_k`` slices staged in shared memory; every
global load is bounds-checked (zero fill) and every store masked, so any M, N, K works.

    precision fp32   SIMT SGEMM: (block_m/thread_m) x (block_n/thread_n) threads, each a
                     thread_m x thread_n register micro-tile (rows/columns strided by the
                     thread grid: conflict-free shared reads, coalesced stores), fp32 FMA
                     accumulate: exact fp32 arithmetic, allowed under ``strict``
    precision tf32   ``nvcuda::wmma`` m16n16k8 TF32 tensor-core MMA with fp32 accumulate
                     (operands rounded to TF32 when staged; ``relaxed`` only): warps own
                     warp_m x warp_n sub-tiles; the accumulators go through a per-warp
                     shared scratch so bias + epilogue + bounds checks are per element
"""

from __future__ import annotations

from typing import Any

from kforge.agents.expert.cuda_kernels import CudaParts, ptr
from kforge.agents.expert.cuda_pointwise import chain_function, cpp_chain_checks
from kforge.agents.expert.graph import GemmPattern, KernelGraph

SMEM_LIMIT = 48 * 1024  # static shared memory per block

TILE_COORDS = r"""
constexpr int KF_GROUP_M = 8;
// GROUP_M-swizzled tile order over a 1-D grid.
__device__ __forceinline__ void kf_tile_coords(int64_t M, int64_t N, int64_t& m0, int64_t& n0) {
    const int64_t num_m = (M + KF_BM - 1) / KF_BM, num_n = (N + KF_BN - 1) / KF_BN;
    const int64_t pid = blockIdx.x;
    const int64_t group = (int64_t)KF_GROUP_M * num_n;
    const int64_t first_m = (pid / group) * KF_GROUP_M;
    const int64_t size_m = (num_m - first_m) < KF_GROUP_M ? (num_m - first_m) : KF_GROUP_M;
    const int64_t local = pid % group;
    m0 = (first_m + local % size_m) * KF_BM;
    n0 = (local / size_m) * KF_BN;
}
"""


def smem_bytes(knobs: dict[str, Any], b_layout: str) -> int:
    """Static shared memory the chosen kernel declares (checked against SMEM_LIMIT)."""
    bm, bn, bk = knobs["block_m"], knobs["block_n"], knobs["block_k"]
    if knobs.get("precision", "fp32") == "tf32":
        warps = (bm // knobs["warp_m"]) * (bn // knobs["warp_n"])
        b_tile = bn * (bk + 4) if b_layout == "nk" else bk * (bn + 4)
        return 4 * (bm * (bk + 4) + b_tile + warps * 256)
    return 4 * bk * (bm + 1 + bn + 1)


def threads(knobs: dict[str, Any]) -> int:
    if knobs.get("precision", "fp32") == "tf32":
        return 32 * (knobs["block_m"] // knobs["warp_m"]) * (knobs["block_n"] // knobs["warp_n"])
    return (knobs["block_m"] // knobs["thread_m"]) * (knobs["block_n"] // knobs["thread_n"])


def _b_load_simt(layout: str) -> str:
    if layout == "nk":  # B[n, k]: consecutive threads read consecutive k
        return """            const int n = idx / KF_BK, kk = idx % KF_BK;
            const int64_t gn = n0 + n, gk = k0 + kk;
            Bs[kk][n] = (gn < N && gk < K) ? B[gn * K + gk] : 0.0f;"""
    return """            const int kk = idx / KF_BN, n = idx % KF_BN;
            const int64_t gn = n0 + n, gk = k0 + kk;
            Bs[kk][n] = (gn < N && gk < K) ? B[gk * N + gn] : 0.0f;"""


def _simt_kernel(knobs: dict[str, Any], layout: str, head: str, store: str) -> str:
    return f"""
constexpr int KF_TM = {knobs["thread_m"]}, KF_TN = {knobs["thread_n"]};
constexpr int KF_TX = KF_BN / KF_TN, KF_TY = KF_BM / KF_TM, KF_NT = KF_TX * KF_TY;
{TILE_COORDS}
__global__ void __launch_bounds__(KF_NT) kf_gemm_kernel({head}) {{
    __shared__ float As[KF_BK][KF_BM + 1];  // A tile, k-major (odd stride: no bank conflicts)
    __shared__ float Bs[KF_BK][KF_BN + 1];
    int64_t m0, n0;
    kf_tile_coords(M, N, m0, n0);
    const int tid = threadIdx.x, tx = tid % KF_TX, ty = tid / KF_TX;
    float acc[KF_TM][KF_TN];
#pragma unroll
    for (int i = 0; i < KF_TM; ++i)
#pragma unroll
        for (int j = 0; j < KF_TN; ++j) acc[i][j] = 0.0f;
    for (int64_t k0 = 0; k0 < K; k0 += KF_BK) {{
#pragma unroll
        for (int it = 0; it < (KF_BM * KF_BK + KF_NT - 1) / KF_NT; ++it) {{
            const int idx = tid + it * KF_NT;
            if (idx >= KF_BM * KF_BK) break;
            const int r = idx / KF_BK, kk = idx % KF_BK;
            const int64_t gm = m0 + r, gk = k0 + kk;
            As[kk][r] = (gm < M && gk < K) ? A[gm * K + gk] : 0.0f;
        }}
#pragma unroll
        for (int it = 0; it < (KF_BN * KF_BK + KF_NT - 1) / KF_NT; ++it) {{
            const int idx = tid + it * KF_NT;
            if (idx >= KF_BN * KF_BK) break;
{_b_load_simt(layout)}
        }}
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < KF_BK; ++kk) {{
            float a[KF_TM], b[KF_TN];
#pragma unroll
            for (int i = 0; i < KF_TM; ++i) a[i] = As[kk][ty + i * KF_TY];
#pragma unroll
            for (int j = 0; j < KF_TN; ++j) b[j] = Bs[kk][tx + j * KF_TX];
#pragma unroll
            for (int i = 0; i < KF_TM; ++i)
#pragma unroll
                for (int j = 0; j < KF_TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }}
        __syncthreads();
    }}
#pragma unroll
    for (int i = 0; i < KF_TM; ++i) {{
        const int64_t gm = m0 + ty + i * KF_TY;
        if (gm >= M) continue;
#pragma unroll
        for (int j = 0; j < KF_TN; ++j) {{
            const int64_t gn = n0 + tx + j * KF_TX;
            if (gn < N) {{
                const float v = acc[i][j];
{store}
            }}
        }}
    }}
}}
"""


def _tf32_kernel(knobs: dict[str, Any], layout: str, head: str, store: str) -> str:
    if layout == "nk":  # Bs[n][k]: a col_major K x N fragment source
        b_decl = "__shared__ __align__(128) float Bs[KF_BN * KF_LDB];"
        ldb = "KF_BK + 4"
        b_load = """            const int n = idx / KF_BK, kk = idx % KF_BK;
            const int64_t gn = n0 + n, gk = k0 + kk;
            Bs[n * KF_LDB + kk] = kf_wmma::__float_to_tf32((gn < N && gk < K) ? B[gn * K + gk] : 0.0f);"""
        b_major = "kf_wmma::col_major"
        b_frag_ptr = "Bs + (wn * KF_WN + j * 16) * KF_LDB + kk"
    else:  # Bs[k][n]: row_major
        b_decl = "__shared__ __align__(128) float Bs[KF_BK * KF_LDB];"
        ldb = "KF_BN + 4"
        b_load = """            const int kk = idx / KF_BN, n = idx % KF_BN;
            const int64_t gn = n0 + n, gk = k0 + kk;
            Bs[kk * KF_LDB + n] = kf_wmma::__float_to_tf32((gn < N && gk < K) ? B[gk * N + gn] : 0.0f);"""
        b_major = "kf_wmma::row_major"
        b_frag_ptr = "Bs + kk * KF_LDB + wn * KF_WN + j * 16"
    return f"""
#include <mma.h>
namespace kf_wmma = nvcuda::wmma;
constexpr int KF_WM = {knobs["warp_m"]}, KF_WN = {knobs["warp_n"]};
constexpr int KF_WARPS_N = KF_BN / KF_WN, KF_WARPS = (KF_BM / KF_WM) * KF_WARPS_N;
constexpr int KF_NT = 32 * KF_WARPS, KF_FM = KF_WM / 16, KF_FN = KF_WN / 16;
constexpr int KF_LDA = KF_BK + 4, KF_LDB = {ldb};  // multiples of 4 floats (wmma ldm rule)
static_assert(KF_BK % 8 == 0 && KF_WM % 16 == 0 && KF_WN % 16 == 0, "wmma tile shapes");
{TILE_COORDS}
__global__ void __launch_bounds__(KF_NT) kf_gemm_kernel({head}) {{
    // Fragment pointers are 256-bit aligned: 16-row / 8-column steps of 16-byte-multiple rows.
    __shared__ __align__(128) float As[KF_BM * KF_LDA];
    {b_decl}
    __shared__ __align__(128) float Cs[KF_WARPS * 256];
    int64_t m0, n0;
    kf_tile_coords(M, N, m0, n0);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = warp / KF_WARPS_N, wn = warp % KF_WARPS_N;
    kf_wmma::fragment<kf_wmma::accumulator, 16, 16, 8, float> acc[KF_FM][KF_FN];
#pragma unroll
    for (int i = 0; i < KF_FM; ++i)
#pragma unroll
        for (int j = 0; j < KF_FN; ++j) kf_wmma::fill_fragment(acc[i][j], 0.0f);
    for (int64_t k0 = 0; k0 < K; k0 += KF_BK) {{
        for (int idx = tid; idx < KF_BM * KF_BK; idx += KF_NT) {{
            const int r = idx / KF_BK, kk = idx % KF_BK;
            const int64_t gm = m0 + r, gk = k0 + kk;
            As[r * KF_LDA + kk] = kf_wmma::__float_to_tf32((gm < M && gk < K) ? A[gm * K + gk] : 0.0f);
        }}
        for (int idx = tid; idx < KF_BN * KF_BK; idx += KF_NT) {{
{b_load}
        }}
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < KF_BK; kk += 8) {{
            kf_wmma::fragment<kf_wmma::matrix_a, 16, 16, 8, kf_wmma::precision::tf32, kf_wmma::row_major> a[KF_FM];
            kf_wmma::fragment<kf_wmma::matrix_b, 16, 16, 8, kf_wmma::precision::tf32, {b_major}> b[KF_FN];
#pragma unroll
            for (int i = 0; i < KF_FM; ++i)
                kf_wmma::load_matrix_sync(a[i], As + (wm * KF_WM + i * 16) * KF_LDA + kk, KF_LDA);
#pragma unroll
            for (int j = 0; j < KF_FN; ++j) kf_wmma::load_matrix_sync(b[j], {b_frag_ptr}, KF_LDB);
#pragma unroll
            for (int i = 0; i < KF_FM; ++i)
#pragma unroll
                for (int j = 0; j < KF_FN; ++j) kf_wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }}
        __syncthreads();
    }}
    float* cw = Cs + warp * 256;
#pragma unroll
    for (int i = 0; i < KF_FM; ++i)
#pragma unroll
        for (int j = 0; j < KF_FN; ++j) {{
            kf_wmma::store_matrix_sync(cw, acc[i][j], 16, kf_wmma::mem_row_major);
            __syncwarp();
            for (int e = lane; e < 256; e += 32) {{
                const int64_t gm = m0 + wm * KF_WM + i * 16 + (e >> 4);
                const int64_t gn = n0 + wn * KF_WN + j * 16 + (e & 15);
                if (gm < M && gn < N) {{
                    const float v = cw[e];
{store}
                }}
            }}
            __syncwarp();
        }}
}}
"""


def gemm_parts(ir: KernelGraph, knobs: dict[str, Any], cvars: dict[str, str]) -> CudaParts:
    pattern = ir.pattern
    assert isinstance(pattern, GemmPattern)
    chain, sig = chain_function(pattern.epilogue, pattern.result)
    tf32 = knobs.get("precision", "fp32") == "tf32"
    bias_param = "const float* __restrict__ bias, " if pattern.bias else ""
    bias_arg = "bias, " if pattern.bias else ""
    head = (
        f"const float* __restrict__ A, const float* __restrict__ B, {bias_param}{sig.kernel_params()}"
        "float* __restrict__ out, int64_t M, int64_t N, int64_t K"
    )
    core = "v + bias[gn]" if pattern.bias else "v"
    store = (
        " " * 16
        + "const int64_t flat = gm * N + gn;\n"
        + " " * 16
        + f"out[flat] = {sig.call(core, 'flat', 'gm', 'gn')};"
    )
    layout = pattern.b_layout
    body = (_tf32_kernel if tf32 else _simt_kernel)(knobs, layout, head, store)
    decl_bias = "const float* bias, " if pattern.bias else ""
    launcher_params = (
        f"const float* A, const float* B, {decl_bias}{sig.launcher_params()}float* out, "
        "int64_t M, int64_t N, int64_t K, cudaStream_t stream"
    )
    cuda = f"""
{chain}
constexpr int KF_BM = {knobs["block_m"]}, KF_BN = {knobs["block_n"]}, KF_BK = {knobs["block_k"]};
{body}
cudaError_t kf_launch_gemm({launcher_params}) {{
    if (M <= 0 || N <= 0) return cudaSuccess;
    const int64_t tiles = ((M + KF_BM - 1) / KF_BM) * ((N + KF_BN - 1) / KF_BN);
    if (tiles > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
    kf_gemm_kernel<<<(unsigned)tiles, KF_NT, 0, stream>>>(A, B, {bias_arg}{sig.kernel_args()}out, M, N, K);
    return cudaGetLastError();
}}
"""
    a, b = cvars[pattern.a], cvars[pattern.b]
    if layout == "nk":
        b_check = (
            f'    TORCH_CHECK({b}.dim() == 2 && {b}.size(1) == K, "{pattern.b} must be [N, K]");\n'
            f"    const int64_t N = {b}.size(0);\n"
        )
    else:
        b_check = (
            f'    TORCH_CHECK({b}.dim() == 2 && {b}.size(0) == K, "{pattern.b} must be [K, N]");\n'
            f"    const int64_t N = {b}.size(1);\n"
        )
    bias_check = (
        f'    kf_check_numel({cvars[pattern.bias]}, N, "{pattern.bias}");\n' if pattern.bias else ""
    )
    bias_ptr = f"{ptr(cvars[pattern.bias])}, " if pattern.bias else ""
    chain_ptrs = "".join(f"{ptr(cvars[t.name])}, " for t in sig.tensors)
    wrapper = (
        f'    TORCH_CHECK({a}.dim() >= 1, "{pattern.a} must have at least one dimension");\n'
        f"    const int64_t K = {a}.size(-1);\n"
        "    int64_t M = 1;  // rows: product of the leading dimensions (right even when K == 0)\n"
        f"    for (int64_t d = 0; d + 1 < {a}.dim(); ++d) M *= {a}.size(d);\n"
        + b_check
        + bias_check
        + f"    std::vector<int64_t> kf_shape({a}.sizes().begin(), {a}.sizes().end() - 1);\n"
        "    kf_shape.push_back(N);\n"
        f"    torch::Tensor out = torch::empty(kf_shape, {a}.options());\n"
        + cpp_chain_checks(sig, cvars, "out.numel()", "M", "N")
        + f"    kf_check_launch(kf_launch_gemm({ptr(a)}, {ptr(b)}, {bias_ptr}{chain_ptrs}{ptr('out')},\n"
        '        M, N, K, at::cuda::getCurrentCUDAStream()), "kf_gemm_kernel");\n'
    )
    decl = f"cudaError_t kf_launch_gemm({launcher_params});"
    how = (
        f"TF32 wmma, warp tile {knobs['warp_m']}x{knobs['warp_n']}"
        if tf32
        else f"fp32 SIMT, micro-tile {knobs['thread_m']}x{knobs['thread_n']}"
    )
    summary = (
        f"GEMM {knobs['block_m']}x{knobs['block_n']}x{knobs['block_k']} ({how}) "
        f"+ bias/epilogue of {len(pattern.epilogue)} ops fused"
    )
    return CudaParts(cuda, decl, wrapper, summary)
