"""Run a generated CUDA candidate on the CPU: its ``CUDA_SOURCE`` compiled by g++ against an
emulation of CUDA's execution model (a block's threads are fibers run in turn on one OS thread,
each to its next ``__syncthreads``, so a barrier is where all have arrived; ``__shared__`` a
static; warp shuffles through a shared array between two barriers), its
launchers called through ctypes by a stand-in for the extension. The grid is cut to a few
blocks, so every grid-stride loop takes more than one step. No tensor cores: a candidate
whose GEMM is at the ``tf32`` step (``nvcuda::wmma``) is not emulated.

This checks the kernels' arithmetic and indexing where no GPU is; what a GPU adds (the
memory model, timing, wmma) is the GPU tests' (tests/platforms/test_gpu_platforms.py)."""

from __future__ import annotations

import ctypes
import hashlib
import re
import subprocess
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

EMULATION = r"""
#include <ucontext.h>
#include <cstdint>
#include <cstdlib>
#include <cmath>
#include <algorithm>
#include <functional>
struct dim3 { unsigned x, y, z; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
struct kf_uint3 { unsigned x, y, z; };
static kf_uint3 threadIdx;
static kf_uint3 blockIdx;
static dim3 blockDim, gridDim;
typedef int cudaError_t;
typedef void* cudaStream_t;
#define cudaSuccess 0
static inline cudaError_t cudaGetLastError() { return 0; }
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__ __restrict
#define __launch_bounds__(x)
// A block's threads are fibers run in turn on one OS thread: each runs to its next barrier
// (or its end), then the next; a barrier is the point where every fiber has arrived.
struct kf_fiber { ucontext_t ctx; char* stack; bool done; };
static ucontext_t kf_sched;
static kf_fiber* kf_fibers;
static int kf_cur;
static std::function<void()>* kf_body;
static void kf_yield() { swapcontext(&kf_fibers[kf_cur].ctx, &kf_sched); }
static void kf_entry() { (*kf_body)(); kf_fibers[kf_cur].done = true; kf_yield(); }
#define __syncthreads() kf_yield()
static inline int kf_tid() { return (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x; }
template <class T> T __shfl_xor_sync(unsigned, T v, int o) {
    static T buf[1024];
    buf[kf_tid()] = v;
    kf_yield();
    const T r = buf[kf_tid() ^ o];
    kf_yield();
    return r;
}
template <class T> T __shfl_up_sync(unsigned, T v, int o) {
    static T buf[1024];
    buf[kf_tid()] = v;
    kf_yield();
    const T r = (kf_tid() & 31) >= o ? buf[kf_tid() - o] : v;
    kf_yield();
    return r;
}
template <class F> void kf_emu_launch(dim3 grid, dim3 block, F fn) {
    gridDim = dim3(std::min(grid.x, 3u), std::min(grid.y, 2u), 1);  // grid-stride loops step
    blockDim = block;
    const int n = block.x * block.y * block.z;
    const size_t stack = 256 << 10;
    std::function<void()> body = fn;
    kf_body = &body;
    kf_fiber* fibers = new kf_fiber[n];
    for (int t = 0; t < n; ++t) fibers[t].stack = static_cast<char*>(std::malloc(stack));
    kf_fibers = fibers;
    for (unsigned by = 0; by < gridDim.y; ++by)
        for (unsigned bx = 0; bx < gridDim.x; ++bx) {
            blockIdx = {bx, by, 0};
            for (int t = 0; t < n; ++t) {
                getcontext(&fibers[t].ctx);
                fibers[t].ctx.uc_stack.ss_sp = fibers[t].stack;
                fibers[t].ctx.uc_stack.ss_size = stack;
                fibers[t].ctx.uc_link = nullptr;
                makecontext(&fibers[t].ctx, kf_entry, 0);
                fibers[t].done = false;
            }
            for (int alive = n; alive > 0;) {
                alive = 0;
                for (int t = 0; t < n; ++t) {
                    if (fibers[t].done) continue;
                    kf_cur = t;
                    threadIdx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
                    swapcontext(&kf_sched, &fibers[t].ctx);
                    alive += !fibers[t].done;
                }
            }
        }
    for (int t = 0; t < n; ++t) std::free(fibers[t].stack);
    delete[] fibers;
}
"""
CTYPES = {"int64_t": ctypes.c_int64, "double": ctypes.c_double, "cudaStream_t": ctypes.c_void_p}


