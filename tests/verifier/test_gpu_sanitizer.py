"""GPU rows of the VERIFY.md matrix (run on the H200 host, ``pytest -m gpu``): compute-sanitizer
catches a planted out-of-bounds write (memcheck) and a shared-memory race (racecheck) in CUDA
C++ candidates built the way the cuda platform builds them, and passes the honest refs/cuda
solution under both tools."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from kforge.platforms import get_platform
from kforge.platforms.base import load_example
from kforge.verifier.sanitizer import SanitizerReport, find_sanitizer, sanitize_candidate

from .conftest import REPO, assert_nothing_left

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(find_sanitizer() is None, reason="needs compute-sanitizer"),
]

PROBLEM = REPO / "refs" / "cuda" / "problem.py"  # row-wise L2 normalisation, 256 x 1000 (ci keeps it)
HONEST = load_example("cuda").solution_source

# The last block's thread 0 also writes y[rows * cols]: one float past the end of the output.
# Every output value stays right, so only the sanitizer can tell.
_SCALE = "    for (int64_t c = threadIdx.x; c < cols; c += THREADS) out[c] = row[c] * s;\n"
OUT_OF_BOUNDS = HONEST.replace(
    _SCALE, _SCALE + "    if (blockIdx.x == gridDim.x - 1 && threadIdx.x == 0) out[cols] = 0.f;\n")

# The warp leaders write their partial sums to shared memory and warp 0 reads them with no
# __syncthreads() in between: a read-after-write race across warps.
_PARTIALS = "    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = acc;\n    __syncthreads();\n"
RACE = HONEST.replace(_PARTIALS, "    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = acc;\n")


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, Path]]:
    """Each candidate built by the cuda platform (in parallel) into its own build folder."""
    assert OUT_OF_BOUNDS != HONEST and RACE != HONEST  # the plants took
    root = tmp_path_factory.mktemp("sanitizer-builds")
    sources = {"honest": HONEST, "oob": OUT_OF_BOUNDS, "race": RACE}
    results: dict[str, object] = {}

    def build(key: str) -> None:
        results[key] = get_platform("cuda").build(sources[key], root / key)

    threads = [threading.Thread(target=build, args=(k,)) for k in sources]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for key in sources:
        result = results[key]
        assert getattr(result, "ok", False), f"{key} did not build:\n{getattr(result, 'log', result)}"
    return {key: (src, root / key) for key, src in sources.items()}


def _sanitize(builds: dict[str, tuple[str, Path]], key: str, tool: str) -> SanitizerReport:
    source, build_dir = builds[key]
    report = sanitize_candidate(source, PROBLEM, platform="cuda", tool=tool,  # type: ignore[arg-type]
                                build_dir=build_dir, timeout_s=300)
    print(f"\n[{key} / {tool}] {report.model_dump_json(indent=1)}")
    assert_nothing_left()
    assert_nothing_left("compute-sanitizer")
    return report


def test_memcheck_catches_a_write_one_past_the_output(builds: dict[str, tuple[str, Path]]) -> None:
    r = _sanitize(builds, "oob", "memcheck")
    assert r.available, r
    assert not r.ok and r.reason == "sanitizer_memcheck" and r.errors > 0, r
    assert r.exit_code == 86, r
    assert any("Invalid __global__ write" in f for f in r.findings), r.findings
    assert any("l2_normalize_rows" in f for f in r.findings), r.findings  # the kernel is named
    assert "/tmp/" not in "\n".join(r.findings)


def test_racecheck_catches_a_shared_memory_race(builds: dict[str, tuple[str, Path]]) -> None:
    r = _sanitize(builds, "race", "racecheck")
    assert r.available, r
    assert not r.ok and r.reason == "sanitizer_racecheck" and r.errors + r.warnings > 0, r
    assert r.findings and any("race" in f.lower() for f in r.findings), r.findings
    assert any("l2_normalize_rows" in f for f in r.findings), r.findings


@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_honest_refs_cuda_solution_is_clean(builds: dict[str, tuple[str, Path]], tool: str) -> None:
    r = _sanitize(builds, "honest", tool)
    assert r.available, r
    assert r.ok and r.reason is None and r.errors == 0 and r.warnings == 0, r
    assert r.exit_code == 0 and r.findings == [], r
