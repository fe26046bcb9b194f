"""GPU checks (run on the H200 host): the triton and cuda one-shot solutions and the expert's
generated Triton kernels build, verify against their references on the device, and are timed."""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kforge.platforms import get_platform
from kforge.platforms.base import load_example

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
ROOT = Path(__file__).resolve().parents[2]


def load_file(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def verify_and_time(
    problem: ModuleType, solution: ModuleType, tol: float = 1e-4
) -> dict[str, float]:
    from triton.testing import do_bench

    torch.manual_seed(0)
    ref = problem.Model(*problem.get_init_inputs()).cuda()
    torch.manual_seed(0)
    new = solution.ModelNew(*problem.get_init_inputs()).cuda()
    torch.manual_seed(1)
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in problem.get_inputs()]
    with torch.no_grad():
        expected, got = ref(*inputs), new(*inputs)
        torch.cuda.synchronize()
        assert got.shape == expected.shape and torch.isfinite(got).all()
        rel = float(torch.linalg.vector_norm(got - expected) / torch.linalg.vector_norm(expected))
        assert torch.allclose(got, expected, atol=tol, rtol=tol), float(
            (got - expected).abs().max()
        )
        assert rel < tol
        cand = do_bench(lambda: new(*inputs), return_mode="median")
        eager = do_bench(lambda: ref(*inputs), return_mode="median")
    stats = {"candidate_ms": cand, "eager_ms": eager, "rel_err": rel}
    print(f"\n[{solution.__name__}] {stats}")
    return stats


def test_describe_on_gpu_host() -> None:
    triton_info = get_platform("triton").describe()
    assert triton_info.runnable and not triton_info.interpreted
    cuda_info = get_platform("cuda").describe()
    assert cuda_info.runnable and cuda_info.can_build
    assert "TRITON_INTERPRET" not in get_platform("triton").worker_env(Path("/tmp/x"))


def test_triton_refs_build_verify_time(tmp_path: Path) -> None:
    example = load_example("triton")
    (tmp_path / "problem.py").write_text(example.problem_source)
    result = get_platform("triton").build(example.solution_source, tmp_path)
    assert result.ok, result.log
    assert "warm: one forward pass ran on cuda" in result.log
    problem = load_file(tmp_path / "problem.py", "triton_ref_problem")
    solution = load_file(Path(result.artifact or ""), "triton_ref_solution")
    verify_and_time(problem, solution)


def test_cuda_refs_build_verify_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    example = load_example("cuda")
    platform = get_platform("cuda")
    result = platform.build(example.solution_source, tmp_path)
    assert result.ok, result.log
    for key, value in platform.worker_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    (tmp_path / "problem.py").write_text(example.problem_source)
    problem = load_file(tmp_path / "problem.py", "cuda_ref_problem")
    sys.path.insert(0, str(ROOT))
    solution = load_file(next((tmp_path / "candidates").glob("*/candidate.py")), "cuda_ref_solution")
    built = list((tmp_path / "cuda_ext").iterdir())
    assert len(built) == 1 and built[0].name.startswith("kf_cuda_")  # reused, not rebuilt
    verify_and_time(problem, solution, tol=1e-5)


def test_cuda_concurrent_builds_do_not_collide(tmp_path: Path) -> None:
    base = load_example("cuda").solution_source
    variant = base.replace("constexpr int THREADS = 256;", "constexpr int THREADS = 128;")
    broken = base.replace("acc += v * v;", "acc += v * undefined_name;")
    assert variant != base and broken != base
    results: dict[str, Any] = {}

    def build(key: str, source: str) -> None:
        results[key] = get_platform("cuda").build(source, tmp_path / key)

    threads = [
        threading.Thread(target=build, args=(k, s))
        for k, s in (("a", base), ("b", variant), ("c", broken))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results["a"].ok, results["a"].log
    assert results["b"].ok, results["b"].log
    assert not results["c"].ok and "undefined_name" in results["c"].log
    names = {p.name for key in ("a", "b") for p in (tmp_path / key / "cuda_ext").iterdir()}
    assert len(names) == 2  # different sources, different digest-named extensions


@pytest.mark.parametrize(
    "name,policy,plan",
    [
        ("elementwise_gelu_scale", "strict", {}),
        ("softmax_rows", "strict", {}),
        ("layernorm_rows", "strict", {}),
        ("reduce_mean_rows", "strict", {"BLOCK_N": 1024}),
        ("gemm_bias_relu", "strict", {}),
        ("gemm_gelu_scale", "relaxed", {}),
        ("matmul_sigmoid_scale", "relaxed", {"precision": "bf16x3"}),
    ],
)
def test_generated_triton_on_gpu(
    name: str, policy: str, plan: dict[str, Any], tmp_path: Path
) -> None:
    from kforge.agents.expert.codegen.backend import get_backend
    from kforge.agents.expert.plan.planner import plan_problem
    from kforge.agents.expert.plan.record import dominant
    from kforge.agents.expert.plan.rounds import apply_action
    from kforge.problems import load_problem

    problem = load_problem(ROOT / "problems" / "starter" / f"{name}.py", preset="ci")
    program = plan_problem(problem.source)
    triton = get_backend("triton")
    knobs, _ = apply_action(triton.default_knobs(program, policy), dominant(program), "test", plan)
    source = triton.render(program, triton.fit(program, knobs, policy), policy, problem.source)
    (tmp_path / "cand.py").write_text(source)
    module = load_file(tmp_path / "cand.py", f"gen_{name}_{policy}")
    torch.manual_seed(0)
    ref = problem.Model(*problem.get_init_inputs()).cuda()
    new = module.ModelNew(*problem.get_init_inputs()).cuda()
    new.load_state_dict(ref.state_dict())
    tol = 1e-4 if policy == "strict" else 1e-2
    torch.manual_seed(1)
    inputs = [x.cuda() for x in problem.get_inputs()]
    with torch.no_grad():
        expected, got = ref(*inputs), new(*inputs)
    assert torch.allclose(got, expected, atol=tol, rtol=tol), float((got - expected).abs().max())
    assert (
        float(torch.linalg.vector_norm(got - expected) / torch.linalg.vector_norm(expected)) < tol
    )
    assert os.environ.get("TRITON_INTERPRET") != "1"
