"""The CUDA backend's pointwise, row and scan kernels (the GEMM is :mod:`.gemm`).

Every kernel is a ``__global__`` function over raw pointers and its sizes (``z0, z1...``,
computed by ``forward`` from the tensors' shapes), launched by a host function
``kf_kN(..., cudaStream_t)`` that picks the grid; every loop is grid-stride, so one grid
serves any size::

    pointwise  one thread an element of the flattened space; loop variables by div/mod
    row        ``threads`` > 1: a row's threads (threadIdx.x) stride over the reduced space
               (flattened), each pass one value a thread, combined by warp shuffles and, past
               one warp, through shared memory (:data:`DEVICE`: ``kf_row_reduce``), every
               thread then holding the result; ``rows`` rows a block (threadIdx.y); a row
               past the end computes on row 0 and stores nothing. ``threads`` == 1: one thread
               a row, each pass a loop nest (a column sum, short rows)
    scan       one block a row; the length in chunks of the block, a block-wide inclusive scan
               (``kf_block_scan``) plus the running carry

Sums and products of f32 values accumulate in double, as the CPU backend's do.
"""

from __future__ import annotations

from typing import Any

from kforge.agents.expert.codegen.cstyle import CTYPES, Block, CKernel, Scope
from kforge.agents.expert.codegen.cuda.ops import CUDA_OPS
from kforge.agents.expert.plan.expr import linear, var
from kforge.agents.expert.plan.kernels import (
    PointwiseKernel,
    Program,
    Reduction,
    RowKernel,
    ScanKernel,
)
from kforge.agents.expert.plan.knobs import CudaPointwise, CudaRow, CudaScan

# device helpers the row and scan kernels call (after ops.PRELUDE in CUDA_SOURCE)
DEVICE = r"""
struct KfSum { template <class T> __device__ T operator()(T a, T b) const { return a + b; } };
struct KfProd { template <class T> __device__ T operator()(T a, T b) const { return a * b; } };
struct KfMax { template <class T> __device__ T operator()(T a, T b) const { return b > a ? b : a; } };
struct KfMin { template <class T> __device__ T operator()(T a, T b) const { return b < a ? b : a; } };
struct KfAny { template <class T> __device__ T operator()(T a, T b) const { return a || b; } };
struct KfAll { template <class T> __device__ T operator()(T a, T b) const { return a && b; } };

// The TPR threads of a row (threadIdx.x; rows are threadIdx.y) combine v: an xor butterfly
// in each warp, then the warps' values through ``scratch`` [rows][TPR / 32]; every thread of
// the row gets the result, combined in one order whatever the thread.
template <int TPR, class T, class Op>
KF_DEVICE T kf_row_reduce(T v, Op op, T* scratch) {
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (TPR == 32) return v;
    __syncthreads();  // the scratch of the previous reduction has been read
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.y * (TPR / 32) + (threadIdx.x >> 5)] = v;
    __syncthreads();
    T r = scratch[threadIdx.y * (TPR / 32)];
    for (int w = 1; w < TPR / 32; ++w) r = op(r, scratch[threadIdx.y * (TPR / 32) + w]);
    return r;
}

// argmax / argmin: (value, index) pairs, a better value or an equal one at a lower index wins
template <int TPR, bool GREATER, class T>
KF_DEVICE void kf_row_argreduce(T& v, int64_t& i, T* sv, int64_t* si) {
    for (int o = 16; o > 0; o >>= 1) {
        const T ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int64_t oi = __shfl_xor_sync(0xffffffffu, i, o);
        if ((GREATER ? ov > v : ov < v) || (ov == v && oi < i)) { v = ov; i = oi; }
    }
    if (TPR == 32) return;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) {
        sv[threadIdx.y * (TPR / 32) + (threadIdx.x >> 5)] = v;
        si[threadIdx.y * (TPR / 32) + (threadIdx.x >> 5)] = i;
    }
    __syncthreads();
    v = sv[threadIdx.y * (TPR / 32)];
    i = si[threadIdx.y * (TPR / 32)];
    for (int w = 1; w < TPR / 32; ++w) {
        const T ov = sv[threadIdx.y * (TPR / 32) + w];
        const int64_t oi = si[threadIdx.y * (TPR / 32) + w];
        if ((GREATER ? ov > v : ov < v) || (ov == v && oi < i)) { v = ov; i = oi; }
    }
}

// An inclusive scan of v over the block's BS threads; ``total`` gets the whole block's.
template <int BS, class T, class Op>
KF_DEVICE T kf_block_scan(T v, Op op, T ident, T* warp_tot, T& total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        const T u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v = op(u, v);
    }
    __syncthreads();  // the previous chunk's totals have been read
    if (lane == 31) warp_tot[warp] = v;
    __syncthreads();
    T before = ident;
    for (int w = 0; w < warp; ++w) before = op(before, warp_tot[w]);
    total = ident;
    for (int w = 0; w < BS / 32; ++w) total = op(total, warp_tot[w]);
    return op(before, v);
}
"""
OPS = {"sum": "KfSum", "prod": "KfProd", "max": "KfMax", "min": "KfMin", "any": "KfAny", "all": "KfAll"}
GRID_STRIDE = "for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < {n}; q += (int64_t)gridDim.x * blockDim.x)"


