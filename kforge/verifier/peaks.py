"""Measured peaks of this host's device (copy bandwidth, fp32 matmul throughput), cached as
JSON keyed by host and device name, so roofline checks use numbers from this machine."""

from __future__ import annotations

import json
import os
import re
import socket
import time
from datetime import UTC, datetime
from pathlib import Path

from kforge.schema import Record
from kforge.verifier.device_lease import held


class Peaks(Record):
    host: str
    device: str
    device_name: str
    copy_gbps: float  # buffers far larger than the last-level cache: DRAM
    matmul_gflops: float  # fp32 (TF32 off)
    cache_copy_gbps: float = 0.0  # buffers that fit in the last-level cache
    read_gbps: float = 0.0  # a streaming reduction over the DRAM-sized buffer (reads only)
    rated_gbps: float = 0.0  # CUDA only: the driver's memory clock x bus width (0: unknown)
    tf32_gflops: float = 0.0  # CUDA only: TF32 tensor cores, fp32 accumulate
    bf16_gflops: float = 0.0  # CUDA only
    fma_gflops: float = 0.0  # CPU only: a register-resident FMA loop on every core (the ISA's peak)
    cores: int = 0  # CPU only: the cores the rates were measured on (0: unknown)
    measured_at: str = ""


def policy_matmul_gflops(peaks: Peaks, policy: str) -> float:
    """The fastest matmul rate a kernel may legitimately reach under ``policy``.

    strict allows split products (tf32x3, bf16x3: three products, two where the small term is
    dropped), so its ceiling is the faster of TF32's and bf16's rate / 2; relaxed allows TF32 and
    bf16 outright. A roofline built on the fp32 rate alone flagged an honest tf32x3 GEMM on the H200.

    On a CPU the ceiling is the FMA units' rate where it was measured: torch's fp32 matmul is a
    library's rate, not the hardware's, and an honest AVX-512 GEMM runs above it.
    """
    if policy == "relaxed":
        return max(peaks.matmul_gflops, peaks.fma_gflops, peaks.tf32_gflops, peaks.bf16_gflops)
    return max(peaks.matmul_gflops, peaks.fma_gflops, peaks.tf32_gflops / 2, peaks.bf16_gflops / 2)


def bandwidth_ceiling(peaks: Peaks) -> float:
    """The fastest a kernel may legitimately move bytes: the best of what was measured and the
    device's rated DRAM bandwidth. A copy reads and writes; a pure read streams faster (an
    honest Triton row mean read 4.4 TB/s on the H200, whose copy measured 3.8 TB/s)."""
    return max(peaks.copy_gbps, peaks.cache_copy_gbps, peaks.read_gbps, peaks.rated_gbps)


# CUdevice_attribute values from cuda.h (stable since CUDA 2.x)
_CU_MEMORY_CLOCK_RATE_KHZ = 36
_CU_GLOBAL_MEMORY_BUS_WIDTH_BITS = 37


