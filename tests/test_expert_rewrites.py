"""The expert's algebraic rewrites (:mod:`kforge.agents.expert.ir.rewrites`), the skinny-matmul
lowering, the size-generic capture of pools and init integers, and the roofline's rewritten work.

Plans are checked on inline KernelBench-style problems at tiny sizes; the rewritten candidates
are run on the CPU backend (real C++) against the reference at two sizes in-process, and a
few files go through the real verifier (sandboxed worker, ci preset), as the coverage run does.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kforge.agents.expert.ir.rewrites import _fold
from kforge.agents.expert.plan.kernels import GemmKernel, RowKernel
from kforge.agents.expert.plan.planner import plan_problem
from tests.test_expert_compiler import LINEAR, RUNNER, problem

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "kernelbench"


def _cpu_candidate(source: str, tmp_path: Path, name: str = "cand") -> object:
    """The CPU backend's candidate for ``source``, imported (its C++ built on first use)."""
    from kforge.agents.expert.codegen.backend import render_default

    path = tmp_path / f"{name}.py"
    path.write_text(render_default(plan_problem(source), "cpu", "strict", source))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _matches(mod: object, source: str, init: list, shapes: list[tuple[int, ...]]) -> None:
    """One candidate against the reference at every input shape (and these init inputs)."""
    ns: dict = {}
    exec(compile(source, "<problem>", "exec"), ns)
    for shape in shapes:
        torch.manual_seed(0)
        ref = ns["Model"](*init)
        new = mod.ModelNew(*init)  # type: ignore[attr-defined]
        new.load_state_dict(ref.state_dict())
        x = torch.randn(*shape)
        with torch.no_grad():
            torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------ fold_scalar_chain