class CudaKernel(CKernel):
    """One CUDA kernel: its body, then :meth:`render` (the kernel and its launcher)."""

    threads: int  # a block's threads (x * y)
    block: str  # the launch's block shape

    def __init__(self, kernel: Any, program: Program) -> None:
        super().__init__(kernel, program, CUDA_OPS)
        self.work = "((int64_t)1)"  # units the grid spreads over, and a block's share of them
        self.per_block = "1"
        self.grid = ""  # the launch's grid ("": kf_blocks(kf_work, per_block))

    def body(self) -> Block:
        raise NotImplementedError

    def render(self) -> tuple[str, list[str], list[str]]:
        """(CUDA source: kernel + launcher, the launcher's C parameters, Python arguments)."""
        body = self.body().render(0)
        ptrs = [(f"{CTYPES[self.p.buffers[b].dtype]}*", ptr) for b, ptr in self.em.buffers.items()]
        pre: list[str] = []
        sizes = self.size_params(pre)
        params = [f"{t} __restrict__ {n}" for t, n in ptrs] + [decl for decl, _, _ in sizes]
        names = [n for _, n in ptrs] + [decl.split()[-1] for decl, _, _ in sizes]
        launcher = [f"{t} {n}" for t, n in ptrs] + [decl for decl, _, _ in sizes]
        code = (f"__global__ void __launch_bounds__({self.threads}) {self.fn}_kernel({', '.join(params)})\n{body}\n\n"
                f"cudaError_t {self.fn}({', '.join([*launcher, 'cudaStream_t stream'])}) {{\n"
                f"    const int64_t kf_work = {self.work};\n"
                f"    {self.fn}_kernel<<<{self.grid or f'kf_blocks(kf_work, {self.per_block})'}, {self.block}, 0, stream>>>"
                f"({', '.join(names)});\n"
                "    return cudaGetLastError();\n}\n")
        args = [*self.em.buffers, *(arg for _, _, arg in sizes)]
        return code, launcher, [*pre, f"_ext.{self.k.name}({', '.join(args)})"]


class PointwiseRender(CudaKernel):
    def __init__(self, k: PointwiseKernel, program: Program, knobs: CudaPointwise) -> None:
        super().__init__(k, program)
        self.threads, self.block = knobs.threads, str(knobs.threads)

    def body(self) -> Block:
        k = self.k
        root = Block(Scope(None))
        names = [f"p{i}" for i in range(len(k.space))]
        dims = [self.dim(s) for s in k.space]
        root.scope.defs.append(f"const int64_t N = {self.prod(dims)};")
        self.work, self.per_block = self.prod(dims), str(self.threads)
        loop = Block(root.scope.child(tuple(names)), GRID_STRIDE.format(n="N"))
        loop.scope.defs += self.decode("q", names, dims)
        root.add(loop)
        for s in k.stores:
            loop.add(self.store(s, loop.scope))
        return root


