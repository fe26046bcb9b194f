"""The expert's CUDA C++ generator on the starter problems, without a GPU: every module parses,
follows the cuda candidate convention, keeps the reference's constructor, and its CUDA_SOURCE
compiles with ``nvcc -arch=sm_90 -c`` (the cuda platform's CPU-host build) for the default plan
and a non-default one; compile errors come back in the build log. Nothing runs here: numerical
correctness and speed are checked on the GPU host."""

from __future__ import annotations

import ast
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from kforge.agents.expert.cuda_codegen import (
    PlanError,
    default_cuda_plan,
    generate_cuda,
    kernel_names,
    resolve_cuda_plan,
)
from kforge.agents.expert.fx_lower import lower_module
from kforge.agents.expert.graph import KernelGraph
from kforge.platforms.cuda import PLATFORM, extract_constants, find_nvcc
from kforge.problems import load_problem
from kforge.schema import BuildResult
from tests.test_expert_helpers import STARTER, STARTER_NAMES

torch = pytest.importorskip("torch")

# One non-default plan per problem: other block sizes, scalar (non-float4) paths, 3-pass
# softmax, small SIMT tiles; for two GEMMs the relaxed TF32 tensor-core kernel (both B layouts).
ALT: dict[str, tuple[str, dict[str, Any]]] = {
    "elementwise": ("strict", {"block_size": 128, "vector_width": 1}),
    "row_reduction": ("strict", {"block_size": 64, "vector_width": 1, "online_softmax": 0}),
    "gemm": ("strict", {"block_m": 64, "block_n": 32, "block_k": 8, "thread_m": 4, "thread_n": 2}),
}
ALT_TF32: dict[str, tuple[str, dict[str, Any]]] = {
    "gemm_bias_relu": ("relaxed", {}),  # B = nn.Linear weight [N, K]: col_major fragments
    "matmul_sigmoid_scale": ("relaxed", {"block_m": 64, "block_n": 64, "warp_m": 32, "warp_n": 32}),
}
CPU_ONLY = not torch.cuda.is_available()
needs_nvcc = pytest.mark.skipif(
    find_nvcc() is None or not CPU_ONLY,
    reason="needs nvcc on a CPU-only host (on a GPU host build runs load_inline: GPU tests)",
)


def problem_source(name: str) -> str:
    return load_problem(STARTER / f"{name}.py", preset="ci").source


def graph_of(name: str) -> KernelGraph:
    """The IR at the ci preset's sizes (the model and inputs built on the meta device)."""
    problem = load_problem(STARTER / f"{name}.py", preset="ci")
    with torch.device("meta"):
        return lower_module(problem.Model(*problem.get_init_inputs()), problem.get_inputs())


def alt_plan(name: str, graph: KernelGraph) -> tuple[str, dict[str, Any]]:
    return ALT_TF32.get(name) or ALT[graph.kind]


@pytest.fixture(scope="module")
def sources() -> dict[tuple[str, str], str]:
    out = {}
    for name in STARTER_NAMES:
        graph, src = graph_of(name), problem_source(name)
        out[(name, "default")] = generate_cuda(graph, {}, "strict", src)
        policy, plan = alt_plan(name, graph)
        out[(name, "alt")] = generate_cuda(graph, plan, policy, src)
    return out


def combined_candidate(modules: list[str]) -> str:
    """One candidate whose CUDA_SOURCE holds several modules' CUDA_SOURCE, each in its own
    namespace (``#include`` lines hoisted): the same device code in one nvcc run."""
    includes: list[str] = []
    bodies = []
    for i, module in enumerate(modules):
        lines = str(extract_constants(module)["CUDA_SOURCE"]).splitlines()
        includes += [ln for ln in lines if ln.startswith("#include")]
        body = "\n".join(ln for ln in lines if not ln.startswith("#include"))
        bodies.append(f"namespace kf_module_{i} {{\n{body}\n}}  // namespace kf_module_{i}\n")
    cuda = "\n".join(dict.fromkeys(includes)) + "\n" + "".join(bodies)
    return (
        f'CUDA_SOURCE = r"""{cuda}"""\nCPP_SOURCE = "unused"\nFUNCTIONS = ["kf_forward"]\n\n\n'
        "class ModelNew:\n    pass\n"
    )


