"""The precision ladder's error on the CPU: what each step's operand rounding does to one
``nn.Linear`` GEMM, simulated exactly in fp32 arithmetic.

    python benchmarks/half_split_error.py [--m 256] [--k 8192] [--n 8192] > benchmarks/results/half_split_error_cpu.md

A step's tensor-core products are products of 16-bit parts (bf16: 8 significant bits, fp16:
11, tf32: 11) accumulated in fp32; a product of two such parts is exact in fp32, so the CPU's
fp32 GEMM over the rounded parts (hi, and lo = round(x - hi) where split) gives the step's
numbers up to the accumulation order. ``x`` is ``randn`` and the weight ``nn.Linear``'s own
initialisation (|w| ~ 5e-3 at K = 8192: an fp16 lo part of ~5e-6 is subnormal unless stored
times 2^11, as the kernels do; ``fp16x3-unscaled`` is the split without that scaling). Printed per
step: the relative error norm and the worst elementwise error over the strict and the relaxed
allowance (``|err| / (tol + tol |ref|)``), against the fp32 reference (TF32 off) and the float64
one. This is what ``compiler.STEP_ERROR`` scales the fp16 steps by; the GPU measurement of the
bf16, tf32 and ieee steps is ``benchmarks/results/gemm_ladder_h200.md``.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
from datetime import UTC, datetime

import torch


def tf32(a: torch.Tensor) -> torch.Tensor:
    """fp32 rounded to TF32's 10 explicit mantissa bits (round half up on the bits)."""
    bits = a.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def parts(a: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) of ``a`` as fp32 tensors holding exactly the 16-bit (or TF32) values."""
    if kind == "tf32":
        hi = tf32(a)
        return hi, tf32(a - hi)
    if kind == "bf16":
        hi = a.to(torch.bfloat16).float()
        return hi, (a - hi).to(torch.bfloat16).float()
    # fp16: lo stored times 2^11 (a normal number where the plain lo is subnormal), its products
    # scaled back by 2^-11, exactly as triton_matmul's FP16_LO_SCALE does
    hi = a.to(torch.float16).float()
    return hi, ((a - hi) * 2048).to(torch.float16).float() / 2048


def unscaled_fp16(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp16 parts without the lo scaling (the kernels before it: a weight's lo is subnormal)."""
    hi = a.to(torch.float16).float()
    return hi, (a - hi).to(torch.float16).float()


def step_output(x: torch.Tensor, w: torch.Tensor, step: str) -> torch.Tensor:
    """``x @ w.T`` as the step computes it: 1, 2 (A split) or 3 (both split, lo*lo dropped) products.
    ``fp16x3-unscaled``: fp16x3 with plain lo parts."""
    step, _, variant = step.partition("-")
    kind, _, terms = step.partition("x")
    split = unscaled_fp16 if variant == "unscaled" else (lambda a: parts(a, kind))
    xh, xl = split(x)
    wh, wl = split(w)
    out = xh @ wh.T
    if terms == "3":
        return out + (xh @ wl.T + xl @ wh.T)
    if terms == "2":
        return out + xl @ wh.T
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=256)
    ap.add_argument("--k", type=int, default=8192)
    ap.add_argument("--n", type=int, default=8192)
    a = ap.parse_args()
    torch.manual_seed(0)
    x = torch.randn(a.m, a.k)
    w = torch.nn.Linear(a.k, a.n).weight.detach()
    ref = x @ w.T
    exact = x.double() @ w.double().T
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "unknown"
    print(f"# The ladder's steps on one nn.Linear GEMM, simulated on the CPU ({a.m} x {a.k} x {a.n})\n")
    print(f"- host: {platform.node()} ({platform.machine()}, torch {torch.__version__}), "
          f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}, commit {commit}")
    print("- `python benchmarks/half_split_error.py`; margins are the worst element's error over the allowance "
          "(strict 1e-4, relaxed 1e-2; above 1 fails)\n")
    print("| step | rel err norm (vs fp64) | strict margin vs fp32 ref | strict margin vs fp64 | relaxed margin vs fp32 ref |")
    print("|---|---|---|---|---|")
    for step in ("bf16", "fp16", "bf16x2", "fp16x2", "tf32", "bf16x3", "fp16x3-unscaled", "fp16x3", "tf32x3"):
        out = step_output(x, w, step).double()
        rel = float((out - exact).norm() / exact.norm())
        margin = {tol: float(((out - r).abs() / (tol + tol * r.abs())).max())
                  for tol, r in ((1e-4, ref.double()), (1e-2, ref.double()))}
        exact_margin = float(((out - exact).abs() / (1e-4 + 1e-4 * exact.abs())).max())
        print(f"| {step} | {rel:.2e} | {margin[1e-4]:.3g} | {exact_margin:.3g} | {margin[1e-2]:.3g} |")


if __name__ == "__main__":
    main()
