"""C++ for ``C = epilogue(A @ B (+ bias))`` on the CPU.

Three GEMM kernels, in the order the optimiser climbs them:

- ``naive``: one output row (B as [K, N]) or one dot product (B as [N, K]) at a time;
- ``packed``: BLIS-style blocking. For each NC-wide column block and KC-deep slice, B is
  packed into NR-column panels and A into MR-row panels (zero padded, so edges need no
  special case in the inner loop); every thread then runs an MR x NR micro-kernel over its
  share of (panel, panel) tiles, written as plain C++ that GCC vectorises;
- ``avx2``: the same driver with an intrinsics micro-kernel keeping MR x NR/8 accumulators
  in ymm registers (6 x 16 = 12 registers), one broadcast of A and NR/8 loads of B per k.

With ``fuse_epilogue`` the bias and the pointwise chain are applied to each tile right after
its last K slice, while it is still in L1; otherwise only the bias is (the chain then runs as a
separate kernel, ``kf_epilogue``).
"""

from __future__ import annotations

from kforge.agents.expert.cpu_chain import (
    Index,
    TensorArg,
    chain_code,
    chain_tensors,
    tensor_params,
)
from kforge.agents.expert.graph import GemmPattern, Operand
from kforge.agents.expert.plans import CpuPlan

_MICRO_TEMPLATE = r"""
template <int MR, int NR>
static inline void kf_micro_plain(int64_t kc, const float* __restrict a, const float* __restrict b,
                                  float* c, int64_t ldc, int64_t mr, int64_t nr, bool first) {
    float acc[MR][NR];
    for (int i = 0; i < MR; ++i)
        for (int j = 0; j < NR; ++j) acc[i][j] = 0.0f;
    for (int64_t k = 0; k < kc; ++k) {
        const float* ak = a + k * MR;
        const float* bk = b + k * NR;
        for (int i = 0; i < MR; ++i) {
            #pragma omp simd
            for (int j = 0; j < NR; ++j) acc[i][j] += ak[i] * bk[j];
        }
    }
    for (int64_t i = 0; i < mr; ++i)
        for (int64_t j = 0; j < nr; ++j)
            c[i * ldc + j] = first ? acc[i][j] : c[i * ldc + j] + acc[i][j];
}

#ifdef __AVX2__
#include <immintrin.h>
{avx2_micro}
#define KF_MICRO(MR, NR) kf_micro_avx2
#else
#define KF_MICRO(MR, NR) kf_micro_plain<MR, NR>
#endif
"""


def avx2_micro(mr: int, nr: int) -> str:
    """An MR x NR intrinsics micro-kernel with one named ymm accumulator per (row, 8 columns):
    named scalars (not arrays) so GCC keeps all of them in registers across the K loop."""
    nv = nr // 8
    accs = [[f"c{i}_{v}" for v in range(nv)] for i in range(mr)]
    lines = [
        "static inline void kf_micro_avx2(int64_t kc, const float* __restrict a, const float* __restrict b,",
        "                                 float* c, int64_t ldc, int64_t mr, int64_t nr, bool first) {",
    ]
    lines += [f"    __m256 {acc} = _mm256_setzero_ps();" for row in accs for acc in row]
    lines.append("    for (int64_t k = 0; k < kc; ++k) {")
    lines += [f"        const __m256 b{v} = _mm256_loadu_ps(b + k * {nr} + {v * 8});" for v in range(nv)]
    for i in range(mr):
        lines.append(f"        {{ const __m256 av = _mm256_broadcast_ss(a + k * {mr} + {i});")
        lines += [f"          {accs[i][v]} = _mm256_fmadd_ps(av, b{v}, {accs[i][v]});" for v in range(nv)]
        lines.append("        }")
    lines.append("    }")
    lines.append(f"    if (mr == {mr} && nr == {nr}) {{")
    for i in range(mr):
        for v in range(nv):
            ptr = f"c + {i} * ldc + {v * 8}"
            lines.append(f"        _mm256_storeu_ps({ptr}, first ? {accs[i][v]} : "
                         f"_mm256_add_ps(_mm256_loadu_ps({ptr}), {accs[i][v]}));")
    lines.append("        return;\n    }")
    lines.append(f"    alignas(32) float tmp[{mr}][{nr}];")
    lines += [f"    _mm256_store_ps(&tmp[{i}][{v * 8}], {accs[i][v]});" for i in range(mr) for v in range(nv)]
    lines.append("    for (int64_t i = 0; i < mr; ++i)")
    lines.append("        for (int64_t j = 0; j < nr; ++j)")
    lines.append("            c[i * ldc + j] = first ? tmp[i][j] : c[i * ldc + j] + tmp[i][j];")
    lines.append("}")
    return "\n".join(lines)