@pytest.fixture(scope="module")
def builds(
    sources: dict[tuple[str, str], str], tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[str, str], BuildResult]:
    """Default-plan modules built one by one by the cuda platform, exactly as the pipeline
    would; the non-default ones in two combined translation units (nvcc's start-up dominates
    on a small host). Two nvcc processes at a time."""
    root = tmp_path_factory.mktemp("cuda_builds")
    jobs = {(name, "default"): sources[(name, "default")] for name in STARTER_NAMES}
    half = len(STARTER_NAMES) // 2
    for group, names in (("alt-a", STARTER_NAMES[:half]), ("alt-b", STARTER_NAMES[half:])):
        jobs[(group, "alt")] = combined_candidate([sources[(n, "alt")] for n in names])

    def build(key: tuple[str, str]) -> BuildResult:
        return PLATFORM.build(jobs[key], root / f"{key[0]}-{key[1]}")

    keys = sorted(jobs, key=lambda k: k[1] == "default")  # the big combined ones first
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = dict(zip(keys, pool.map(build, keys), strict=True))
    for group, names in (("alt-a", STARTER_NAMES[:half]), ("alt-b", STARTER_NAMES[half:])):
        for name in names:
            done[(name, "alt")] = done[(group, "alt")]
    return done


def _init_args(tree: ast.Module, cls: str) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    return [a.arg for a in item.args.args]
    raise AssertionError(f"no {cls}.__init__")


@pytest.mark.parametrize("variant", ["default", "alt"])
@pytest.mark.parametrize("name", STARTER_NAMES)
def test_module_follows_the_cuda_convention(
    sources: dict[tuple[str, str], str], name: str, variant: str
) -> None:
    source = sources[(name, variant)]
    tree = ast.parse(source)
    consts = extract_constants(source)  # CUDA_SOURCE / CPP_SOURCE / FUNCTIONS literals, ModelNew
    assert consts["FUNCTIONS"] == ["kf_forward"]
    assert "torch::Tensor kf_forward(" in str(consts["CPP_SOURCE"])
    assert "getCurrentCUDAStream()" in str(consts["CPP_SOURCE"])
    assert "#include <torch" not in str(consts["CUDA_SOURCE"])  # standalone TU
    assert _init_args(tree, "ModelNew") == _init_args(ast.parse(problem_source(name)), "Model")
    forward = next(
        item
        for node in tree.body
        if isinstance(node, ast.ClassDef) and node.name == "ModelNew"
        for item in node.body
        if isinstance(item, ast.FunctionDef) and item.name == "forward"
    )
    calls = [ast.unparse(n.func) for n in ast.walk(forward) if isinstance(n, ast.Call)]
    assert calls == ["_ext.kf_forward"], calls
    strict = variant == "default" or name not in ALT_TF32
    flags = ast.literal_eval(source.split("CUDA_FLAGS = ", 1)[1].split("\n", 1)[0])
    assert "--use_fast_math" not in flags
    assert ("wmma" in str(consts["CUDA_SOURCE"])) == (not strict)


@needs_nvcc
@pytest.mark.parametrize("variant", ["default", "alt"])
@pytest.mark.parametrize("name", STARTER_NAMES)
def test_cuda_source_compiles_for_sm90(
    builds: dict[tuple[str, str], BuildResult], name: str, variant: str
) -> None:
    result = builds[(name, variant)]
    assert result.ok, result.log
    assert "nvcc -arch=sm_90" in result.log and "registers" in result.log  # ptxas report
    assert "error" not in result.log.lower()
    if variant == "default" and name.startswith(("gemm", "matmul")):
        # The 8x8 micro-tile's 64 accumulators stay in registers. (Row kernels may show a few
        # bytes of stack: registers saved around IEEE division's slow-path call, once a row.)
        spills = [ln for ln in result.log.splitlines() if "spill stores" in ln]
        assert spills
        assert all(" 0 bytes spill stores, 0 bytes spill loads" in ln for ln in spills), spills


@needs_nvcc
def test_nvcc_errors_come_back_in_the_log(
    sources: dict[tuple[str, str], str], tmp_path: Path
) -> None:
    source = sources[("softmax_rows", "default")]
    # A broken source, and a plan the generator's checks would refuse forced into the source
    # (the kernel's own static_assert then stops nvcc and says why): both errors in one log.
    broken = source.replace("return 1.0f / (1.0f + expf(-x));", "return not_declared;", 1)
    broken = broken.replace("constexpr int KF_RB = 256;", "constexpr int KF_RB = 48;", 1)
    assert broken.count("not_declared") == 1 and broken.count("KF_RB = 48;") == 1
    result = PLATFORM.build(broken, tmp_path)
    assert not result.ok
    assert 'identifier "not_declared" is undefined' in result.log
    assert "block_size must be a multiple of 32" in result.log