def rated_dram_gbps(ordinal: int = 0) -> float:
    """2 x memory clock x bus width / 8 from the CUDA driver (``libcuda``), in GB/s; 0.0 when
    the driver cannot be asked. DDR memory moves two words per clock."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        dev, clock_khz, bus_bits = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
            return 0.0
        for value, attr in ((clock_khz, _CU_MEMORY_CLOCK_RATE_KHZ), (bus_bits, _CU_GLOBAL_MEMORY_BUS_WIDTH_BITS)):
            if cuda.cuDeviceGetAttribute(ctypes.byref(value), attr, dev) != 0:
                return 0.0
    except (OSError, AttributeError):
        return 0.0
    return 2.0 * clock_khz.value * 1e3 * bus_bits.value / 8 / 1e9


def device_name(device: str) -> str:
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name(torch.cuda.current_device())
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def _best_seconds(fn: object, device: str, reps: int) -> float:
    import torch

    best = float("inf")
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_peaks(device: str, cache_dir: Path) -> Peaks:
    """Best-of-N copy GB/s and fp32 matmul GFLOP/s; measured once per host and device."""
    name = device_name(device)
    host = socket.gethostname()
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"v5__{host}__{device}__{name}")[:200]
    path = Path(cache_dir) / f"peaks-{slug}.json"
    if path.is_file():
        try:
            return Peaks.model_validate_json(path.read_text())
        except ValueError:
            path.unlink(missing_ok=True)
    with held(device == "cuda", exclusive=True):  # rates measured with the device to itself
        peaks = _measure(device, host, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(peaks.model_dump(), indent=1))
    os.replace(tmp, path)
    return peaks


def _measure(device: str, host: str, name: str) -> Peaks:
    import torch

    n_copy = (256 if device == "cuda" else 32) * 1024 * 1024 // 4
    src = torch.ones(n_copy, device=device)
    dst = torch.empty_like(src)
    copy_s = _best_seconds(lambda: dst.copy_(src), device, 10)
    n_small = 2 * 1024 * 1024  # 2 x 8 MiB: resident in a CPU's L3 or a GPU's L2
    small_src, small_dst = src[:n_small], dst[:n_small]
    small_s = _best_seconds(lambda: small_dst.copy_(small_src), device, 20)
    read_s = _best_seconds(lambda: src.sum(), device, 10)
    size = 8192 if device == "cuda" else 1024
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    mm_s = _best_seconds(lambda: torch.mm(a, b), device, 5)
    tf32 = bf16 = 0.0
    if device == "cuda":
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            tf32 = 2 * size**3 / _best_seconds(lambda: torch.mm(a, b), device, 5) / 1e9
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous
        ah, bh = a.bfloat16(), b.bfloat16()
        bf16 = 2 * size**3 / _best_seconds(lambda: torch.mm(ah, bh), device, 5) / 1e9
    fma = cpu_fma_gflops() if device == "cpu" else 0.0
    peaks = Peaks(host=host, device=device, device_name=name, cores=len(os.sched_getaffinity(0)) if device == "cpu" else 0,
                  copy_gbps=2 * n_copy * 4 / copy_s / 1e9, matmul_gflops=2 * size**3 / mm_s / 1e9,
                  cache_copy_gbps=2 * n_small * 4 / small_s / 1e9, read_gbps=n_copy * 4 / read_s / 1e9,
                  rated_gbps=rated_dram_gbps(torch.cuda.current_device()) if device == "cuda" else 0.0,
                  tf32_gflops=tf32, bf16_gflops=bf16, fma_gflops=fma, measured_at=datetime.now(UTC).isoformat(timespec="seconds"))
    return peaks


FMA_SOURCE = r"""
#include <cstdint>
#include <omp.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__)
typedef __m512 kf_v;
#define KF_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define KF_SET(x) _mm512_set1_ps(x)
#elif defined(__AVX2__) && defined(__FMA__)
typedef __m256 kf_v;
#define KF_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define KF_SET(x) _mm256_set1_ps(x)
#else
typedef float kf_v;
#define KF_FMA(a, b, c) __builtin_fmaf(a, b, c)
#define KF_SET(x) (x)
#endif
#define KF_N 12
extern "C" double kf_fma_peak(int64_t iters, int64_t nthreads, int64_t* lanes) {
    *lanes = sizeof(kf_v) / sizeof(float);
    double total = 0.0;
    #pragma omp parallel num_threads(nthreads) reduction(+:total)
    {
        kf_v acc[KF_N];
        const kf_v m = KF_SET(0.9999999f), c = KF_SET(1e-7f);
        for (int i = 0; i < KF_N; ++i) acc[i] = KF_SET((float)(i + 1));
        for (int64_t it = 0; it < iters; ++it) {
            #pragma GCC unroll 12
            for (int i = 0; i < KF_N; ++i) acc[i] = KF_FMA(acc[i], m, c);  // independent chains
        }
        alignas(64) float out[sizeof(kf_v) / sizeof(float)];
        float s = 0.0f;
        for (int i = 0; i < KF_N; ++i) {
            *(kf_v*)out = acc[i];
            for (unsigned j = 0; j < sizeof(kf_v) / sizeof(float); ++j) s += out[j];
        }
        total += s;
    }
    return total;
}
"""
FMA_CHAINS = 12


def cpu_fma_gflops(iters: int = 2_000_000) -> float:
    """GFLOP/s of independent vector FMA chains in registers on every core this process may use
    (built with the CPU platform's flags); 0.0 where nothing can be built."""
    import ctypes

    from kforge.platforms import cpu_runtime

    try:
        path, _, _ = cpu_runtime.build_library(FMA_SOURCE)
    except cpu_runtime.CpuRuntimeError:
        return 0.0
    fn = ctypes.CDLL(str(path)).kf_fma_peak
    fn.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)]
    fn.restype = ctypes.c_double
    threads = len(os.sched_getaffinity(0))
    lanes = ctypes.c_int64(0)
    fn(iters // 10, threads, ctypes.byref(lanes))  # threads started, clocks up
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        fn(iters, threads, ctypes.byref(lanes))
        best = min(best, time.perf_counter() - t0)
    return 2.0 * lanes.value * FMA_CHAINS * iters * threads / best / 1e9