def _tile_epilogue(pat: GemmPattern, plan: CpuPlan, tensors: list[TensorArg]) -> str:
    fused = plan.fuse_epilogue and bool(pat.epilogue)
    ops = pat.epilogue if fused else []
    result = pat.result if fused else Operand(kind="core")
    idx = Index(full="i * N + j", col="j", row="i")
    bias = " + bias[j]" if pat.bias else ""
    body, res = chain_code(ops, result, tensors, idx, "core", plan.simd)
    bias_param = "const float* __restrict bias, " if pat.bias else ""
    vec = "#pragma omp simd" if plan.simd else ""
    return (
        f"static inline void kf_tile_epilogue(float* C, int64_t N, int64_t i0, int64_t i1,\n"
        f"    int64_t j0, int64_t j1, {bias_param}{tensor_params(tensors)}int dummy) {{\n"
        f"  for (int64_t i = i0; i < i1; ++i) {{\n    {vec}\n"
        f"    for (int64_t j = j0; j < j1; ++j) {{ const float core = C[i * N + j]{bias}; "
        f"{body} C[i * N + j] = {res}; }}\n  }}\n}}\n"
    )


def gemm_kernel(pat: GemmPattern, plan: CpuPlan) -> tuple[str, list[TensorArg]]:
    """``kf_gemm(A, B, [bias,] tensors..., C, M, N, K, nthreads)`` and its chain tensors."""
    fused = plan.fuse_epilogue and bool(pat.epilogue)
    tensors = chain_tensors(pat.epilogue) if fused else []
    bat = "B[(j) * K + (k)]" if pat.b_layout == "nk" else "B[(k) * N + (j)]"
    bias_param = "const float* __restrict bias, " if pat.bias else ""
    ep_args = ("bias, " if pat.bias else "") + "".join(f"{t.cname}, " for t in tensors) + "0"
    sig = (
        f'extern "C" void kf_gemm(const float* __restrict A, const float* __restrict B, '
        f"{bias_param}{tensor_params(tensors)}float* __restrict C, int64_t M, int64_t N, "
        f"int64_t K, int64_t nthreads)"
    )
    nt = "nthreads" if plan.threads else "1"
    head = f"#define BAT(k, j) {bat}\n{_tile_epilogue(pat, plan, tensors)}"
    zero_k = (
        "  if (K == 0) { for (int64_t i = 0; i < M; ++i) { for (int64_t j = 0; j < N; ++j) "
        f"C[i * N + j] = 0.0f; kf_tile_epilogue(C, N, i, i + 1, 0, N, {ep_args}); }} return; }}\n"
    )
    if plan.gemm_kernel == "naive":
        return head + sig + " {\n" + zero_k + _naive_body(pat, plan, nt, ep_args) + "}\n", tensors
    micro = f"KF_MICRO({plan.mr}, {plan.nr})" if plan.gemm_kernel == "avx2" else (
        f"kf_micro_plain<{plan.mr}, {plan.nr}>"
    )
    body = f"""  const int64_t MR = {plan.mr}, NR = {plan.nr}, KC = {plan.kc}, MC = {plan.mc}, NC = {plan.nc};
  static thread_local std::vector<float> bbuf, abuf;
  const int64_t ncp = ((std::min(NC, N) + NR - 1) / NR) * NR, mcp = ((std::min(MC, M) + MR - 1) / MR) * MR;
  if ((int64_t)bbuf.size() < KC * ncp) bbuf.resize(KC * ncp);
  if ((int64_t)abuf.size() < KC * mcp) abuf.resize(KC * mcp);
  float* Bp = bbuf.data();
  float* Ap = abuf.data();
  #pragma omp parallel num_threads({nt})
  for (int64_t jc = 0; jc < N; jc += NC) {{
    const int64_t nc = std::min(NC, N - jc), np = (nc + NR - 1) / NR;
    for (int64_t pc = 0; pc < K; pc += KC) {{
      const int64_t kc = std::min(KC, K - pc);
      const bool first = pc == 0, last = pc + kc >= K;
      #pragma omp for schedule(static)
      for (int64_t p = 0; p < np; ++p) {{
        float* dst = Bp + p * NR * kc;
        for (int64_t jj = 0; jj < NR; ++jj) {{
          const int64_t j = jc + p * NR + jj;
          if (j < jc + nc) {{ for (int64_t kk = 0; kk < kc; ++kk) {{ const int64_t k = pc + kk; dst[kk * NR + jj] = BAT(k, j); }} }}
          else {{ for (int64_t kk = 0; kk < kc; ++kk) dst[kk * NR + jj] = 0.0f; }}
        }}
      }}
      for (int64_t ic = 0; ic < M; ic += MC) {{
        const int64_t mc = std::min(MC, M - ic), mp = (mc + MR - 1) / MR;
        #pragma omp for schedule(static)
        for (int64_t q = 0; q < mp; ++q) {{
          float* dst = Ap + q * MR * kc;
          for (int64_t ii = 0; ii < MR; ++ii) {{
            const int64_t i = ic + q * MR + ii;
            if (i < ic + mc) {{ const float* src = A + i * K + pc; for (int64_t kk = 0; kk < kc; ++kk) dst[kk * MR + ii] = src[kk]; }}
            else {{ for (int64_t kk = 0; kk < kc; ++kk) dst[kk * MR + ii] = 0.0f; }}
          }}
        }}
        #pragma omp for collapse(2) schedule(static)
        for (int64_t p = 0; p < np; ++p) {{
          for (int64_t q = 0; q < mp; ++q) {{
            const int64_t i0 = ic + q * MR, j0 = jc + p * NR;
            const int64_t mr = std::min(MR, ic + mc - i0), nr = std::min(NR, jc + nc - j0);
            {micro}(kc, Ap + q * MR * kc, Bp + p * NR * kc, C + i0 * N + j0, N, mr, nr, first);
            if (last) kf_tile_epilogue(C, N, i0, i0 + mr, j0, j0 + nr, {ep_args});
          }}
        }}
      }}
    }}
  }}
"""
    micro_src = _MICRO_TEMPLATE.replace("{avx2_micro}", avx2_micro(plan.mr, plan.nr))
    return micro_src + head + sig + " {\n" + zero_k + body + "}\n", tensors


