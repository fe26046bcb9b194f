"""The expert's CUDA backend on a GPU (run on the H100 / H200 host): each candidate builds with
the cuda platform (load_inline: CUDA_SOURCE and the torch wrappers of CPP_SOURCE), computes
its reference at the ``ci`` sizes on the device within the policy's tolerance (strict: fp32
FMA GEMMs; relaxed: wmma TF32 GEMMs, which only a GPU runs), every kernel launched on the
tensors' device and PyTorch's current stream; and it is timed against eager (printed, not
asserted: the pipeline's timings decide)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from kforge.agents.expert.codegen.backend import render_default
from kforge.agents.expert.plan.planner import plan_problem
from kforge.platforms import get_platform
from kforge.problems import load_problem

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = [
    "starter/elementwise_gelu_scale", "starter/elementwise_swish_bias", "starter/softmax_rows",
    "starter/logsoftmax_rows", "starter/layernorm_rows", "starter/reduce_mean_rows", "starter/reduce_max_rows",
    "starter/gemm_bias_relu", "starter/gemm_gelu_scale", "starter/matmul_sigmoid_scale",
    "level1/003_batched_matmul", "level1/027_sum_dim1", "level1/030_argmax_last_dim", "level1/035_cumsum",
    "level1/011_conv2d_3x3", "level2/001_gemm_swish_scale", "level2/019_gemm_glu", "level2/020_bmm_scale_tanh",
    "level2/034_gemm_groupnorm_swish_multiply_swish", "level2/052_gain_matmul_softmax_dim0",
]
TOL = {"strict": 1e-4, "relaxed": 1e-2}


def built(name: str, policy: str, tmp_path: Path) -> tuple[ModuleType, object]:
    problem = load_problem(ROOT / "problems" / f"{name}.py", preset="ci")
    source = render_default(plan_problem(problem.source), "cuda", policy, problem.source)
    result = get_platform("cuda").build(source, tmp_path)
    assert result.ok, result.log
    spec = importlib.util.spec_from_file_location(f"cand_{Path(name).stem}_{policy}", result.artifact or "")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, problem


@pytest.mark.parametrize("policy", ["strict", "relaxed"])
@pytest.mark.parametrize("name", PROBLEMS)
def test_expert_cuda_candidates_compute_the_reference_on_the_gpu(name: str, policy: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from triton.testing import do_bench

    monkeypatch.setenv("KFORGE_CUDA_BUILD_ROOT", str(tmp_path / "cuda_ext"))
    module, problem = built(name, policy, tmp_path)
    tol = TOL[policy]
    torch.manual_seed(0)
    ref = problem.Model(*problem.get_init_inputs()).cuda()  # type: ignore[attr-defined]
    new = module.ModelNew(*problem.get_init_inputs()).cuda()  # type: ignore[attr-defined]
    new.load_state_dict(ref.state_dict())
    torch.manual_seed(1)
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in problem.get_inputs()]  # type: ignore[attr-defined]
    with torch.no_grad():
        expected, got = ref(*inputs), new(*inputs)
        torch.cuda.synchronize()
        got = got if isinstance(got, torch.Tensor) else got[0]
        expected = expected if isinstance(expected, torch.Tensor) else expected[0]
        assert got.shape == expected.shape and got.is_cuda and bool(torch.isfinite(got).all())
        assert torch.allclose(got.float(), expected.float(), atol=tol, rtol=tol), float((got - expected).abs().max())
        cand = do_bench(lambda: new(*inputs), return_mode="median")
        eager = do_bench(lambda: ref(*inputs), return_mode="median")
    print(f"\n[{name} {policy}] candidate {cand:.4f} ms, eager {eager:.4f} ms")