class RowRender(CudaKernel):
    def __init__(self, k: RowKernel, program: Program, knobs: CudaRow) -> None:
        super().__init__(k, program)
        self.tpr, self.rows = knobs.threads, knobs.rows
        self.threads = self.tpr * self.rows
        self.block = f"dim3({self.tpr}, {self.rows})"

    def raw(self, r: Reduction) -> tuple[str, str]:
        """A running value's type and start; any / all as int (what warp shuffles carry)."""
        if r.kind in ("any", "all"):
            return "int", "0" if r.kind == "any" else "1"
        return super().raw(r)

    def body(self) -> Block:
        k = self.k
        root = Block(Scope(None))
        on = [f"o{i}" for i in range(len(k.outer))]
        od = [self.dim(s) for s in k.outer]
        rn = [f"r{i}" for i in range(len(k.red))] or ["rz"]
        rd = [self.dim(s) for s in k.red] or ["((int64_t)1)"]
        root.scope.defs.append(f"const int64_t P = {self.prod(od)}, R = {self.prod(rd)};")
        self.work, self.per_block = self.prod(od), str(self.rows if self.tpr > 1 else self.threads)
        coop = self.tpr > 1
        if coop:
            cur = Block(root.scope.child(tuple(on)),
                        f"for (int64_t row0 = (int64_t)blockIdx.x * {self.rows}; row0 < P; "
                        f"row0 += (int64_t)gridDim.x * {self.rows})")
            cur.scope.defs += ["const int64_t kf_row = row0 + threadIdx.y;", "const bool live = kf_row < P;",
                               "const int64_t q = live ? kf_row : 0;  // a row past the end computes on row 0"]
        else:
            cur = Block(root.scope.child(tuple(on)), GRID_STRIDE.format(n="P"))
        cur.scope.defs += self.decode("q", on, od)
        root.add(cur)
        flat_e = linear(tuple(var(f"r{i}", s) for i, s in enumerate(k.red)), k.red) if k.red else None

        def loop(parent: Block) -> Block:
            """One pass over the reduced space: the row's threads stride over it (flattened),
            or one thread walks it (a loop nest); returns the innermost body."""
            if not coop:
                return self.nest(parent, rn, rd, "")
            inner = Block(parent.scope.child(tuple(rn)), f"for (int64_t rf = threadIdx.x; rf < R; rf += {self.tpr})")
            inner.scope.defs += self.decode("rf", rn, rd)
            parent.add(inner)
            return inner

        for pass_no in range(1, k.passes + 1):
            reds = [r for r in k.reductions if r.pass_no == pass_no]
            for r in reds:
                t, init = self.raw(r)
                if r.kind in ("argmax", "argmin"):
                    cur.add(f"{t} bv_{r.acc} = {init}; int64_t a_{r.acc} = 0;")
                else:
                    cur.add(f"{t} a_{r.acc} = {init};")
            inner = loop(cur)
            flat = self.em.expr(flat_e, inner.scope) if flat_e is not None else "((int64_t)0)"
            for r in reds:
                inner.add(self.update(r, self.em.expr(r.body, inner.scope), flat, ""))
            for r in reds:
                if coop:
                    cur.add(self.combine(r, root))
                self.em.accs[r.acc] = (f"(({CTYPES[r.dt]})a_{r.acc})", frozenset())
            nxt = Block(cur.scope.child((), tuple(r.acc for r in reds)))
            cur.add(nxt)
            cur = nxt
        if k.outer_stores:
            target = Block(cur.scope.child(), "if (live && threadIdx.x == 0)") if coop else cur
            if coop:
                cur.add(target)
            for s in k.outer_stores:
                target.add(self.store(s, target.scope))
        if k.full_stores:
            inner = loop(cur)
            target = Block(inner.scope.child(), "if (live)") if coop else inner
            if coop:
                inner.add(target)
            for s in k.full_stores:
                target.add(self.store(s, target.scope))
        return root

    def combine(self, r: Reduction, root: Block) -> str:
        """The row's threads' running values combined; shared scratch declared in ``root``."""
        t, _ = self.raw(r)
        warps = max(1, self.tpr // 32)
        root.scope.defs.append(f"__shared__ {t} s_{r.acc}[{self.rows * warps}];")
        if r.kind in ("argmax", "argmin"):
            root.scope.defs.append(f"__shared__ int64_t s_{r.acc}_i[{self.rows * warps}];")
            greater = "true" if r.kind == "argmax" else "false"
            return f"kf_row_argreduce<{self.tpr}, {greater}>(bv_{r.acc}, a_{r.acc}, s_{r.acc}, s_{r.acc}_i);"
        return f"a_{r.acc} = kf_row_reduce<{self.tpr}>(a_{r.acc}, {OPS[r.kind]}(), s_{r.acc});"


class ScanRender(CudaKernel):
    def __init__(self, k: ScanKernel, program: Program, knobs: CudaScan) -> None:
        super().__init__(k, program)
        self.threads, self.block = knobs.threads, str(knobs.threads)

    def body(self) -> Block:
        k = self.k
        root = Block(Scope(None))
        on = [f"o{i}" for i in range(len(k.outer))]
        od = [self.dim(s) for s in k.outer]
        t = "double" if k.body.dt == "f32" else "int64_t"
        ident = "0" if k.op == "sum" else "1"
        op = OPS[k.op]
        root.scope.defs += [f"const int64_t P = {self.prod(od)}, L = {self.dim(k.length)};",
                            f"__shared__ {t} kf_warp_tot[{self.threads // 32}];"]
        self.work, self.per_block = self.prod(od), "1"
        row = Block(root.scope.child(tuple(on)), "for (int64_t q = blockIdx.x; q < P; q += gridDim.x)")
        row.scope.defs += self.decode("q", on, od)
        root.add(row)
        row.add(f"{t} carry = {ident};")
        chunk = Block(row.scope.child(("s",)), f"for (int64_t s0 = 0; s0 < L; s0 += {self.threads})")
        chunk.scope.defs += ["const int64_t kf_s = s0 + threadIdx.x;", "const bool live = kf_s < L;",
                             "const int64_t s = live ? kf_s : 0;  // past the end: computes on element 0"]
        row.add(chunk)
        v = self.em.expr(k.body, chunk.scope)
        chunk.add(f"{t} total;")
        chunk.add(f"const {t} res = {op}()(carry, kf_block_scan<{self.threads}>(live ? ({t}){v} : ({t}){ident}, "
                  f"{op}(), ({t}){ident}, kf_warp_tot, total));")
        chunk.add(f"carry = {op}()(carry, total);")
        store = Block(chunk.scope.child((), ("scan",)), "if (live)")
        chunk.add(store)
        self.em.accs["scan"] = (f"(({CTYPES[k.body.dt]})res)", frozenset({"s"}))
        store.add(self.store(k.store, store.scope))
        return root
