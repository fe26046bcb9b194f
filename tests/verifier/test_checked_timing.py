"""Checked timing: offenders that launch a real C++ kernel and cheat only under repetition,
a clock forged from inside the worker, and the honest control (``cpu_offenders.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kforge.platforms.cpu import PLATFORM
from kforge.verifier.checks import static_check
from kforge.verifier.handshake import NULL_CALLS, Call, consistency
from kforge.verifier.profiling import profile_candidate

from . import cpu_offenders as off
from .conftest import assert_nothing_left


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("cpu-build")


def _profile(source: str, build_dir: Path) -> tuple[str, str]:
    assert PLATFORM.build(source, build_dir).ok
    prof = profile_candidate(source, off.PROBLEM, platform="cpu", reps=20, threads=1, build_dir=build_dir)
    assert_nothing_left()
    return prof.reason if not prof.ok else "ok", prof.detail


@pytest.mark.parametrize("name", ["STALE_AFTER_N", "CACHE_BY_KEY", "PARTIAL_ON_REPEAT", "WRITES_AFTER_RETURN"])
def test_offenders_under_repetition_are_stale_output(name: str, build_dir: Path) -> None:
    reason, detail = _profile(getattr(off, name), build_dir)
    assert reason == "stale_output", (reason, detail)


@pytest.mark.parametrize("name", ["FORGED_CLOCK_CANDIDATE_ONLY", "FORGED_CLOCK_ALL"])
def test_clock_forged_inside_the_worker_is_timing_inconsistent(name: str, build_dir: Path) -> None:
    reason, detail = _profile(getattr(off, name), build_dir)
    assert reason == "timing_inconsistent", (reason, detail)
    assert "parent's clock saw" in detail


def test_honest_slow_kernel_passes_the_parent_clock(build_dir: Path) -> None:
    assert _profile(off.SLOW_HONEST, build_dir) == ("ok", "")


def test_the_forge_that_passed_every_static_check_is_now_flagged() -> None:
    forge = '''
import torch
import torch.nn as nn
_t = torch.sys.modules["importlib"].import_module("kforge.verifier.timing")
_orig = _t.host_clock
def _fake(name, rep, fn):
    ms, out = _orig(name, rep, fn)
    held = getattr(fn, "__closure__", None) or ()
    return (ms / 20 if any(type(c.cell_contents).__name__ == "ModelNew" for c in held) else ms), out
_t.__dict__["host_clock"] = _fake
class ModelNew(nn.Module):
    def forward(self, x):
        return x
'''
    findings = [str(f) for f in static_check(forge, off.PROBLEM.read_text(), platform="cpu")]
    assert any("torch.sys.modules" in f for f in findings), findings
    assert any("__dict__" in f for f in findings) and any("__closure__" in f for f in findings), findings


def _calls(name: str, claimed_ms: float, wall_ms: float, cpu_ms: float, n: int = 20) -> list[Call]:
    ns = 1_000_000
    return [Call(name, r, int(wall_ms * ns), int(claimed_ms * ns), int(cpu_ms * ns), int(wall_ms * ns))
            for r in range(n)]


def test_consistency_rules() -> None:
    null = _calls("null", 0.001, 0.05, 0.0, NULL_CALLS)
    assert consistency(null + _calls("candidate", 3.0, 3.1, 3.0), 1, 20, ["candidate"]) == ""
    assert "parent's clock saw" in consistency(null + _calls("candidate", 0.15, 3.1, 3.0), 1, 20, ["candidate"])
    assert "cores" in consistency(null + _calls("candidate", 3.0, 3.1, 12.0), 2, 20, ["candidate"])
    assert "reached the parent" in consistency(null + _calls("candidate", 3.0, 3.1, 3.0, 5), 1, 20, ["candidate"])
    assert "calibration" in consistency(_calls("candidate", 3.0, 3.1, 3.0), 1, 20, ["candidate"])


@pytest.mark.parametrize("name", ["PARTIAL_ON_REPEAT"])  # STALE_AFTER_N: test_cli_verify's bench test
def test_verification_repeats_calls_and_catches_stale_answers(name: str, build_dir: Path) -> None:
    from kforge.verifier.verify import run_verification

    source = getattr(off, name)
    assert PLATFORM.build(source, build_dir).ok
    v = run_verification(source, off.PROBLEM, platform="cpu", policy="strict", build_dir=build_dir, timeout_s=120)
    assert_nothing_left()
    assert v.reason == "stale_output" and "repeat phase" in v.detail, (v.reason, v.detail)
