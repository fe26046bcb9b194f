"""The metal platform off macOS: unavailable with a reason, and build refuses without running."""

from __future__ import annotations

import platform as host_platform
from pathlib import Path

import pytest

from kforge.platforms import get_platform
from kforge.platforms.base import load_example
from kforge.platforms.metal import static_check

off_mac = pytest.mark.skipif(host_platform.system() == "Darwin", reason="checks a non-macOS host")


@off_mac
def test_describe_reports_unavailable_with_reason() -> None:
    info = get_platform("metal").describe()
    assert not info.runnable and not info.can_build
    assert "macOS" in info.reason and host_platform.system() in info.reason


@off_mac
def test_build_refuses_with_the_reason(tmp_path: Path) -> None:
    result = get_platform("metal").build(load_example("metal").solution_source, tmp_path)
    assert not result.ok and result.log.startswith("cannot build: Metal needs macOS")
    assert not any(tmp_path.iterdir())  # nothing written, nothing run


def test_refs_example_is_complete() -> None:
    example = load_example("metal")
    assert "kernel void hardswish" in example.solution_source
    assert "compile_shader" in example.notes
    assert static_check(example.solution_source) == []


def test_static_check_names_missing_pieces() -> None:
    assert any("METAL_SOURCE" in p for p in static_check("class ModelNew: pass\n"))
    assert any("ModelNew" in p for p in static_check("METAL_SOURCE = 'kernel void k() {}'\n"))
    assert static_check("def (:\n")[0].startswith("SyntaxError")