def test_scalar_folds_are_exact_in_fp32_or_not_made():
    """Every fold the rule makes gives the reference's fp32 value bit for bit over a spread of
    inputs (normal range); the ones it refuses are those that would not."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(20000) * np.exp(rng.uniform(-20, 20, 20000))).astype(np.float32)
    consts = [2.0, 0.5, -4.0, 3.0, 0.1, -1.5, 7.0, 1 / 3]
    made = 0
    for (op1, c1), (op2, c2) in itertools.product(itertools.product(("mul", "div"), consts), repeat=2):
        f1, f2 = np.float32(c1), np.float32(c2)
        step1 = x * f1 if op1 == "mul" else x / f1
        ref = step1 * f2 if op2 == "mul" else step1 / f2
        folded = _fold((op1, float(f1)), (op2, float(f2)))
        pow2 = [float(np.frexp(abs(f))[0]) == 0.5 for f in (f1, f2)]
        if not any(pow2):
            assert folded is None  # two roundings against one: never folded
            continue
        assert folded is not None
        op, k = folded
        got = x * np.float32(k) if op == "mul" else x / np.float32(k)
        np.testing.assert_array_equal(got, ref)
        made += 1
    assert made > 30


def test_fold_rule_in_the_plan_and_additive_chains_left_alone():
    src = problem("", "return torch.relu(x * 2.0 * 3.0 - 1.0 + 1.0) / 1.0", "[torch.randn(4, 8)]")
    prog = plan_problem(src)
    assert "fold_scalar_chain" in prog.rewrites
    assert any("mul 2 mul 3 -> " in n and "mul 6" in n for n in prog.rewrite_notes)
    (k,) = prog.kernels
    ops = [e.op for st in k.stores for e in st.value.walk()]
    assert ops.count("mul") == 1 and "div" not in ops  # x * 6, and / 1 dropped
    assert ops.count("sub") == 1 and ops.count("add") == 1  # (.. - 1) + 1 is not x: kept


# ------------------------------------------------------------------ sum_through_linear

def test_sum_over_linear_outputs_is_a_gemv_with_the_summed_weight():
    src = problem(LINEAR, "y = self.linear(x) / 2.0\nreturn y.sum(dim=1, keepdim=True) * 1.5",
                  "[torch.randn(16, 32)]", "[32, 24]")
    prog = plan_problem(src)
    assert {"sum_through_linear", "skinny_matmul_as_reduction"} <= set(prog.rewrites)
    assert not any(isinstance(k, GemmKernel) for k in prog.kernels)
    rows = [k for k in prog.kernels if isinstance(k, RowKernel)]
    # the weight's rows summed from the parameter in the candidate (a column reduction of W),
    # then one row reduction over x with the division and scale in its outer store
    weight = next(b.name for b in prog.buffers.values() if b.source == "linear.weight")
    assert any(weight in {e.v for r in k.reductions for e in r.body.walk() if e.op == "load"} for k in rows)
    assert any(not k.red_inner for k in rows) and any(k.outer_stores and k.red_inner for k in rows)



def test_analysis_acts_on_the_rewritten_problem_s_largest_kernel():
    """After sum_through_linear the GEMM is gone: the dominant kernel is the one with the most
    work (the weight's column sum, N x K), not the first row kernel (the bias's sum, N)."""
    from kforge.agents.expert.plan.record import dominant, kernel_work

    src = problem(LINEAR, "return torch.tanh(self.linear(x).mean(dim=1, keepdim=True))",
                  "[torch.randn(16, 32)]", "[32, 24]")
    prog = plan_problem(src)
    work = {k.name: kernel_work(prog, k) for k in prog.kernels}
    assert len(work) >= 2 and len(set(work.values())) > 1
    assert dominant(prog) == max(work, key=work.__getitem__)
    assert work[dominant(prog)] == 24 * 32  # W's rows summed: out_features x in_features

@pytest.mark.parametrize("forward,applies", [
    ("return self.linear(x).mean(dim=1)", True),                      # bias, mean, no keepdim
    ("return torch.tanh((self.linear(x) + x[:, :1]).sum(1, keepdim=True))", True),  # residual
    ("return -(self.linear(x) * 3.0).sum(dim=(0, 1))", True),         # rows and columns
    ("return torch.sigmoid(self.linear(x)).sum(1)", False),           # not linear
    ("y = self.linear(x)\nreturn y.sum(1) + y[:, 0]", False),         # the GEMM is needed anyway
])
def test_sum_through_linear_applies_exactly_where_it_holds(forward: str, applies: bool, tmp_path: Path):
    src = problem(LINEAR, forward, "[torch.randn(16, 32)]", "[32, 24]")
    prog = plan_problem(src)
    assert ("sum_through_linear" in prog.rewrites) is applies
    assert any(isinstance(k, GemmKernel) for k in prog.kernels) is not applies
    if applies:  # the rewritten candidate against the reference, two batch sizes
        _matches(_cpu_candidate(src, tmp_path), src, [32, 24], [(16, 32), (37, 32)])


def test_batched_sum_over_the_batch_does_not_move():
    src = problem("self.w = nn.Parameter(torch.randn(3, 8, 5))", "return torch.bmm(x, self.w).sum(0)",
                  "[torch.randn(3, 4, 8)]")
    prog = plan_problem(src)
    assert "sum_through_linear" not in prog.rewrites


# ------------------------------------------------------------------ skinny matmuls

def test_gemv_and_skinny_matmuls_are_row_reductions(tmp_path: Path):
    gemv = problem("self.v = nn.Parameter(torch.randn(40, 1))", "return torch.matmul(x, self.v) + 1.0",
                   "[torch.randn(24, 40)]")
    prog = plan_problem(gemv)
    assert [k.kind for k in prog.kernels] == ["row"] and "skinny_matmul_as_reduction" in prog.rewrites
    assert prog.kernels[0].outer_stores  # the + 1.0 is the reduction's epilogue
    _matches(_cpu_candidate(gemv, tmp_path, "gemv"), gemv, [], [(24, 40), (7, 40)])
    three = gemv.replace("torch.randn(40, 1)", "torch.randn(40, 3)")
    prog = plan_problem(three)
    row = next(k for k in prog.kernels if isinstance(k, RowKernel))
    assert len(row.reductions) == 3  # three columns, one pass over x
    _matches(_cpu_candidate(three, tmp_path, "three"), three, [], [(24, 40), (5, 40)])
    one_row = problem(LINEAR, "return self.linear(x)", "[torch.randn(1, 40)]", "[40, 24]")
    prog = plan_problem(one_row)
    assert not any(isinstance(k, GemmKernel) for k in prog.kernels)
    _matches(_cpu_candidate(one_row, tmp_path, "onerow"), one_row, [40, 24], [(1, 40)])


def test_rewritten_candidate_under_the_triton_interpreter(tmp_path: Path):
    from kforge.agents.expert.codegen.backend import render_default

    src = problem(LINEAR, "return torch.tanh(self.linear(x).mean(dim=1, keepdim=True) * 2.0)",
                  "[torch.randn(8, 32)]", "[32, 24]")
    prog = plan_problem(src)
    assert "sum_through_linear" in prog.rewrites
    cand, prob, runner = tmp_path / "cand.py", tmp_path / "prob.py", tmp_path / "run.py"
    cand.write_text(render_default(prog, "triton", "strict", src))
    prob.write_text(src)
    runner.write_text(RUNNER)
    proc = subprocess.run([sys.executable, str(runner), str(cand), str(prob), "[32, 24]", "[(8, 32), (13, 32)]"],
                          env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


# ------------------------------------------------------------------ size-generic capture

def test_group_count_and_pooled_length_stay_symbolic(tmp_path: Path):
    gn = problem("self.gn = nn.GroupNorm(args[0], args[1])", "return self.gn(x)",
                 "[torch.randn(4, 32, 3)]", "[8, 32]")
    prog = plan_problem(gn)
    assert prog.fixed_init == {} and list(prog.init_sources.values()) == [0]
    assert [k.kind for k in prog.kernels] == ["row"]  # G * (C // G) is C again: one kernel
    mod = _cpu_candidate(gn, tmp_path, "gn")
    for groups in (8, 4, 16):  # one candidate, other group counts
        _matches(mod, gn, [groups, 32], [(4, 32, 3), (2, 32, 5)])
    pool = problem("self.pool = nn.MaxPool1d(args[0], stride=2, padding=1)", "return self.pool(x)",
                   "[torch.randn(2, 3, 40)]", "[3]")
    prog = plan_problem(pool)
    out = prog.buffers[prog.outputs[0]].shape
    assert not out[-1].is_number  # a floor-division of the input length, not 20
    assert prog.fixed_init == {0: 3}  # the window is a loop extent: built for 3 only
    mod = _cpu_candidate(pool, tmp_path, "pool")
    _matches(mod, pool, [3], [(2, 3, 40), (3, 5, 17)])
    with pytest.raises(ValueError, match="compiled for"):
        mod.ModelNew(4)  # type: ignore[attr-defined]


# ------------------------------------------------------------------ plan record and roofline

def test_plan_records_the_rewrites():
    from kforge.agents.expert import ExpertAgent
    from kforge.config import AgentConfig
    from kforge.platforms.base import load_example
    from kforge.schema import GenerationRequest

    path = ROOT / "problems" / "level2" / "015_gemm_div_sum_scale.py"
    req = GenerationRequest(problem_name=path.stem, problem_source=path.read_text(), platform="cpu",
                            example=load_example("cpu"), policy="strict", round=0)
    result = ExpertAgent(AgentConfig(kind="expert", model="kforge/expert-v1")).generate(req)
    assert result.source is not None
    assert result.plan["rewrites"] == ["sum_through_linear", "drop_dead", "skinny_matmul_as_reduction"]
    assert any(n.startswith("drop_dead") for n in result.plan["rewrite_notes"])  # the GEMM's chain


def test_roofline_counts_the_rewritten_work():
    """The floor must not make a correct GEMV candidate of a sum-over-Linear problem
    "faster than possible": the count is the rewritten program's, the bytes are unchanged."""
    from kforge.problem_cost import flops_and_bytes
    from kforge.problems import load_problem

    p = load_problem(ROOT / "problems" / "level2" / "015_gemm_div_sum_scale.py", preset="ci")
    s = p.sizes()
    m, k, n = s["batch_size"], s["in_features"], s["out_features"]
    flops, nbytes = flops_and_bytes(p)
    assert n * k + 2 * m * k <= flops <= n * k + 2 * m * k + 4 * m  # column sum + GEMV + tail
    assert nbytes == 4 * (m * k + n * k + m)
    # nothing to rewrite through a sigmoid: the GEMM's 2 M N K stays
    p = load_problem(ROOT / "problems" / "level2" / "006_gemm_sigmoid_rowsum.py", preset="ci")
    s = p.sizes()
    assert flops_and_bytes(p)[0] >= 2 * s["batch_size"] * s["in_features"] * s["out_features"]


# ------------------------------------------------------------------ the real verifier

VERIFIED = [
    ROOT / "problems" / "level2" / "015_gemm_div_sum_scale.py",
    ROOT / "problems" / "level1" / "007_gemv.py",
    ROOT / "problems" / "level1" / "026_groupnorm.py",
    SHARED / "level1" / "41_Max_Pooling_1D.py",
]


@pytest.mark.parametrize("path", VERIFIED, ids=lambda p: p.stem)
def test_rewritten_and_generic_candidates_verify_on_cpu(path: Path, tmp_path: Path):
    from tests.test_expert_coverage import _verify

    _verify(path, "cpu", tmp_path)
