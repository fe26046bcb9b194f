"""The ``tma`` GEMM knob: with the weight rounded in registers (``b_regs``), A's precast tiles and
B's fp32 tiles come through host TMA descriptors (4% faster than pointer loads on the H100,
``benchmarks/results/gemm_core_probe_h100.md``), and wherever an operand does not allow it (a
batch, a row stride or an address off 16 bytes) the same kernel runs its pointer loads.

Checked under the Triton interpreter (which runs descriptor loads): the numbers match the
pointer path's, the descriptors are really made where they can be, and refused where they
cannot, with a correct result either way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kforge.agents.expert.codegen.backend import get_backend, render_default
from kforge.agents.expert.errors import PlanError
from kforge.agents.expert.plan.knobs import TritonGemm
from kforge.agents.expert.plan.planner import plan_problem
from tests.test_expert_compiler import LINEAR, problem
from tests.test_expert_helpers import triton_candidate
from tests.test_expert_triton_bregs import LOAD

RUNNER = LOAD + """
shape = json.loads(sys.argv[4])
made = []  # per _kf_tma call: was a descriptor made?
if hasattr(mod, "_kf_tma"):
    real = mod._kf_tma
    def spy(*a):
        d = real(*a)
        made.append(d is not None)
        return d
    mod._kf_tma = spy
ref, new = pair()
x = torch.randn(*shape)
with torch.no_grad():
    want, got = ref(x), new(x)
margin = float(((got - want).abs() / (1e-2 + 1e-2 * want.abs())).max())
print(json.dumps({"margin": margin, "made": made, "out": got.flatten()[:64].tolist()}))
"""


def _run(source: str, tma: int, tmp_path: Path, init: list, shape: list) -> dict:
    prog = plan_problem(source)
    cand, prob, runner = tmp_path / f"cand{tma}.py", tmp_path / "prob.py", tmp_path / "run.py"
    cand.write_text(triton_candidate(prog, "relaxed", source, tma=tma))
    prob.write_text(source)
    runner.write_text(RUNNER)
    proc = subprocess.run([sys.executable, str(runner), str(cand), str(prob), json.dumps(init), json.dumps(shape)],
                          env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_descriptors_feed_the_k_loop_and_give_the_pointer_paths_numbers(tmp_path: Path) -> None:
    source = problem(LINEAR, "return torch.relu(self.linear(x)) * 0.5", "[torch.randn(8, 48)]", "[48, 40]")
    with_tma = _run(source, 1, tmp_path, [48, 40], [8, 48])
    without = _run(source, 0, tmp_path, [48, 40], [8, 48])
    assert with_tma["made"] == [True, True]  # A's fp16 precast and the fp32 weight
    assert without["made"] == []
    assert with_tma["margin"] < 0.5
    # the same rounded tiles, summed in the interpreter's order for each layout
    assert with_tma["out"] == pytest.approx(without["out"], rel=1e-6, abs=1e-6)
    assert with_tma["out"] != [0.0] * len(with_tma["out"])


def test_an_operand_tma_cannot_read_runs_the_pointer_loads(tmp_path: Path) -> None:
    # K = 36: A's fp16 rows are 72 bytes apart, off the 16 bytes a descriptor needs
    source = problem(LINEAR, "return self.linear(x) - 0.25", "[torch.randn(10, 36)]", "[36, 24]")
    got = _run(source, 1, tmp_path, [36, 24], [10, 36])
    assert got["made"] and not got["made"][0]
    assert got["margin"] < 0.5
    # a batched operand (bmm): no 2-D view covers it
    bmm = problem("", "return torch.bmm(x, x.transpose(1, 2)) * 0.25", "[torch.randn(2, 24, 40)]")
    got = _run(bmm, 1, tmp_path, [], [2, 24, 40])
    assert got["made"] and not any(got["made"])
    assert got["margin"] < 0.5


def test_the_knob_is_on_with_the_registers_path_and_checked() -> None:
    source = problem(LINEAR, "return self.linear(x)", "[torch.randn(8, 48)]", "[48, 40]")
    prog = plan_problem(source)
    knobs = next(kv for kv in get_backend("triton").default_knobs(prog, "relaxed").kernels.values()
                 if isinstance(kv, TritonGemm))
    assert knobs.tma == 1 and knobs.b_regs == 1
    rendered = render_default(prog, "triton", "relaxed", source)
    assert "TMA: tl.constexpr" in rendered and "b_desc.load(" in rendered
    assert "= _kf_tma(" not in triton_candidate(prog, "relaxed", source, tma=0)
    with pytest.raises(PlanError, match="tma"):
        knobs.with_params({"tma": 2})
