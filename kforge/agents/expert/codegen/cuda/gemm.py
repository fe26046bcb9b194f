"""The CUDA backend's GEMM: ``out[b, m, n] = epilogue(sum_k A[b, m, k] * B[b, k, n])`` with A
and B read through the strides the planner found (a transposed weight, a batch, a broadcast
operand are strides) and the epilogue's stores applied to each finished element.

One block computes a ``block_m x block_n`` tile (a 1-D grid over tiles, GROUP_M-swizzled so
neighbouring blocks share B tiles in L2; the batch is ``blockIdx.y``; both grid-stride), looping
over K in ``block_k`` slices staged in shared memory; every global load is bounds-checked
(zero fill) and every store guarded, so any M, N, K works. A tile is loaded with consecutive
threads on an operand's contiguous dimension (coalesced) where the strides say which it is::

    ieee   SIMT fp32 FMA: (block_m / thread_m) x (block_n / thread_n) threads, each a
           thread_m x thread_n register micro-tile (rows and columns strided by the thread
           grid: conflict-free shared reads, coalesced stores); exact fp32 arithmetic
    tf32   ``nvcuda::wmma`` m16n16k8 TF32 tensor-core products with fp32 accumulation
           (operands rounded to TF32 when staged): warps own warp_m x warp_n sub-tiles; the
           accumulators go through a per-warp scratch so each element's epilogue is guarded

These are the kernels of the earlier pattern-matched CUDA generator (the same tiles and
defaults: 128 x 128 x 16 with 8 x 8 micro-tiles for ieee, 128 x 128 x 32 with 64 x 32 warp
tiles for tf32), over the planner's operands and epilogue.
"""

from __future__ import annotations

import dataclasses

from kforge.agents.expert.codegen.cstyle import Block, Scope
from kforge.agents.expert.codegen.cuda.render import CudaKernel
from kforge.agents.expert.errors import PlanError
from kforge.agents.expert.plan.expr import E
from kforge.agents.expert.plan.kernels import GemmKernel, Operand, Program
from kforge.agents.expert.plan.knobs import CudaGemm
from kforge.agents.expert.plan.precision import check_allowed

SMEM_LIMIT = 48 * 1024  # static shared memory a block may declare
CUDA_STEPS = ("tf32", "ieee")  # the precision steps this GEMM renders (ladder order)
TILE_LOOP = r"""    const int64_t num_m = (M + KF_BM - 1) / KF_BM, num_n = (N + KF_BN - 1) / KF_BN;
    const int64_t group = (int64_t)KF_GROUP_M * num_n;
    for (int64_t e0 = blockIdx.y; e0 < NBAT; e0 += gridDim.y)
    for (int64_t pid = blockIdx.x; pid < num_m * num_n; pid += gridDim.x) {  // GROUP_M-swizzled tiles
        const int64_t first_m = (pid / group) * KF_GROUP_M;
        const int64_t size_m = (num_m - first_m) < KF_GROUP_M ? (num_m - first_m) : KF_GROUP_M;
        const int64_t m0 = (first_m + (pid % group) % size_m) * KF_BM, n0 = ((pid % group) / size_m) * KF_BN;
"""