def test_plans_are_checked_against_rules_and_policy() -> None:
    gemm, rows = graph_of("gemm_bias_relu"), graph_of("softmax_rows")
    with pytest.raises(PlanError, match="not allowed under the strict policy"):
        generate_cuda(gemm, {"precision": "tf32"}, "strict")
    with pytest.raises(PlanError, match="fast_math"):
        resolve_cuda_plan(rows, {"fast_math": 1}, "strict")
    with pytest.raises(PlanError, match="power of two"):
        resolve_cuda_plan(gemm, {"block_m": 96}, "strict")
    with pytest.raises(PlanError, match="shared memory"):
        resolve_cuda_plan(gemm, {"block_m": 256, "block_n": 256, "block_k": 64}, "strict")
    with pytest.raises(PlanError, match="threads a block"):
        resolve_cuda_plan(
            gemm, {"block_m": 256, "block_n": 256, "thread_m": 2, "thread_n": 2}, "strict"
        )
    with pytest.raises(PlanError, match="vector_width"):
        resolve_cuda_plan(rows, {"vector_width": 2}, "strict")
    with pytest.raises(PlanError, match="unknown precision policy"):
        resolve_cuda_plan(rows, {}, "fast")
    assert resolve_cuda_plan(rows, {"block_size": 512, "BLOCK_N": 7}, "strict")["block_size"] == 512
    assert default_cuda_plan(gemm)["precision"] == "fp32"
    assert default_cuda_plan(gemm, "relaxed")["precision"] == "tf32"
    assert resolve_cuda_plan(gemm, {"fast_math": 1}, "relaxed")["fast_math"] == 1


def test_knobs_reach_the_source(sources: dict[tuple[str, str], str]) -> None:
    gemm_alt = sources[("gemm_gelu_scale", "alt")]
    assert "KF_BM = 64, KF_BN = 32, KF_BK = 8" in gemm_alt and "KF_TM = 4, KF_TN = 2" in gemm_alt
    assert "B[gn * K + gk]" in gemm_alt  # nn.Linear weight read as [N, K]
    assert "B[gk * N + gn]" in sources[("matmul_sigmoid_scale", "default")]  # plain [K, N]
    tf32 = sources[("matmul_sigmoid_scale", "alt")]
    assert "KF_WM = 32, KF_WN = 32" in tf32 and "kf_wmma::row_major> b" in tf32
    assert "kf_wmma::col_major> b" in sources[("gemm_bias_relu", "alt")]
    online, three = sources[("softmax_rows", "default")], sources[("softmax_rows", "alt")]
    assert "kf_online_add(mx, sm, v)" in online and "kf_online_add(mx, sm, v)" not in three
    assert "constexpr int KF_RB = 64;" in three and "const bool vec = 1 == 4" in three
    ew = sources[("elementwise_gelu_scale", "default")]
    assert "constexpr int KF_BS = 256;" in ew and "const bool vec = 4 == 4" in ew
    assert kernel_names(ew) == ["kf_elementwise_kernel"]
    assert kernel_names(gemm_alt) == ["kf_gemm_kernel"]


def test_broadcast_operands_are_size_checked(sources: dict[tuple[str, str], str]) -> None:
    swish = sources[("elementwise_swish_bias", "default")]
    assert 'kf_check_numel(c1, cols, "bias");' in swish  # [N] bias per column
    assert "self.bias" in swish.split("def forward", 1)[1]
    norm = sources[("layernorm_rows", "default")]
    assert 'kf_check_numel(c1, cols, "norm.weight");' in norm
    assert "self.norm.weight, self.norm.bias" in norm
    linear = sources[("gemm_bias_relu", "default")]
    assert 'kf_check_numel(c2, N, "linear.bias");' in linear
    assert "_ext.kf_forward(x, self.linear.weight, self.linear.bias)" in linear
    assert "_ext.kf_forward(A, B)" in sources[("matmul_sigmoid_scale", "default")]


def test_without_problem_source_parameters_keep_their_names() -> None:
    source = generate_cuda(graph_of("gemm_gelu_scale"), {}, "strict")
    assert "self.linear = nn.Linear(1024, 1024, bias=True)" in source
    swish = generate_cuda(graph_of("elementwise_swish_bias"), {}, "strict")
    assert "_register(self, 'bias', [4096])" in swish
    compile(source, "<generated>", "exec")


def test_generation_is_deterministic() -> None:
    name = "layernorm_rows"
    first = generate_cuda(graph_of(name), {"block_size": 128}, "strict", problem_source(name))
    assert first == generate_cuda(
        graph_of(name), {"block_size": 128}, "strict", problem_source(name)
    )
