"""C++ for a :class:`~kforge.agents.expert.plan.kernels.GemmKernel` on the CPU: a packed, cache-blocked fp32 GEMM per
batch with the epilogue stores applied to each output tile right after its last K slice.

BLIS-style blocking: for each NC-wide column block and KC-deep slice, B is packed into
NR-column panels and A into MR-row panels (zero padded: edges need no special case in the
inner loop), read through the operands' strides, so transposed and batched operands cost
nothing extra. Every thread runs an MR x NR micro-kernel over its share of the tiles: AVX-512
intrinsics (MR x NR/16 named zmm accumulators) where the compiler targets AVX-512 and NR is a
multiple of 16, AVX2 (MR x NR/8 ymm accumulators) where it targets AVX2, plain C++ otherwise;
per k, one broadcast of A per row and one load of B per vector. The tile itself is a knob: the
backend's default follows the ISA the host's compiler targets (:func:`~kforge.platforms.
cpu_runtime.vector_isa`). Partial sums live in ``C``: the store
whose value is the bare product at its natural row-major index (when there is one) *is*
``C``, else a workspace. The epilogue reads the finished tile while it is in L1.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import sympy

from kforge.agents.expert.codegen.cstyle import CTYPES, Block, CEmitter, Scope
from kforge.agents.expert.plan.expr import E, linear, var
from kforge.agents.expert.plan.kernels import GemmKernel, Program
from kforge.agents.expert.plan.knobs import CpuKnobs

MICRO = r"""
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
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
{simd}#define KF_MICRO kf_micro_plain<{mr}, {nr}>
#endif
"""


@dataclass(frozen=True)
class VectorIsa:
    """One vector ISA's intrinsics, as the micro-kernel uses them."""

    name: str
    macro: str  # the compiler's macro for it
    lanes: int
    registers: int
    vec: str  # the register type
    prefix: str  # of the intrinsics
    broadcast: str  # A's element into every lane, from its address


AVX512 = VectorIsa("avx512", "__AVX512F__", 16, 32, "__m512", "_mm512", "_mm512_set1_ps(*({addr}))")
AVX2 = VectorIsa("avx2", "__AVX2__", 8, 16, "__m256", "_mm256", "_mm256_broadcast_ss({addr})")


def simd_micro(isa: VectorIsa, mr: int, nr: int) -> str:
    """An MR x NR intrinsics micro-kernel ``kf_micro_<isa>``; named accumulators stay in registers."""
    nv, w, p, vec = nr // isa.lanes, isa.lanes, isa.prefix, isa.vec
    accs = [[f"c{i}_{v}" for v in range(nv)] for i in range(mr)]
    lines = [
        f"static inline void kf_micro_{isa.name}(int64_t kc, const float* __restrict a, const float* __restrict b,",
        "                                 float* c, int64_t ldc, int64_t mr, int64_t nr, bool first) {",
    ]
    lines += [f"    {vec} {acc} = {p}_setzero_ps();" for row in accs for acc in row]
    lines.append("    for (int64_t k = 0; k < kc; ++k) {")
    lines += [f"        const {vec} b{v} = {p}_loadu_ps(b + k * {nr} + {v * w});" for v in range(nv)]
    for i in range(mr):
        lines.append(f"        {{ const {vec} av = {isa.broadcast.format(addr=f'a + k * {mr} + {i}')};")
        lines += [f"          {accs[i][v]} = {p}_fmadd_ps(av, b{v}, {accs[i][v]});" for v in range(nv)]
        lines.append("        }")
    lines.append("    }")
    lines.append(f"    if (mr == {mr} && nr == {nr}) {{")
    for i in range(mr):
        for v in range(nv):
            ptr = f"c + {i} * ldc + {v * w}"
            lines.append(f"        {p}_storeu_ps({ptr}, first ? {accs[i][v]} : "
                         f"{p}_add_ps({p}_loadu_ps({ptr}), {accs[i][v]}));")
    lines.append("        return;\n    }")
    lines.append(f"    alignas({4 * w}) float tmp[{mr}][{nr}];")
    lines += [f"    {p}_store_ps(&tmp[{i}][{v * w}], {accs[i][v]});" for i in range(mr) for v in range(nv)]
    lines.append("    for (int64_t i = 0; i < mr; ++i)")
    lines.append("        for (int64_t j = 0; j < nr; ++j)")
    lines.append("            c[i * ldc + j] = first ? tmp[i][j] : c[i * ldc + j] + tmp[i][j];")
    lines.append("}")
    return "\n".join(lines)