def threads(knobs: CudaGemm) -> int:
    if knobs.precision == "tf32":
        return 32 * (knobs.block_m // knobs.warp_m) * (knobs.block_n // knobs.warp_n)
    return (knobs.block_m // knobs.thread_m) * (knobs.block_n // knobs.thread_n)


def smem_bytes(knobs: CudaGemm) -> int:
    """Static shared memory the kernel declares (the larger B tile layout counted)."""
    bm, bn, bk = knobs.block_m, knobs.block_n, knobs.block_k
    if knobs.precision == "tf32":
        warps = (bm // knobs.warp_m) * (bn // knobs.warp_n)
        return 4 * (bm * (bk + 4) + max(bn * (bk + 4), bk * (bn + 4)) + warps * 256)
    return 4 * bk * (bm + 1 + bn + 1)


def default_gemm(step: str, m: int, n: int) -> CudaGemm:
    """A step's tiles (the earlier generator's); 64 x 64 tiles where M or N is small (more
    blocks busy)."""
    knobs = CudaGemm(step, 128, 128, 32) if step == "tf32" else CudaGemm(step, 128, 128, 16)
    if m <= 64 or n <= 64:
        knobs = dataclasses.replace(knobs, block_m=64, block_n=64, warp_m=32, warp_n=32)
    return knobs


def check(knobs: CudaGemm, policy: str) -> CudaGemm:
    """The earlier generator's rules for a tile (PlanError naming the one broken)."""
    check_allowed(knobs.precision, policy, CUDA_STEPS)
    bm, bn, bk = knobs.block_m, knobs.block_n, knobs.block_k
    if knobs.precision == "tf32":
        wm, wn = knobs.warp_m, knobs.warp_n
        if bk < 8 or wm > bm or wn > bn or (wm // 16) * (wn // 16) > 16:
            raise PlanError(f"tf32 needs block_k >= 8 and 16 <= warp tile <= block tile with at most 16 "
                            f"fragments a warp, got block {bm}x{bn}x{bk}, warp {wm}x{wn}")
    elif knobs.thread_m * knobs.thread_n > 128 or knobs.thread_m > bm or knobs.thread_n > bn:
        raise PlanError(f"the micro-tile thread_m x thread_n must be <= 128 in all, got "
                        f"{knobs.thread_m}x{knobs.thread_n}")
    nt = threads(knobs)
    if not 32 <= nt <= 1024:
        raise PlanError(f"the GEMM tile needs {nt} threads a block; it must be 32..1024")
    if smem_bytes(knobs) > SMEM_LIMIT:
        raise PlanError(f"the GEMM tile needs {smem_bytes(knobs)} bytes of shared memory (limit {SMEM_LIMIT})")
    return knobs


def _unit(e: E) -> bool:
    return e.op == "const" and e.v == 1


class GemmRender(CudaKernel):
    def __init__(self, k: GemmKernel, program: Program, knobs: CudaGemm) -> None:
        super().__init__(k, program)
        self.kn = knobs
        self.threads, self.block = threads(knobs), str(threads(knobs))

    def strides(self, op: Operand, root: Scope, name: str) -> str:
        """The operand's strides and offset as one kernel definition."""
        s = [self.em.expr(x, root) for x in (*op.strides, op.offset)]
        return f"const int64_t s{name}0 = {s[0]}, s{name}1 = {s[1]}, s{name}2 = {s[2]}, o{name} = {s[3]};"

    def b_n_fast(self) -> bool:
        """Is B contiguous along N (a plain [K, N] operand), not K (an nn.Linear weight)?"""
        return _unit(self.k.b.strides[2]) or not _unit(self.k.b.strides[1])

    def loads(self) -> str:
        """The A and B tile loads into shared memory, each with consecutive threads on the
        operand's contiguous dimension."""
        k, tf32 = self.k, self.kn.precision == "tf32"
        wrap = "kf_wmma::__float_to_tf32({})" if tf32 else "{}"
        a_m_fast = _unit(k.a.strides[1]) and not _unit(k.a.strides[2])
        b_n_fast = self.b_n_fast()
        a_idx = "const int kk = idx / KF_BM, r = idx % KF_BM;" if a_m_fast else "const int r = idx / KF_BK, kk = idx % KF_BK;"
        b_idx = "const int kk = idx / KF_BN, n = idx % KF_BN;" if b_n_fast else "const int n = idx / KF_BK, kk = idx % KF_BK;"
        a_val = wrap.format(f"(gm < M && gk < K) ? {self.em.ptr(k.a.buffer)}[oa + e0 * sa0 + gm * sa1 + gk * sa2] : 0.0f")
        b_val = wrap.format(f"(gn < N && gk < K) ? {self.em.ptr(k.b.buffer)}[ob + e0 * sb0 + gk * sb1 + gn * sb2] : 0.0f")
        a_dst = "As[r * KF_LDA + kk]" if tf32 else "As[kk][r]"
        b_dst = ("Bs[kk * KF_LDB + n]" if b_n_fast else "Bs[n * KF_LDB + kk]") if tf32 else "Bs[kk][n]"
        return (f"            for (int idx = tid; idx < KF_BM * KF_BK; idx += KF_NT) {{\n"
                f"                {a_idx}\n                const int64_t gm = m0 + r, gk = k0 + kk;\n"
                f"                {a_dst} = {a_val};\n            }}\n"
                f"            for (int idx = tid; idx < KF_BN * KF_BK; idx += KF_NT) {{\n"
                f"                {b_idx}\n                const int64_t gn = n0 + n, gk = k0 + kk;\n"
                f"                {b_dst} = {b_val};\n            }}\n")

    def epilogue(self, root: Scope, indent: int) -> str:
        """The stores of one finished element ``v`` at (e0, e1, e2), guarded by the bounds."""
        block = Block(root.child(("e0", "e1", "e2"), ("acc",)), "if (e1 < M && e2 < N)")
        self.em.accs["acc"] = ("v", frozenset({"e1", "e2"}))
        for s in self.k.stores:
            block.add(self.store(s, block.scope))
        return block.render(indent)

    def tf32_core(self, epi: str) -> tuple[str, str]:
        """(declarations, the batch loop's body) of the wmma kernel."""
        kn, b_col = self.kn, not self.b_n_fast()  # b_col: Bs[n][k], a col_major K x N fragment source
        ldb, b_decl = ("KF_BK + 4", "KF_BN * KF_LDB") if b_col else ("KF_BN + 4", "KF_BK * KF_LDB")
        b_major = "kf_wmma::col_major" if b_col else "kf_wmma::row_major"
        b_frag = "Bs + (wn * KF_WN + j * 16) * KF_LDB + kk" if b_col else "Bs + kk * KF_LDB + wn * KF_WN + j * 16"
        decls = f"""    constexpr int KF_WM = {kn.warp_m}, KF_WN = {kn.warp_n};
    constexpr int KF_WARPS_N = KF_BN / KF_WN, KF_NT = 32 * (KF_BM / KF_WM) * KF_WARPS_N;
    constexpr int KF_FM = KF_WM / 16, KF_FN = KF_WN / 16, KF_LDA = KF_BK + 4, KF_LDB = {ldb};
    // fragment pointers are 256-bit aligned: 16-row / 8-column steps of 16-byte-multiple rows
    __shared__ __align__(128) float As[KF_BM * KF_LDA];
    __shared__ __align__(128) float Bs[{b_decl}];
    __shared__ __align__(128) float Cs[(KF_NT / 32) * 256];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = warp / KF_WARPS_N, wn = warp % KF_WARPS_N;
"""
        body = f"""        kf_wmma::fragment<kf_wmma::accumulator, 16, 16, 8, float> acc[KF_FM][KF_FN];
        for (int i = 0; i < KF_FM; ++i)
            for (int j = 0; j < KF_FN; ++j) kf_wmma::fill_fragment(acc[i][j], 0.0f);
        for (int64_t k0 = 0; k0 < K; k0 += KF_BK) {{
{self.loads()}            __syncthreads();
            for (int kk = 0; kk < KF_BK; kk += 8) {{
                kf_wmma::fragment<kf_wmma::matrix_a, 16, 16, 8, kf_wmma::precision::tf32, kf_wmma::row_major> a[KF_FM];
                kf_wmma::fragment<kf_wmma::matrix_b, 16, 16, 8, kf_wmma::precision::tf32, {b_major}> b[KF_FN];
                for (int i = 0; i < KF_FM; ++i)
                    kf_wmma::load_matrix_sync(a[i], As + (wm * KF_WM + i * 16) * KF_LDA + kk, KF_LDA);
                for (int j = 0; j < KF_FN; ++j) kf_wmma::load_matrix_sync(b[j], {b_frag}, KF_LDB);
                for (int i = 0; i < KF_FM; ++i)
                    for (int j = 0; j < KF_FN; ++j) kf_wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
            }}
            __syncthreads();
        }}
        float* cw = Cs + warp * 256;
        for (int i = 0; i < KF_FM; ++i)
            for (int j = 0; j < KF_FN; ++j) {{
                kf_wmma::store_matrix_sync(cw, acc[i][j], 16, kf_wmma::mem_row_major);
                __syncwarp();
                for (int el = lane; el < 256; el += 32) {{
                    const int64_t e1 = m0 + wm * KF_WM + i * 16 + (el >> 4), e2 = n0 + wn * KF_WN + j * 16 + (el & 15);
                    const float v = cw[el];
{epi}
                }}
                __syncwarp();
            }}
"""
        return decls, body

    def simt_core(self, epi: str) -> tuple[str, str]:
        """(declarations, the batch loop's body) of the fp32 FMA kernel."""
        kn = self.kn
        decls = f"""    constexpr int KF_TM = {kn.thread_m}, KF_TN = {kn.thread_n};
    constexpr int KF_TX = KF_BN / KF_TN, KF_TY = KF_BM / KF_TM, KF_NT = KF_TX * KF_TY;
    __shared__ float As[KF_BK][KF_BM + 1];  // k-major, an odd stride: no bank conflicts
    __shared__ float Bs[KF_BK][KF_BN + 1];
    const int tid = threadIdx.x, tx = tid % KF_TX, ty = tid / KF_TX;
"""
        body = f"""        float acc[KF_TM][KF_TN];
#pragma unroll
        for (int i = 0; i < KF_TM; ++i)
#pragma unroll
            for (int j = 0; j < KF_TN; ++j) acc[i][j] = 0.0f;
        for (int64_t k0 = 0; k0 < K; k0 += KF_BK) {{
{self.loads()}            __syncthreads();
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
        for (int i = 0; i < KF_TM; ++i)
            for (int j = 0; j < KF_TN; ++j) {{
                const int64_t e1 = m0 + ty + i * KF_TY, e2 = n0 + tx + j * KF_TX;
                const float v = acc[i][j];
{epi}
            }}
"""
        return decls, body

    def body(self) -> Block:
        k, kn = self.k, self.kn
        root = Scope(None)
        M, N, K = self.dim(k.m), self.dim(k.n), self.dim(k.k)
        nbat = self.dim(k.batch) if k.batch is not None else "((int64_t)1)"
        strides = [self.strides(k.a, root, "a"), self.strides(k.b, root, "b")]
        tf32 = kn.precision == "tf32"
        epi = self.epilogue(root, 5 if tf32 else 4)
        decls, loop = (self.tf32_core if tf32 else self.simt_core)(epi)
        defs = "".join(f"    {d}\n" for d in root.defs)
        self.work, self.per_block = f"(({M} + {kn.block_m} - 1) / {kn.block_m}) * (({N} + {kn.block_n} - 1) / {kn.block_n})", "1"
        self.grid = f"dim3(kf_blocks(kf_work, 1), (unsigned)({nbat} < 65535 ? {nbat} : 65535))"
        return Text(f"""{{
{defs}    const int64_t M = {M}, N = {N}, K = {K}, NBAT = {nbat};
    {strides[0]}
    {strides[1]}
    constexpr int KF_BM = {kn.block_m}, KF_BN = {kn.block_n}, KF_BK = {kn.block_k}, KF_GROUP_M = 8;
{decls}{TILE_LOOP}{loop}    }}
}}""")


class Text(Block):
    """A kernel body written out whole (the GEMM's), in the Block interface."""

    def __init__(self, text: str) -> None:
        super().__init__(Scope(None))
        self.text = text

    def render(self, indent: int = 1) -> str:
        return self.text
