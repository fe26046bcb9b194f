"""Shared helpers for the expert tests: starter problems at odd sizes, candidates run in-process."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from kforge.problems import LoadedProblem, load_problem

STARTER = Path(__file__).resolve().parents[1] / "problems" / "starter"
STARTER_NAMES = (
    "elementwise_gelu_scale", "elementwise_swish_bias", "softmax_rows", "logsoftmax_rows",
    "layernorm_rows", "reduce_mean_rows", "reduce_max_rows", "gemm_bias_relu",
    "gemm_gelu_scale", "matmul_sigmoid_scale",
)
ODD = {"batch_size": 37, "dim": 131, "in_features": 67, "out_features": 45, "M": 37, "K": 67, "N": 45}


def odd_problem(name: str) -> LoadedProblem:
    """The starter problem with every size constant set to an odd, non-tile-multiple value."""
    path = STARTER / f"{name}.py"
    names = load_problem(path, preset="ci").sizes()
    return load_problem(path, preset="ci", sizes={k: v for k, v in ODD.items() if k in names})


def run_candidate(source: str) -> ModuleType:
    module = ModuleType("kforge_test_candidate")
    exec(compile(source, "<candidate>", "exec"), module.__dict__)
    return module


def compare(problem: LoadedProblem, candidate: ModuleType, seed: int = 0) -> tuple[bool, float]:
    init = problem.get_init_inputs()
    torch.manual_seed(seed)
    ref_model = problem.Model(*init)
    torch.manual_seed(seed)
    new_model = candidate.ModelNew(*init)
    torch.manual_seed(seed + 1)
    inputs = problem.get_inputs()
    with torch.no_grad():
        expected = ref_model(*[x.clone() for x in inputs])
        got: Any = new_model(*inputs)
    assert isinstance(got, torch.Tensor) and got.shape == expected.shape and got.dtype == expected.dtype
    ok = bool(torch.allclose(got, expected, atol=1e-4, rtol=1e-4)) and bool(torch.isfinite(got).all())
    return ok, float((got - expected).abs().max()) if got.numel() else 0.0


def triton_candidate(program: Any, policy: str, source: str, **gemm: Any) -> str:
    """The Triton candidate of ``program`` with round 0's knobs, ``gemm`` applied to every
    GEMM's knobs (then fitted, as every round's knobs are)."""
    from kforge.agents.expert.codegen.backend import get_backend
    from kforge.agents.expert.plan.knobs import TritonGemm

    triton = get_backend("triton")
    knobs = triton.default_knobs(program, policy).with_params(TritonGemm, gemm)
    return triton.render(program, triton.fit(program, knobs, policy), policy, source)


def gemm_knobs(**fields: Any) -> Any:
    """A Triton GEMM knob record: fp16x3's 128 x 128 x 64 tiles unless ``fields`` say otherwise."""
    from kforge.agents.expert.plan.knobs import TritonGemm

    base = dict(GROUP_M=8, precast=1, precision="fp16x3", BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8,
                num_stages=3, b_regs=1, tma=1)
    return TritonGemm(**{**base, **fields})
