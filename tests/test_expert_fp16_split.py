"""The fp16 split steps store lo times 2^11 and sum its products in an accumulator of their own.

A plain fp16 lo part of a weight-sized value (|w| ~ 1e-3: lo ~ 2e-7) is subnormal and keeps a
few bits, which left fp16x3 at ~10x tf32x3's error and failed 020 / 045 / 048 under strict on
the H100. Checked here under the Triton interpreter against a float64 reference, with the
unscaled split computed alongside as the control that the check can fail."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kforge.agents.expert.codegen.backend import render_default
from kforge.agents.expert.codegen.triton.tiles import (
    ACC_REGS_LIMIT,
    acc_regs,
    at_step,
    check,
    fit_registers,
)
from kforge.agents.expert.plan.planner import plan_problem
from kforge.agents.expert.plan.precision import STEPS
from tests.test_expert_compiler import problem
from tests.test_expert_helpers import gemm_knobs, triton_candidate

K, N = 96, 40
SMALL_W = problem(f"self.w = nn.Parameter(torch.randn({K}, {N}) * 1e-3)", "return x @ self.w",
                  f"[torch.randn(12, {K})]")

RUNNER = """
import importlib.util, json, sys, torch
spec = importlib.util.spec_from_file_location("cand", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
ns = {}
exec(compile(open(sys.argv[2]).read(), "<p>", "exec"), ns)
torch.manual_seed(0)
ref = ns["Model"]()
new = mod.ModelNew()
new.load_state_dict(ref.state_dict())
x = torch.randn(12, int(sys.argv[3]))
with torch.no_grad():
    got = new(x).double()
exact = x.double() @ ref.w.detach().double()
print(json.dumps({"rel": float((got - exact).norm() / exact.norm())}))
"""


def _rel_error(knobs_for: dict, tmp_path: Path) -> float:
    import json

    prog = plan_problem(SMALL_W)
    cand, prob, runner = tmp_path / "cand.py", tmp_path / "prob.py", tmp_path / "run.py"
    cand.write_text(triton_candidate(prog, "strict", SMALL_W, **knobs_for))
    prob.write_text(SMALL_W)
    runner.write_text(RUNNER)
    proc = subprocess.run([sys.executable, str(runner), str(cand), str(prob), str(K)],
                          env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["rel"])


def _unscaled_fp16x3_error() -> float:
    """The control: the same GEMM with plain (unscaled) fp16 lo parts, in fp64 arithmetic."""
    torch.manual_seed(0)
    w = (torch.randn(K, N) * 1e-3)
    x = torch.randn(12, K)

    def split(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hi = a.to(torch.float16).float()
        return hi.double(), (a - hi).to(torch.float16).double()

    (xh, xl), (wh, wl) = split(x), split(w)
    exact = x.double() @ w.double()
    got = xh @ wh + xh @ wl + xl @ wh
    return float((got - exact).norm() / exact.norm())


@pytest.mark.parametrize("b_regs", [0, 1])
def test_fp16x3_keeps_a_small_weight_to_tf32x3_accuracy(b_regs: int, tmp_path: Path) -> None:
    tiles = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2, "precast": 1,
             "b_regs": b_regs}
    scaled = _rel_error({**tiles, "precision": "fp16x3"}, tmp_path)
    tf32x3 = _rel_error({**tiles, "precision": "tf32x3", "precast": 0, "b_regs": 0}, tmp_path)
    control = _unscaled_fp16x3_error()
    assert control > 1e-6, f"the control split should lose bits to subnormal lo parts: {control}"
    assert scaled < control / 10, f"fp16x3 {scaled} against the unscaled split's {control}"
    assert scaled < 3 * tf32x3 + 1e-7, f"fp16x3 {scaled} against tf32x3 {tf32x3}"


def test_fp16_splits_fit_two_accumulators_in_registers() -> None:
    wide = gemm_knobs(precision="fp16x3", BLOCK_N=256, BLOCK_K=32, b_regs=0, tma=0)
    assert acc_regs(wide) == 256 and acc_regs(gemm_knobs(precision="bf16x3", BLOCK_N=256)) == 128
    fitted = fit_registers(wide)
    assert (fitted.BLOCK_M, fitted.BLOCK_N) == (128, 128) and acc_regs(fitted) <= ACC_REGS_LIMIT
    assert fit_registers(gemm_knobs(precision="bf16x3", BLOCK_N=256)).BLOCK_N == 256  # one accumulator: as it was
    assert check(wide, "strict").BLOCK_N == 128  # knobs from the analysis are fitted too
    for step in ("fp16x2", "fp16x3"):
        assert acc_regs(at_step(gemm_knobs(), STEPS[step], 1024, 8192)) <= ACC_REGS_LIMIT
    source = render_default(plan_problem(SMALL_W), "triton", "strict", SMALL_W)
    assert "acc_lo = tl.zeros_like(acc)" in source and "acc += acc_lo * (1.0 / 2048)" in source
