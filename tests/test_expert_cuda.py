"""The expert's CUDA backend without a GPU: every candidate follows the cuda candidate
convention, keeps the reference's constructor, and its CUDA_SOURCE compiles with
``nvcc -arch=sm_90 -c`` (the cuda platform's CPU-host build) at both policies and for
non-default knobs (a thread a row, wider rows, tf32 and ieee GEMM tiles); its kernels compute
the reference's numbers under the CPU emulation of tests/platforms/cuda_emulation.py (not the
tf32 GEMM: that is the GPU tests'); compile errors come back in the build log; knobs are checked.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from kforge.agents.expert.codegen.backend import get_backend, render_default
from kforge.agents.expert.codegen.cuda.gemm import check
from kforge.agents.expert.errors import PlanError
from kforge.agents.expert.plan.knobs import CudaGemm, CudaRow
from kforge.agents.expert.plan.planner import plan_problem
from kforge.platforms.cuda import PLATFORM, extract_constants, find_nvcc
from kforge.schema import BuildResult
from tests.platforms import cuda_emulation
from tests.test_expert_helpers import STARTER, STARTER_NAMES, compare, odd_problem

CUDA = get_backend("cuda")
ROOT = Path(__file__).resolve().parents[1]
CPU_ONLY = not torch.cuda.is_available()
needs_nvcc = pytest.mark.skipif(
    find_nvcc() is None or not CPU_ONLY,
    reason="needs nvcc on a CPU-only host (on a GPU host build runs load_inline: GPU tests)",
)
# problems beyond the starters whose kernels cover what the starters do not: a scan, argmax,
# column sums, a batched GEMM, pooling, norms over a group view, a conv (implicit GEMM)
MORE = ("level1/035_cumsum", "level1/036_cumprod_reverse", "level1/030_argmax_last_dim", "level1/027_sum_dim1",
        "level1/003_batched_matmul", "level1/032_maxpool2d", "level1/026_groupnorm", "level1/011_conv2d_3x3",
        "level1/004_matmul_transposed_a", "level2/034_gemm_groupnorm_swish_multiply_swish",
        "level2/052_gain_matmul_softmax_dim0", "level1/038_smooth_l1_loss")


def source_of(name: str) -> str:
    path = STARTER / f"{name}.py" if "/" not in name else ROOT / "problems" / f"{name}.py"
    return path.read_text()


def candidate(name: str, policy: str = "strict", **row: Any) -> str:
    src = source_of(name)
    program = plan_problem(src)
    knobs = CUDA.default_knobs(program, policy)
    if row:
        knobs = knobs.with_params(CudaRow, row)
    return CUDA.render(program, CUDA.fit(program, knobs, policy), policy, src)


@pytest.fixture(scope="module")
def sources() -> dict[tuple[str, str], str]:
    out = {}
    for name in (*STARTER_NAMES, *MORE):
        out[(name, "strict")] = candidate(name)
        out[(name, "relaxed")] = candidate(name, "relaxed")
    out[("softmax_rows", "thread-a-row")] = candidate("softmax_rows", threads=1, rows=256)
    out[("layernorm_rows", "narrow")] = candidate("layernorm_rows", threads=64, rows=4)
    return out


def combined_candidate(modules: list[str]) -> str:
    """One candidate whose CUDA_SOURCE holds several modules' CUDA_SOURCE, each in its own
    namespace (``#include`` lines hoisted): the same device code in one nvcc run."""
    includes: list[str] = []
    bodies = []
    for i, module in enumerate(modules):
        lines = str(extract_constants(module)["CUDA_SOURCE"]).splitlines()
        includes += [ln for ln in lines if ln.startswith(("#include", "#define", "namespace kf_wmma"))]
        body = "\n".join(ln for ln in lines if not ln.startswith(("#include", "#define", "namespace kf_wmma")))
        bodies.append(f"namespace kf_module_{i} {{\n{body}\n}}  // namespace kf_module_{i}\n")
    cuda = "\n".join(dict.fromkeys(includes)) + "\n" + "".join(bodies)
    return (f'CUDA_SOURCE = r"""{cuda}"""\nCPP_SOURCE = "unused"\nFUNCTIONS = ["k0"]\n\n\n'
            "class ModelNew:\n    pass\n")


@pytest.fixture(scope="module")
def builds(sources: dict[tuple[str, str], str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, BuildResult]:
    """Every candidate's device code in two combined translation units (nvcc's start-up
    dominates on a small host), and the GEMM's two steps built alone, as the pipeline would."""
    root = tmp_path_factory.mktemp("cuda_builds")
    keys = sorted(sources)
    half = len(keys) // 2
    jobs = {"a": combined_candidate([sources[k] for k in keys[:half]]),
            "b": combined_candidate([sources[k] for k in keys[half:]]),
            "gemm-strict": sources[("gemm_bias_relu", "strict")], "gemm-relaxed": sources[("gemm_bias_relu", "relaxed")]}
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = dict(zip(jobs, pool.map(lambda k: PLATFORM.build(jobs[k], root / k), jobs), strict=True))
    return done


def _init_args(tree: ast.Module, cls: str) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    return [a.arg for a in item.args.args]
    raise AssertionError(f"no {cls}.__init__")


@pytest.mark.parametrize("name", STARTER_NAMES)
def test_module_follows_the_cuda_convention(sources: dict[tuple[str, str], str], name: str) -> None:
    for policy in ("strict", "relaxed"):
        source = sources[(name, policy)]
        consts = extract_constants(source)  # CUDA_SOURCE / CPP_SOURCE / FUNCTIONS literals, ModelNew
        cpp, cuda = str(consts["CPP_SOURCE"]), str(consts["CUDA_SOURCE"])
        assert "#include <torch" not in cuda  # standalone TU
        assert all(f"void {fn}(torch::Tensor" in cpp for fn in consts["FUNCTIONS"])  # type: ignore[union-attr]
        assert "getCurrentCUDAStream()" in cpp and "OptionalCUDAGuard" in cpp
        tree = ast.parse(source)
        assert _init_args(tree, "ModelNew") == _init_args(ast.parse(source_of(name)), "Model")
        forward = next(item for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "ModelNew"
                       for item in node.body if isinstance(item, ast.FunctionDef) and item.name == "forward")
        calls = {ast.unparse(n.func) for n in ast.walk(forward) if isinstance(n, ast.Call)}
        assert {f"_ext.{fn}" for fn in consts["FUNCTIONS"]} <= calls  # type: ignore[union-attr]
        assert not any(c.startswith(("torch.matmul", "F.", "torch.softmax")) for c in calls), calls
        flags = ast.literal_eval(source.split("CUDA_FLAGS = ", 1)[1].split("\n", 1)[0])
        assert "--use_fast_math" not in flags
        gemm = name.startswith(("gemm", "matmul"))
        assert ("wmma" in cuda) == (gemm and policy == "relaxed")  # strict: ieee FMA; relaxed: tf32


@needs_nvcc
def test_cuda_source_compiles_for_sm90(builds: dict[str, BuildResult]) -> None:
    for key, result in builds.items():
        assert result.ok, (key, result.log)
        assert "CUDA_SOURCE compiled with nvcc" in result.log and "registers" in result.log  # ptxas report
        assert "error" not in result.log.lower()
    for key in ("gemm-strict", "gemm-relaxed"):  # the 8 x 8 micro-tile's and the fragments' accumulators
        spills = [ln for ln in builds[key].log.splitlines() if "spill stores" in ln]  # stay in registers
        assert spills and all(" 0 bytes spill stores, 0 bytes spill loads" in ln for ln in spills), (key, spills)


@needs_nvcc
def test_the_torch_wrappers_compile(tmp_path: Path) -> None:
    """CPP_SOURCE (built only on a GPU host by the platform) against torch's headers here."""
    from torch.utils.cpp_extension import include_paths

    cpp = tmp_path / "wrappers.cpp"
    cpp.write_text(str(extract_constants(candidate("layernorm_rows"))["CPP_SOURCE"]))
    homes = [Path(h) for h in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda") if h]
    cuda_include = next((h / "include" for h in homes if (h / "include" / "cuda_runtime_api.h").is_file()), None)
    if cuda_include is None:
        pytest.skip("no CUDA headers (CUDA_HOME or /usr/local/cuda)")
    stub = tmp_path / "stub" / "c10" / "cuda" / "impl"  # generated by a CUDA build of torch; a CPU one lacks it
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n")
    flags = [f"-I{p}" for p in (*include_paths(), sysconfig.get_paths()["include"], cuda_include, tmp_path / "stub")]
    proc = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", *flags, str(cpp)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@needs_nvcc
def test_nvcc_errors_come_back_in_the_log(tmp_path: Path) -> None:
    source = candidate("softmax_rows")
    broken = source.replace("std::exp(", "not_declared(", 1)
    assert broken.count("not_declared") == 1
    result = PLATFORM.build(broken, tmp_path)
    assert not result.ok and 'identifier "not_declared" is undefined' in result.log


EMULATED = (*STARTER_NAMES, "level1/035_cumsum", "level1/036_cumprod_reverse", "level1/030_argmax_last_dim",
            "level1/027_sum_dim1", "level1/003_batched_matmul", "level1/004_matmul_transposed_a", "level1/026_groupnorm",
            "level1/032_maxpool2d", "level1/011_conv2d_3x3", "level2/052_gain_matmul_softmax_dim0",
            "level1/038_smooth_l1_loss")


@pytest.mark.skipif(sys.platform != "linux", reason="the emulation builds with g++ -fopenmp")
@pytest.mark.parametrize("name", EMULATED)
def test_kernels_compute_the_reference_under_emulation(name: str, tmp_path: Path) -> None:
    """Strict candidates (fp32 FMA GEMMs) at small, odd sizes against the reference; the
    row kernels also with a thread a row and with narrow rows."""
    problem = odd_problem(name) if "/" not in name else _small(name)
    variants: list[dict[str, Any]] = [{}]
    if name in ("softmax_rows", "reduce_max_rows", "layernorm_rows"):
        variants += [{"threads": 1, "rows": 256}, {"threads": 64, "rows": 2}]
    program = plan_problem(problem.source)
    for row in variants:
        knobs = CUDA.default_knobs(program, "strict")
        knobs = CUDA.fit(program, knobs.with_params(CudaRow, row) if row else knobs, "strict")
        module = cuda_emulation.load(CUDA.render(program, knobs, "strict", problem.source), tmp_path)
        ok, err = compare(problem, module)
        assert ok, (name, row, err)


def _small(name: str) -> Any:
    from kforge.problems import load_problem

    path = ROOT / "problems" / f"{name}.py"
    small = {k: min(v, 24) for k, v in load_problem(path, preset="ci").sizes().items() if isinstance(v, int)}
    return load_problem(path, preset="ci", sizes=small)


def test_knobs_are_checked_against_the_rules_and_the_policy() -> None:
    with pytest.raises(PlanError, match="not allowed under the strict policy"):
        check(CudaGemm("tf32", 128, 128, 32), "strict")
    with pytest.raises(PlanError, match="power of two"):
        CudaGemm("ieee", 96, 128, 16)
    with pytest.raises(PlanError, match="shared memory"):
        check(CudaGemm("ieee", 256, 256, 64, thread_m=16, thread_n=8), "strict")
    with pytest.raises(PlanError, match="threads a block"):
        check(CudaGemm("ieee", 256, 256, 8, thread_m=2, thread_n=2), "strict")
    with pytest.raises(PlanError, match="threads a block"):
        CudaRow(64, 32)
    with pytest.raises(PlanError, match="unknown precision policy"):
        check(CudaGemm("ieee", 128, 128, 16), "fast")
    with pytest.raises(PlanError, match="a step of the ladder"):
        CudaGemm("fp32", 128, 128, 16)
    program = plan_problem(source_of("gemm_bias_relu"))
    strict, relaxed = (CUDA.default_knobs(program, p).kernels["k0"] for p in ("strict", "relaxed"))
    assert (strict.precision, relaxed.precision) == ("ieee", "tf32")  # type: ignore[union-attr]
    assert CUDA.steps == ("tf32", "ieee")


def test_knobs_reach_the_source() -> None:
    program = plan_problem(source_of("gemm_gelu_scale"))
    knobs = CUDA.default_knobs(program, "strict")
    small = dataclasses.replace(knobs.kernels["k0"], block_m=64, block_n=32, block_k=8, thread_m=4, thread_n=2)
    source = CUDA.render(program, knobs.with_kernel("k0", small), "strict", source_of("gemm_gelu_scale"))
    assert "KF_BM = 64, KF_BN = 32, KF_BK = 8" in source and "KF_TM = 4, KF_TN = 2" in source
    assert "const int n = idx / KF_BK, kk = idx % KF_BK;" in source  # nn.Linear weight [N, K]: K fastest
    plain = candidate("matmul_sigmoid_scale")
    assert "const int kk = idx / KF_BN, n = idx % KF_BN;" in plain  # a plain [K, N] operand: N fastest
    assert "kf_wmma::col_major> b" in candidate("gemm_bias_relu", "relaxed")
    assert "kf_wmma::row_major> b" in candidate("matmul_sigmoid_scale", "relaxed")
    rows = candidate("softmax_rows", threads=1, rows=128)
    assert "kf_row_reduce" not in rows.split("CPP_SOURCE")[0].split("__global__", 1)[1]
    assert "dim3(128, 2)" in candidate("softmax_rows", threads=128, rows=2)


def test_generation_is_deterministic() -> None:
    assert candidate("layernorm_rows") == candidate("layernorm_rows")
    src = source_of("gemm_bias_relu")
    assert render_default(plan_problem(src), "cuda", "relaxed", src) == candidate("gemm_bias_relu", "relaxed")


@pytest.mark.skipif(sys.platform != "linux", reason="the emulation builds with g++ and ucontext")
def test_the_emulation_keeps_a_block_s_barriers(tmp_path: Path) -> None:
    """A negative control of the emulation: the block reduction of a row kernel without its
    barriers reads shared slots before the other threads wrote them, and the answer is wrong
    (fibers run to their next barrier in turn: drop the barriers and each runs alone)."""
    problem = odd_problem("layernorm_rows")
    program = plan_problem(problem.source)
    source = CUDA.render(program, CUDA.fit(program, CUDA.default_knobs(program, "strict"), "strict"), "strict",
                         problem.source)
    assert "__syncthreads();" in source
    ok, _ = compare(problem, cuda_emulation.load(source, tmp_path))
    assert ok
    broken = source.replace("__syncthreads();", ";")
    ok, err = compare(problem, cuda_emulation.load(broken, tmp_path))
    assert not ok, "the emulation computed the right answer without the block's barriers"