def _naive_body(pat: GemmPattern, plan: CpuPlan, nt: str, ep_args: str) -> str:
    red = "#pragma omp simd reduction(+:acc)" if plan.simd else ""
    vec = "#pragma omp simd" if plan.simd else ""
    if pat.b_layout == "nk":
        return f"""  #pragma omp parallel for num_threads({nt}) schedule(static)
  for (int64_t i = 0; i < M; ++i) {{
    const float* a = A + i * K;
    for (int64_t j = 0; j < N; ++j) {{
      const float* b = B + j * K;
      float acc = 0.0f;
      {red}
      for (int64_t k = 0; k < K; ++k) acc += a[k] * b[k];
      C[i * N + j] = acc;
    }}
    kf_tile_epilogue(C, N, i, i + 1, 0, N, {ep_args});
  }}
"""
    return f"""  #pragma omp parallel for num_threads({nt}) schedule(static)
  for (int64_t i = 0; i < M; ++i) {{
    float* c = C + i * N;
    for (int64_t j = 0; j < N; ++j) c[j] = 0.0f;
    for (int64_t k = 0; k < K; ++k) {{
      const float a = A[i * K + k];
      const float* b = B + k * N;
      {vec}
      for (int64_t j = 0; j < N; ++j) c[j] += a * b[j];
    }}
    kf_tile_epilogue(C, N, i, i + 1, 0, N, {ep_args});
  }}
"""
