"""CPU-side checks of the triton platform: describe, static checks, build, and interpreted runs
of the one-shot solution and of the expert's generated kernels (TRITON_INTERPRET=1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kforge.platforms import get_platform
from kforge.platforms.base import load_example
from kforge.platforms.triton import static_check

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
CPU_ONLY = not torch.cuda.is_available()

# (name, policy, plan, sizes): small shapes that do not divide the blocks, so masks matter.
GENERATED_CASES = [
    (
        "elementwise_swish_bias",
        "strict",
        {"BLOCK": 256, "num_warps": 4},
        {"batch_size": 37, "dim": 100},
    ),
    ("softmax_rows", "strict", {}, {"batch_size": 9, "dim": 1000}),
    ("layernorm_rows", "strict", {"BLOCK_N": 256}, {"batch_size": 5, "dim": 1000}),
    ("reduce_max_rows", "strict", {}, {"batch_size": 7, "dim": 300}),
    (
        "gemm_gelu_scale",
        "strict",
        {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "precision": "tf32x3"},
        {"batch_size": 40, "in_features": 72, "out_features": 48},
    ),
    (
        "matmul_sigmoid_scale",
        "relaxed",
        {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "precision": "bf16x3", "precast": 1},
        {"M": 33, "K": 80, "N": 40},
    ),
    (
        "gemm_bias_relu",
        "relaxed",
        {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "precision": "bf16", "precast": 0},
        {"batch_size": 50, "in_features": 96, "out_features": 70},
    ),
]


def run_interpreted(cases: list[list[object]]) -> list[dict[str, object]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, str(HERE / "interp_check.py"), "batch", json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def interpreted_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, object]]:
    folder = tmp_path_factory.mktemp("broken")
    refs = ROOT / "refs" / "triton"
    broken = (
        (refs / "solution.py")
        .read_text()
        .replace("v = 2.0 * tl.sigmoid(2.0 * v) - 1.0", "v = tl.sigmoid(v)")
    )
    assert broken != (refs / "solution.py").read_text()
    (folder / "solution.py").write_text(broken)
    cases: list[list[object]] = [
        ["refs"],
        ["file", str(refs / "problem.py"), str(folder / "solution.py")],
    ]
    cases += [["gen", name, policy, plan, sizes] for name, policy, plan, sizes in GENERATED_CASES]
    return run_interpreted(cases)


@pytest.mark.skipif(not CPU_ONLY, reason="describes the CPU-only host")
def test_describe_cpu_host_is_interpreted() -> None:
    info = get_platform("triton").describe()
    assert info.runnable and info.can_build and info.interpreted
    assert "TRITON_INTERPRET" in info.reason
    assert get_platform("triton").worker_env(Path("/tmp/b"))["TRITON_INTERPRET"] == "1"
    assert get_platform("triton").device() == "cpu"


def test_static_check_catches_missing_pieces() -> None:
    assert static_check(load_example("triton").solution_source) == []
    assert any(
        "ModelNew" in p for p in static_check("import triton\n@triton.jit\ndef k(x):\n    pass\n")
    )
    assert any("triton.jit" in p for p in static_check("class ModelNew:\n    pass\n"))
    assert static_check("def broken(:\n")[0].startswith("SyntaxError")


def test_build_reports_syntax_error_without_running(tmp_path: Path) -> None:
    result = get_platform("triton").build("class ModelNew(:\n  pass\n", tmp_path)
    assert not result.ok and "SyntaxError" in result.log
    assert not (tmp_path / "candidates").exists()  # nothing written, nothing run


def test_build_reports_import_error(tmp_path: Path) -> None:
    source = load_example("triton").solution_source + "\nraise RuntimeError('boom at import')\n"
    result = get_platform("triton").build(source, tmp_path)
    assert not result.ok and "boom at import" in result.log


def test_build_warms_refs_solution(tmp_path: Path) -> None:
    example = load_example("triton")
    (tmp_path / "problem.py").write_text(example.problem_source)
    result = get_platform("triton").build(example.solution_source, tmp_path)
    assert result.ok, result.log
    assert "linear_tanh_kernel" in result.log and "warm: one forward pass" in result.log
    assert "triton" in result.tool_versions


def test_refs_solution_verifies_interpreted(interpreted_results: list[dict[str, object]]) -> None:
    assert interpreted_results[0]["ok"], interpreted_results[0]


def test_broken_solution_fails_interpreted(interpreted_results: list[dict[str, object]]) -> None:
    assert interpreted_results[1]["ok"] is False
    assert float(interpreted_results[1]["max_abs"]) > 1e-2  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "index", range(len(GENERATED_CASES)), ids=[c[0] + "-" + c[1] for c in GENERATED_CASES]
)
def test_generated_kernels_match_torch(
    index: int, interpreted_results: list[dict[str, object]]
) -> None:
    result = interpreted_results[2 + index]
    assert result["ok"], (GENERATED_CASES[index], result)


def test_concurrent_builds_in_one_folder_check_their_own_source(tmp_path: Path) -> None:
    """Two candidates built at once in the shared build folder: each check imports its own
    file (they once shared ``<build>/candidate.py``, and a check imported another job's)."""
    from concurrent.futures import ThreadPoolExecutor

    good = load_example("triton").solution_source
    bad = good + "\nraise RuntimeError('boom at import')\n"
    platform = get_platform("triton")
    with ThreadPoolExecutor(2) as pool:
        ok, failed = pool.map(lambda s: platform.build(s, tmp_path), [good, bad])
    assert ok.ok, ok.log
    assert not failed.ok and "boom at import" in failed.log
    assert len(list((tmp_path / "candidates").glob("*/candidate.py"))) == 2
