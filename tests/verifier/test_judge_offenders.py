"""The judge issue's classes (issue 30), each a candidate that launches the real C++ kernel of
refs/cpu and reaches past its own calls another way, rejected with its reason code by
``kforge verify`` and by the timing path (``profile_candidate``, what ``kforge bench`` and the
pipeline's select time through); the honest control passes both. The pipeline's own run of
them is tests/llm/test_pipeline_offenders.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kforge.platforms.cpu import PLATFORM
from kforge.verifier.cli import main
from kforge.verifier.profiling import profile_candidate
from kforge.verifier.sandbox import isolation_available
from kforge.verifier.verify import reference_cache_dir

from . import cpu_offenders as off
from .conftest import assert_nothing_left


def _classes() -> dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]]:
    """name -> (source, verify's reasons, the timing path's reasons)."""
    return {
        "hook": (off.GLOBAL_HOOK, ("global_state_tampering",), ("global_state_tampering",)),
        "patch": (off.HARNESS_PATCH, ("harness_tampering",), ("harness_tampering",)),
        "reader": (off.reference_cache_reader(str(reference_cache_dir())), ("output_mismatch",), ("stale_output",)),
        "sampled": (off.SAMPLED_CACHE, ("stale_output",), ("stale_output",)),
        "numpy": (off.NUMPY_BLAS, ("foreign_compute",), ("foreign_compute",)),
    }


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("judge-build")


@pytest.mark.parametrize("name", ["hook", "patch", "reader", "sampled", "numpy"])
def test_kforge_verify_rejects_each_class(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if name == "reader" and isolation_available() == "setsid":
        pytest.skip("without bwrap or root the sandbox cannot hide the reference cache")
    source, verify_reasons, _ = _classes()[name]
    cand = tmp_path / "cand.py"
    cand.write_text(source)
    code = main([str(cand), "--problem", str(off.PROBLEM), "--build-dir", str(tmp_path / "build")])
    out = capsys.readouterr().out
    assert_nothing_left()
    assert code == 1 and any(f"reason={r}" in out for r in verify_reasons), out


@pytest.mark.parametrize("name", ["hook", "patch", "reader", "numpy"])  # sampled: test_checked_timing
def test_the_timing_path_rejects_each_class(name: str, build_dir: Path) -> None:
    """What gets past a verification (or a pipeline that times first) is caught where the
    timing runs: the judge's comparisons, the global state, the harness and the view are all
    outside the candidate's calls."""
    if name == "reader" and isolation_available() == "setsid":
        pytest.skip("without bwrap or root the sandbox cannot hide the reference cache")
    source, _, timing_reasons = _classes()[name]
    assert PLATFORM.build(source, build_dir).ok
    prof = profile_candidate(source, off.PROBLEM, platform="cpu", baselines=True, compile_baseline=False,
                             reps=10, threads=1, build_dir=build_dir, policy="strict")
    assert_nothing_left()
    assert prof.reason in timing_reasons, (prof.reason, prof.detail)


def test_the_honest_control_is_verified_and_timed_against_its_baselines(build_dir: Path) -> None:
    assert PLATFORM.build(off.HONEST, build_dir).ok
    prof = profile_candidate(off.HONEST, off.PROBLEM, platform="cpu", baselines=True, compile_baseline=False,
                             reps=10, threads=1, build_dir=build_dir, policy="strict")
    assert prof.ok, (prof.reason, prof.detail)
    assert prof.candidate is not None and prof.eager is not None
    assert len(prof.candidate.samples) == len(prof.eager.samples) == 10  # paired, rep by rep
    assert prof.extra["checked"].startswith("checked: ") and prof.extra["cpu_ms"]["used"] > 0


def test_kforge_bench_rejects_a_class_with_its_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from kforge.verifier.cli import bench_main

    cand = tmp_path / "cand.py"
    cand.write_text(off.GLOBAL_HOOK)
    code = bench_main([str(cand), "--problem", str(off.PROBLEM), "--build-dir", str(tmp_path / "build"), "--json",
                       "--eager-only", "--reps", "10", "--threads", "1"])
    got = json.loads(capsys.readouterr().out)
    assert code == 1 and got["reason"] == "global_state_tampering", got
