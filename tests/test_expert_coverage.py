"""Files nobody here wrote, and our new level2 problems, through generate + verify.

A sample of the public KernelBench files in ``../shared/kernelbench`` (read from there, never
copied) and of ``problems/level2``: the expert agent generates a candidate, the platform
builds it, the real verifier (sandboxed worker) checks it. CPU candidates run at the ``ci``
preset; Triton candidates run under the CPU interpreter at small explicit sizes (the
interpreter executes every program of the grid in Python). The outcome of each file is
collected for the terminal summary (``tests/conftest.py``), so CI's output carries it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kforge.agents.expert import ExpertAgent
from kforge.config import AgentConfig
from kforge.platforms.base import load_example
from kforge.schema import GenerationRequest
from kforge.verifier.preflight import build_candidate, resolve_platform
from kforge.verifier.runner import build_folder
from kforge.verifier.verify import verify_candidate

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "kernelbench"
AGENT = ExpertAgent(AgentConfig(kind="expert", model="kforge/expert-v1"))
COVERAGE: list[str] = []  # "platform file: verdict", read by the terminal summary

CPU_SAMPLE = [
    SHARED / "level1" / "24_LogSoftmax.py",
    SHARED / "level1" / "33_BatchNorm.py",
    SHARED / "level1" / "51_Argmax_over_a_dimension.py",
    ROOT / "problems" / "level2" / "019_gemm_glu.py",
    ROOT / "problems" / "level2" / "040_bmm_max_dim1_logsumexp.py",
    SHARED / "level2" / "1_Conv2D_ReLU_BiasAdd.py",  # a convolution as an implicit GEMM
]
TRITON_SAMPLE = [
    (SHARED / "level1" / "48_Mean_reduction_over_a_dimension.py", {"batch_size": 4, "dim1": 16, "dim2": 15}),
    (ROOT / "problems" / "level2" / "047_gemm_mish_gemm_softmax.py",
     {"batch_size": 8, "in_features": 32, "hidden_features": 48, "out_features": 16}),
    (SHARED / "level2" / "10_ConvTranspose2d_MaxPool_Hardtanh_Mean_Tanh.py",
     {"batch_size": 2, "in_channels": 4, "out_channels": 8, "height": 6, "width": 6}),
]


def _generate(path: Path, platform: str) -> str:
    req = GenerationRequest(problem_name=path.stem, problem_source=path.read_text(), platform=platform,
                            example=load_example(platform), policy="strict", round=0)
    result = AGENT.generate(req)
    assert result.source is not None, f"{path.name}: {result.extraction}"
    return result.source


def _verify(path: Path, platform: str, tmp_path: Path, sizes: dict[str, int] | None = None) -> None:
    if not path.is_file():
        pytest.skip(f"{path} is not here (the shared KernelBench folder travels beside the checkout)")
    source = _generate(path, platform)
    folder = build_folder(platform, tmp_path / "build").resolve()
    build_candidate(resolve_platform(platform), source, folder)
    verdict = verify_candidate(source, path, platform=platform, policy="strict", preset="ci",
                               sizes=sizes, trials=2, timeout_s=600, build_dir=folder)
    COVERAGE.append(f"{platform:7s} {path.parent.name}/{path.name}: {verdict.reason}")
    assert verdict.ok, f"{path.name}: {verdict.reason}: {verdict.detail[:500]}"


@pytest.mark.parametrize("path", CPU_SAMPLE, ids=lambda p: p.stem)
def test_cpu_generates_and_verifies(path: Path, tmp_path: Path) -> None:
    _verify(path, "cpu", tmp_path)


@pytest.mark.parametrize("path,sizes", TRITON_SAMPLE, ids=lambda p: getattr(p, "stem", ""))
def test_triton_generates_and_verifies_interpreted(path: Path, sizes: dict[str, int], tmp_path: Path) -> None:
    _verify(path, "triton", tmp_path, sizes)
