"""The ``b_regs`` GEMM knob: A precast to bf16, B (the weight) loaded as fp32 and rounded [and
split] in registers, the tile computed transposed. The relaxed default takes it; every bf16 step
with it must give the same numbers as with both operands precast (checked under the Triton
interpreter against the fp32 reference, ragged sizes included, a bmm with a batch-strided B)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kforge.agents.expert.codegen.backend import get_backend, render_default
from kforge.agents.expert.codegen.triton.tiles import at_step, gemm_smem_bytes
from kforge.agents.expert.errors import PlanError
from kforge.agents.expert.plan.knobs import TritonGemm
from kforge.agents.expert.plan.planner import plan_problem
from kforge.agents.expert.plan.precision import STEPS
from tests.test_expert_compiler import LINEAR, problem
from tests.test_expert_helpers import triton_candidate

GEMM = problem(LINEAR, "return torch.relu(self.linear(x)) * 0.5", "[torch.randn(8, 48)]", "[48, 40]")
BMM = problem("", "return torch.bmm(x, x.transpose(1, 2)) * 0.25", "[torch.randn(2, 24, 40)]")

# A candidate (argv 1) and its problem (argv 2) loaded in a fresh interpreter; ``pair()`` builds
# Model and ModelNew from one seed with the same weights (init arguments: argv 3, JSON).
LOAD = """
import importlib.util, json, sys, torch
spec = importlib.util.spec_from_file_location("cand", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
ns = {}
exec(compile(open(sys.argv[2]).read(), "<p>", "exec"), ns)
init = json.loads(sys.argv[3])


def pair():
    torch.manual_seed(0)
    ref = ns["Model"](*init)
    new = mod.ModelNew(*init)
    new.load_state_dict(ref.state_dict())
    return ref, new
"""

RUNNER = LOAD + """
shapes, tol = json.loads(sys.argv[4]), float(sys.argv[5])
worst = 0.0
for shape in shapes:
    ref, new = pair()
    x = torch.randn(*shape)
    with torch.no_grad():
        want, got = ref(x), new(x)
    assert got.shape == want.shape, (got.shape, want.shape)
    worst = max(worst, float(((got - want).abs() / (tol + tol * want.abs())).max()))
print(json.dumps({"margin": worst}))
"""


def _margin(source: str, knobs_for: dict, tmp_path: Path, init: list, shapes: list, tol: float) -> float:
    """max |err| / (tol + tol |ref|) of the candidate rendered with ``knobs_for`` over ``shapes``."""
    import json

    prog = plan_problem(source)
    cand, prob, runner = tmp_path / "cand.py", tmp_path / "prob.py", tmp_path / "run.py"
    cand.write_text(triton_candidate(prog, "relaxed", source, **knobs_for))
    prob.write_text(source)
    runner.write_text(RUNNER)
    proc = subprocess.run([sys.executable, str(runner), str(cand), str(prob), json.dumps(init), json.dumps(shapes),
                           str(tol)], env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["margin"])


def test_relaxed_default_is_fp16_with_the_weight_rounded_in_registers() -> None:
    prog = plan_problem(GEMM)
    triton = get_backend("triton")
    knobs = next(kv for kv in triton.default_knobs(prog, "relaxed").kernels.values() if isinstance(kv, TritonGemm))
    assert knobs.precision == "fp16" and knobs.b_regs == 1 and knobs.precast == 1
    source = render_default(prog, "triton", "relaxed", GEMM)
    assert source.count("= _kf_precast(") == 1  # only A takes a pass of its own
    assert "acc = tl.trans(acc)" in source
    # bf16x3 leaves the registers path (both operands precast); fp16x3 keeps it (faster on the H100)
    assert at_step(knobs, STEPS["bf16x3"], 1024, 8192).b_regs == 0
    up = at_step(knobs, STEPS["fp16x3"], 1024, 8192)
    assert up.b_regs == 1 and up.precast == 1
    strict = next(kv for kv in triton.default_knobs(prog, "strict").kernels.values() if isinstance(kv, TritonGemm))
    assert strict.precision == "fp16x3" and strict.b_regs == 1
    # B held as fp32 in shared memory: 4 bytes an element in the pipeline's budget
    assert gemm_smem_bytes(knobs.with_params({"b_regs": 1})[0]) > gemm_smem_bytes(knobs.with_params({"b_regs": 0})[0])
    with pytest.raises(PlanError, match="b_regs"):
        knobs.with_params({"b_regs": 2})


@pytest.mark.parametrize("precision", ["bf16", "bf16x2", "bf16x3", "fp16", "fp16x2", "fp16x3"])
def test_b_regs_gives_the_precast_numbers(precision: str, tmp_path: Path) -> None:
    """Each step's error with B rounded in registers equals its error with B precast (the same
    rounding, only where it happens differs), on ragged sizes (masks on every edge)."""
    tiles = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "num_warps": 4, "num_stages": 2, "precision": precision,
             "precast": 1}
    shapes = [[8, 48], [21, 48]]
    tol = 1e-4 if precision.endswith("x3") else 1e-2
    regs = _margin(GEMM, {**tiles, "b_regs": 1}, tmp_path, [48, 40], shapes, tol)
    cast = _margin(GEMM, {**tiles, "b_regs": 0}, tmp_path, [48, 40], shapes, tol)
    assert regs < 1.0, f"{precision} with b_regs misses its tolerance: margin {regs}"
    # A three-term split's error is fp32 accumulation noise (~1e-8 here, a margin of ~1e-3 at tol
    # 1e-4): where the rounding happens changes the order of the fp32 sums, so the errors agree to
    # that noise (margin 1e-4 = an error of 1e-8), not bit for bit (Triton 3.9's interpreter gave
    # 1.04e-3 against 1.12e-3 for fp16x3). A one- or two-term split's error is the rounding itself.
    noise = 1e-4 if precision.endswith("x3") else 1e-6
    assert regs == pytest.approx(cast, rel=1e-3, abs=noise)


def test_b_regs_on_a_bmm_with_a_transposed_operand(tmp_path: Path) -> None:
    tiles = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 4, "num_stages": 2, "precision": "bf16",
             "precast": 1, "b_regs": 1}
    assert _margin(BMM, tiles, tmp_path, [], [[2, 24, 40], [3, 17, 33]], 1e-2) < 1.0