def _launches(cuda: str) -> str:
    """``k<<<grid, block, 0, stream>>>(args);`` as ``kf_emu_launch(grid, block, [&] { k(args); });``."""
    out, pos = [], 0
    for m in re.finditer(r"(\w+)<<<", cuda):
        end = cuda.index(">>>", m.end())
        parts, depth, start = [], 0, m.end()
        for i in range(m.end(), end):
            depth += {"(": 1, ")": -1}.get(cuda[i], 0)
            if cuda[i] == "," and depth == 0:
                parts.append(cuda[start:i].strip())
                start = i + 1
        close = cuda.index(");", end)
        out += [cuda[pos:m.start()], f"kf_emu_launch({parts[0]}, {parts[1]}, [&]() {{ {m.group(1)}{cuda[end + 3:close + 1]}; }})"]
        pos = close + 1
    return "".join(out) + cuda[pos:]


def build(cuda: str, folder: Path) -> ctypes.CDLL:
    source = EMULATION + _launches(cuda.replace("#include <cuda_runtime.h>", ""))
    source = re.sub(r"^cudaError_t (kf_\w+)\(", r'extern "C" cudaError_t \1(', source, flags=re.M)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    lib = folder / f"emu_{digest}.so"
    if not lib.exists():
        src = folder / f"emu_{digest}.cpp"
        src.write_text(source)
        proc = subprocess.run(["g++", "-O1", "-std=c++17", "-fPIC", "-shared", "-w", str(src), "-o", str(lib)],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"emulated build failed:\n{proc.stderr[-4000:]}")
    return ctypes.CDLL(str(lib))


class Extension:
    """The candidate's ``_ext``: each wrapper of CPP_SOURCE called on CPU tensors."""

    def __init__(self, lib: ctypes.CDLL, cpp: str) -> None:
        self.fns: dict[str, tuple[Any, list[bool]]] = {}
        for m in re.finditer(r"cudaError_t (kf_(\w+))\(([^)]*)\);", cpp):
            params = [p.strip().rsplit(" ", 1)[0] for p in m.group(3).split(",")]
            fn = getattr(lib, m.group(1))
            fn.argtypes = [ctypes.c_void_p if p.endswith("*") else CTYPES[p] for p in params]
            fn.restype = ctypes.c_int
            self.fns[m.group(2)] = (fn, [p.endswith("*") for p in params[:-1]])

    def __getattr__(self, name: str) -> Any:
        fn, pointers = self.fns[name]

        def call(*args: Any) -> None:
            values = [a.data_ptr() if p else a for a, p in zip(args, pointers, strict=True)]
            assert fn(*values, None) == 0

        return call


def load(candidate: str, folder: Path | None = None) -> ModuleType:
    """The candidate module with its extension emulated on the CPU."""
    from kforge.platforms.cuda import extract_constants

    consts = extract_constants(candidate)
    folder = folder or Path(tempfile.gettempdir()) / "kforge_cuda_emulation"
    folder.mkdir(parents=True, exist_ok=True)
    ext = Extension(build(str(consts["CUDA_SOURCE"]), folder), str(consts["CPP_SOURCE"]))
    module = ModuleType("kforge_emulated_candidate")
    module.__dict__["load_extension"] = lambda *a, **k: ext
    exec(compile(candidate.replace("from kforge.platforms.cuda_runtime import load_extension\n", ""),
                 "<cuda candidate>", "exec"), module.__dict__)
    return module