def gemm_prelude(knobs: CpuKnobs) -> str:
    """The micro-kernels for the knobs' tile: one per ISA whose lanes divide ``nr`` and whose
    registers hold the tile's accumulators, B's vectors and A's broadcast; the first the
    compiler targets is ``KF_MICRO``, the plain C++ one otherwise."""
    mr, nr = knobs.mr, knobs.nr
    fits = [isa for isa in (AVX512, AVX2)
            if nr % isa.lanes == 0 and (mr + 1) * (nr // isa.lanes) + 1 <= isa.registers]
    simd = ""
    for i, isa in enumerate(fits):
        simd += (f"#{'el' if i else ''}if defined({isa.macro})\n{simd_micro(isa, mr, nr)}\n"
                 f"#define KF_MICRO kf_micro_{isa.name}\n")
    simd += "#else\n" if simd else "#if 1\n"
    return MICRO.replace("{simd}", simd).replace("{mr}", str(mr)).replace("{nr}", str(nr))


def _dim(em: CEmitter, expr: sympy.Expr | None) -> str:
    if expr is None:
        return "((int64_t)1)"
    e = sympy.sympify(expr)
    return f"((int64_t){int(e)})" if e.is_number else em.size(e)


def gemm_body(k: GemmKernel, program: Program, em: CEmitter, knobs: CpuKnobs) -> str:
    """The body of ``extern "C" void <name>(...)`` for a GEMM kernel (C++ statements)."""
    root = Scope(None)
    M, N, K, NBAT = _dim(em, k.m), _dim(em, k.n), _dim(em, k.k), _dim(em, k.batch)
    ev = (var("e0", k.batch if k.batch is not None else 1), var("e1", k.m), var("e2", k.n))
    shape = (k.batch, k.m, k.n) if k.batch is not None else (k.m, k.n)
    natural = linear(ev if k.batch is not None else ev[1:], shape)
    acc = E("acc", v="acc", dt="f32")
    direct = next((s for s in k.stores if s.value == acc and s.index == natural
                   and program.buffers[s.buffer].dtype == "f32"), None)
    a_s = [em.expr(x, root) for x in (*k.a.strides, k.a.offset)]
    b_s = [em.expr(x, root) for x in (*k.b.strides, k.b.offset)]
    pa, pb = em.ptr(k.a.buffer), em.ptr(k.b.buffer)
    if direct is not None:
        c_base = f"{em.ptr(direct.buffer)} + e0 * M * N"
    else:  # partial sums in a workspace, one M x N slab per batch
        c_base = "kf_ws.data() + e0 * M * N"
    epi_stores = [s for s in k.stores if s is not direct]
    epi = ""
    if epi_stores:
        top = Block(Scope(None, ("e0",)), "")
        rows = Block(top.scope.child(("e1",)), "for (int64_t e1 = i0; e1 < i1; ++e1)")
        cols = Block(rows.scope.child(("e2",)), "#pragma omp simd\nfor (int64_t e2 = j0; e2 < j1; ++e2)")
        top.add(rows)
        rows.add(cols)
        em.accs["acc"] = ("C[e1 * N + e2]", frozenset({"e1", "e2"}))
        for s in epi_stores:
            idx = em.expr(s.index, cols.scope)
            val = em.expr(s.value, cols.scope)
            cols.add(f"{em.ptr(s.buffer)}[{idx}] = ({CTYPES[program.buffers[s.buffer].dtype]}){val};")
        epi = top.render(0)
    defs = "\n".join("  " + d for d in root.defs)
    ws = "" if direct is not None else (
        "  static std::vector<float> kf_ws;\n  if ((int64_t)kf_ws.size() < NBAT * M * N) kf_ws.resize(NBAT * M * N);\n")
    return f"""{defs}
  const int64_t M = {M}, N = {N}, K = {K}, NBAT = {NBAT};
  const int64_t sa0 = {a_s[0]}, sa1 = {a_s[1]}, sa2 = {a_s[2]}, sb0 = {b_s[0]}, sb1 = {b_s[1]}, sb2 = {b_s[2]};
  const int64_t MR = {knobs.mr}, NR = {knobs.nr}, KC = {knobs.kc}, MC = {knobs.mc}, NCMAX = {knobs.nc};
  if (M <= 0 || N <= 0 || NBAT <= 0) return;
{ws}  if (N < 4 && sa2 == 1) {{  // GEMV-like: one dot product per output, memory-bound
    #pragma omp parallel for num_threads(nthreads) schedule(static) if(NBAT * M * K > 262144)
    for (int64_t u = 0; u < NBAT * M; ++u) {{
      const int64_t e0 = u / M, i = u % M;
      const float* A = {pa} + {a_s[3]} + e0 * sa0 + i * sa1;
      const float* B = {pb} + {b_s[3]} + e0 * sb0;
      float* C = {c_base};
      for (int64_t j = 0; j < N; ++j) {{
        float s = 0.0f;
        #pragma omp simd reduction(+:s)
        for (int64_t kk = 0; kk < K; ++kk) s += A[kk] * B[kk * sb1 + j * sb2];
        C[i * N + j] = s;
      }}
      const int64_t i0 = i, i1 = i + 1, j0 = 0, j1 = N;
{textwrap.indent(epi, " " * 6) if epi else ""}
    }}
    return;
  }}
  // work units: (batch, row block, column block), each done whole by one thread (no barrier)
  const int64_t T = nthreads > 0 ? nthreads : 1;
  const int64_t per_batch = std::max((int64_t)1, (2 * T + NBAT - 1) / NBAT);
  int64_t NU = std::min(N, NCMAX);
  if ((N + NU - 1) / NU < per_batch) NU = std::max(NR, ((N + per_batch - 1) / per_batch + NR - 1) / NR * NR);
  const int64_t nN = (N + NU - 1) / NU;
  const int64_t nM0 = std::max((int64_t)1, (per_batch + nN - 1) / nN);
  const int64_t MU = std::max(MR, ((M + nM0 - 1) / nM0 + MR - 1) / MR * MR);
  const int64_t nM = (M + MU - 1) / MU;
  #pragma omp parallel for num_threads(T) schedule(dynamic, 1) if(NBAT * M * N * K > 262144)
  for (int64_t u = 0; u < NBAT * nM * nN; ++u) {{
    const int64_t e0 = u / (nM * nN), mu = (u / nN) % nM, nu = u % nN;
    const float* A = {pa} + {a_s[3]} + e0 * sa0;
    const float* B = {pb} + {b_s[3]} + e0 * sb0;
    float* C = {c_base};
    const int64_t m0 = mu * MU, m1 = std::min(M, m0 + MU), jc = nu * NU, nc = std::min(NU, N - jc);
    const int64_t np = (nc + NR - 1) / NR;
    static thread_local std::vector<float> kf_bbuf, kf_abuf;
    if ((int64_t)kf_bbuf.size() < KC * np * NR) kf_bbuf.resize(KC * np * NR);
    if ((int64_t)kf_abuf.size() < KC * MC) kf_abuf.resize(KC * MC + MR * KC);
    float* Bp = kf_bbuf.data();
    float* Ap = kf_abuf.data();
    if (K == 0) {{
      for (int64_t i = m0; i < m1; ++i) for (int64_t j = jc; j < jc + nc; ++j) C[i * N + j] = 0.0f;
    }}
    for (int64_t pc = 0; pc < K || (K == 0 && pc == 0); pc += KC) {{
      const int64_t kc = std::min(KC, K - pc);
      const bool first = pc == 0, last = pc + kc >= K;
      for (int64_t p = 0; p < np; ++p) {{
        float* dst = Bp + p * NR * kc;
        const int64_t w = std::min(NR, jc + nc - (jc + p * NR));
        if (sb2 == 1) {{  // B row-major in K (a plain matmul's right operand): read along its rows
          for (int64_t kk = 0; kk < kc; ++kk) {{
            const float* src = B + (pc + kk) * sb1 + jc + p * NR;
            for (int64_t jj = 0; jj < w; ++jj) dst[kk * NR + jj] = src[jj];
            for (int64_t jj = w; jj < NR; ++jj) dst[kk * NR + jj] = 0.0f;
          }}
          continue;
        }}
        for (int64_t jj = 0; jj < NR; ++jj) {{
          const int64_t j = jc + p * NR + jj;
          if (jj < w) {{ const float* src = B + j * sb2 + pc * sb1; for (int64_t kk = 0; kk < kc; ++kk) dst[kk * NR + jj] = src[kk * sb1]; }}
          else {{ for (int64_t kk = 0; kk < kc; ++kk) dst[kk * NR + jj] = 0.0f; }}
        }}
      }}
      for (int64_t ic = m0; ic < m1; ic += MC) {{
        const int64_t mc = std::min(MC, m1 - ic), mp = (mc + MR - 1) / MR;
        for (int64_t q = 0; q < mp; ++q) {{
          float* dst = Ap + q * MR * kc;
          const int64_t h = std::min(MR, ic + mc - (ic + q * MR));
          if (sa1 == 1 && M > 1) {{  // A transposed (column-major): read along its columns
            for (int64_t kk = 0; kk < kc; ++kk) {{
              const float* src = A + (pc + kk) * sa2 + ic + q * MR;
              for (int64_t ii = 0; ii < h; ++ii) dst[kk * MR + ii] = src[ii];
              for (int64_t ii = h; ii < MR; ++ii) dst[kk * MR + ii] = 0.0f;
            }}
            continue;
          }}
          for (int64_t ii = 0; ii < MR; ++ii) {{
            const int64_t i = ic + q * MR + ii;
            if (i < ic + mc) {{ const float* src = A + i * sa1 + pc * sa2; for (int64_t kk = 0; kk < kc; ++kk) dst[kk * MR + ii] = src[kk * sa2]; }}
            else {{ for (int64_t kk = 0; kk < kc; ++kk) dst[kk * MR + ii] = 0.0f; }}
          }}
        }}
        for (int64_t p = 0; p < np; ++p) {{
          for (int64_t q = 0; q < mp; ++q) {{
            const int64_t i0 = ic + q * MR, j0 = jc + p * NR;
            const int64_t i1 = std::min(i0 + MR, ic + mc), j1 = std::min(j0 + NR, jc + nc);
            if (kc > 0) KF_MICRO(kc, Ap + q * MR * kc, Bp + p * NR * kc, C + i0 * N + j0, N, i1 - i0, j1 - j0, first);
            if (last)
{textwrap.indent(epi, " " * 14) if epi else "              {}"}
          }}
        }}
      }}
    }}
  }}
"""
