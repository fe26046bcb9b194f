"""Where the relaxed fp16 GEMM core stands against the tensor cores, and what its variants buy.

    python benchmarks/gemm_core_probe_gpu.py run --out OUT/core.jsonl [--shape 1024,8192,8192]
    python benchmarks/gemm_core_probe_gpu.py table OUT/core.jsonl
    python benchmarks/gemm_core_probe_gpu.py smoke      # CPU: every kernel under the interpreter

The problem is an ``nn.Linear`` GEMM, ``out[M, N] = x[M, K] @ W[N, K]^T``, with x already in
fp16 (the candidate's precast pass) and W the module's fp32 weight. Every variant computes the
tile transposed (``acc[BN, BM] = W_tile . x_tile^T``) so W, rounded to fp16 in registers, is the
tensor cores' register operand (the expert's ``b_regs`` knob):

    ptr          pointer loads, one program per tile (the expert's kernel today)
    tma          W and x through host TMA descriptors, one program per tile
    tma_persist  TMA, one program per SM looping over tiles (x-tiles of one W row-block in a row)
    tma_ws       tma_persist with the loop warp-specialised (producer / consumer warps)
    fp16w_*      the same kernels with W precast to fp16 outside the timing: the GEMM's ceiling
                 when the weight's rounding is free (what a weight kept in fp16 would get)

beside cuBLAS (``torch.matmul``) in fp16 with W precast (the library's ceiling) and in fp32
(what eager runs). Each row: median ms (``triton.testing.do_bench``, L2 flushed), TFLOP/s,
the fraction of the 989 TFLOP/s dense fp16 peak, and max |err| against the fp16 cuBLAS result.
``run`` writes one JSON line per variant and skips those already written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import triton
import triton.language as tl

PEAK_FP16 = 989.0
# (BN: W rows in registers, BM: x rows, BK, num_warps, num_stages)
CONFIGS = [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 8, 4), (256, 128, 64, 8, 3),
           (128, 128, 128, 8, 3)]


@triton.jit
def _tile(t, num_m, GROUP_M: tl.constexpr):
    """(pid_n, pid_m) of tile ``t``: GROUP_M x-tiles of a W row-block in a row (W streams once)."""
    return t // num_m, t % num_m


@triton.jit
def k_ptr(w, x, out, M, N, K, BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, W16: tl.constexpr):
    num_m = tl.cdiv(M, BM)
    pid_n, pid_m = _tile(tl.program_id(0), num_m, 1)
    rn = pid_n * BN + tl.arange(0, BN)
    rm = pid_m * BM + tl.arange(0, BM)
    rk = tl.arange(0, BK)
    w_off = rn.to(tl.int64)[:, None] * K + rk[None, :]
    x_off = rm.to(tl.int64)[None, :] * K + rk[:, None]
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    for _ in range(0, K, BK):
        wt = tl.load(w + w_off).to(tl.float16)
        xt = tl.load(x + x_off)
        acc = tl.dot(wt, xt, acc)
        w_off += BK
        x_off += BK
    acc = tl.trans(acc)
    tl.store(out + rm.to(tl.int64)[:, None] * N + rn[None, :], acc)


@triton.jit
def k_tma(w_desc, x_desc, out, M, N, K, BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    num_m = tl.cdiv(M, BM)
    pid_n, pid_m = _tile(tl.program_id(0), num_m, 1)
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    for k in range(0, K, BK):
        wt = w_desc.load([pid_n * BN, k]).to(tl.float16)
        xt = x_desc.load([pid_m * BM, k])
        acc = tl.dot(wt, tl.trans(xt), acc)
    acc = tl.trans(acc)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    tl.store(out + rm.to(tl.int64)[:, None] * N + rn[None, :], acc)


@triton.jit
def k_tma_persist(w_desc, x_desc, out, M, N, K, BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
                  NUM_SMS: tl.constexpr, WS: tl.constexpr):
    num_m = tl.cdiv(M, BM)
    tiles = num_m * tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    for t in tl.range(tl.program_id(0), tiles, NUM_SMS, flatten=True, warp_specialize=WS):
        pid_n, pid_m = _tile(t, num_m, 1)
        acc = tl.zeros((BN, BM), dtype=tl.float32)
        for kk in range(k_tiles):
            wt = w_desc.load([pid_n * BN, kk * BK]).to(tl.float16)
            xt = x_desc.load([pid_m * BM, kk * BK])
            acc = tl.dot(wt, tl.trans(xt), acc)
        acc = tl.trans(acc)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        tl.store(out + rm.to(tl.int64)[:, None] * N + rn[None, :], acc)


def launch(variant: str, w: Any, x: Any, out: Any, cfg: tuple[int, int, int, int, int]) -> None:
    import torch

    bn, bm, bk, warps, stages = cfg
    n, k = w.shape
    m = x.shape[0]
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    if variant == "ptr":
        k_ptr[(tiles,)](w, x, out, m, n, k, BN=bn, BM=bm, BK=bk, W16=w.dtype == torch.float16,
                        num_warps=warps, num_stages=stages)
        return
    from triton.tools.tensor_descriptor import TensorDescriptor

    w_desc = TensorDescriptor.from_tensor(w, [bn, bk])
    x_desc = TensorDescriptor.from_tensor(x, [bm, bk])
    if variant == "tma":
        k_tma[(tiles,)](w_desc, x_desc, out, m, n, k, BN=bn, BM=bm, BK=bk, num_warps=warps, num_stages=stages)
        return
    sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 4
    k_tma_persist[(min(sms, tiles),)](w_desc, x_desc, out, m, n, k, BN=bn, BM=bm, BK=bk, NUM_SMS=min(sms, tiles),
                                      WS=variant == "tma_ws", num_warps=warps, num_stages=stages)


VARIANTS = ("ptr", "tma", "tma_persist", "tma_ws")


def plans(configs: list[tuple[int, int, int, int, int]]) -> list[tuple[str, bool, tuple[int, int, int, int, int]]]:
    """(variant, weight precast to fp16, config) for every kernel, then the cuBLAS rows."""
    out = [(v, w16, c) for w16 in (False, True) for v in VARIANTS for c in configs]
    return out


def measure(shape: tuple[int, int, int], out_path: Path, device: str, reps_ms: int = 100) -> None:
    import torch

    done = set()
    if out_path.exists():
        done = {json.loads(line)["name"] for line in out_path.read_text().splitlines() if line.strip()}
    m, n, k = shape
    gen = torch.Generator().manual_seed(0)
    x32 = torch.randn(m, k, generator=gen).to(device)
    w32 = (torch.randn(n, k, generator=gen) / k ** 0.5).to(device)
    x16, w16 = x32.half(), w32.half()
    flops = 2.0 * m * n * k
    ref = (x16.float() @ w16.float().t()) if device != "cuda" else torch.matmul(x16, w16.t()).float()
    rows: list[tuple[str, Any]] = []
    if device == "cuda":
        rows += [("cublas_fp16_w16", lambda: torch.matmul(x16, w16.t())),
                 ("cublas_fp32_eager", lambda: torch.matmul(x32, w32.t()))]
    out = torch.empty(m, n, device=device)
    for variant, precast, cfg in plans(CONFIGS if device == "cuda" else [(32, 32, 32, 4, 2)]):
        name = f"{'fp16w_' if precast else ''}{variant} {cfg[0]}x{cfg[1]}x{cfg[2]} w{cfg[3]} s{cfg[4]}"
        rows.append((name, (lambda v=variant, p=precast, c=cfg: launch(v, w16 if p else w32, x16, out, c))))
    with out_path.open("a") as f:
        for name, fn in rows:
            if name in done:
                continue
            rec: dict[str, Any] = {"name": name, "shape": list(shape)}
            try:
                out.fill_(float("nan"))
                got = fn()
                got = out if got is None else got
                rec["max_err"] = float((got.float() - ref).abs().max())
                if device == "cuda":
                    ms = triton.testing.do_bench(fn, warmup=25, rep=reps_ms)
                    rec.update(ms=ms, tflops=flops / ms / 1e9, peak=flops / ms / 1e9 / PEAK_FP16)
            except Exception as exc:  # a variant this Triton cannot build is a row, not a crash
                rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                traceback.print_exc(limit=1)
            f.write(json.dumps(rec) + "\n")
            f.flush()
            print(json.dumps(rec), flush=True)


def table(path: Path) -> str:
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    lines = ["| variant | ms | TFLOP/s | % fp16 peak | max abs err vs cuBLAS fp16 |", "|---|---|---|---|---|"]
    for r in sorted(recs, key=lambda r: r.get("ms", 1e9)):
        if "error" in r:
            lines.append(f"| {r['name']} | failed: {r['error'][:80]} | | | |")
            continue
        lines.append(f"| {r['name']} | {r['ms']:.4f} | {r['tflops']:.0f} | {100 * r['peak']:.0f} | {r['max_err']:.2e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--shape", default="1024,8192,8192")
    t = sub.add_parser("table")
    t.add_argument("path", type=Path)
    sub.add_parser("smoke")
    a = p.parse_args(argv)
    if a.cmd == "table":
        print(table(a.path))
        return 0
    if a.cmd == "smoke":
        import tempfile

        os.environ.setdefault("TRITON_INTERPRET", "1")
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "core.jsonl"
            measure((64, 64, 64), path, "cpu")
            recs = [json.loads(line) for line in path.read_text().splitlines()]
            bad = [r for r in recs if "error" in r or r["max_err"] > 0.05]
            for r in recs:
                print(r)
            return 1 if bad else 0
    shape = tuple(int(v) for v in a.shape.split(","))
    measure(shape, a.out, "cuda")  # type: ignore[arg-type]
    print(table(a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
