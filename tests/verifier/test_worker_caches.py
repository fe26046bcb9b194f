"""A worker's Triton cache is its own (kforge/verifier/runner.py::private_triton_cache): the
build folder's cache, where the compile stage put the candidate's kernels, is read-only in the
sandbox, and a shared cache must not take writes from candidate code."""

from __future__ import annotations

from pathlib import Path

from kforge.platforms import get_platform
from kforge.verifier.runner import private_triton_cache


def _build_cache(tmp_path: Path) -> Path:
    build = tmp_path / "build"
    entry = build / "triton_cache" / "ABCDEF"
    entry.mkdir(parents=True)
    (entry / "kernel.cubin").write_bytes(b"\x7fELF kernel")
    (entry / "kernel.json").write_text("{}")
    (build / "triton_cache" / "ABCDEF.lock").write_text("")
    return build


def test_a_candidate_job_starts_from_a_copy_of_the_build_cache(tmp_path: Path) -> None:
    build = _build_cache(tmp_path)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = dict(get_platform("triton").worker_env(build))
    assert env["TRITON_CACHE_DIR"] == str(build / "triton_cache")  # what the compile stage fills
    private_triton_cache(env, scratch, with_builds=True)
    private = Path(env["TRITON_CACHE_DIR"])
    assert private == scratch / "triton"
    assert (private / "ABCDEF" / "kernel.cubin").read_bytes() == b"\x7fELF kernel"
    assert not (private / "ABCDEF.lock").exists()  # lock files are not carried
    (private / "ABCDEF" / "kernel.cubin").write_bytes(b"poisoned")  # the candidate's copy only
    assert (build / "triton_cache" / "ABCDEF" / "kernel.cubin").read_bytes() == b"\x7fELF kernel"


def test_a_job_without_a_candidate_gets_an_empty_cache_of_its_own(tmp_path: Path) -> None:
    build = _build_cache(tmp_path)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = dict(get_platform("triton").worker_env(build))
    private_triton_cache(env, scratch, with_builds=False)  # reference and warm-up jobs
    assert env["TRITON_CACHE_DIR"] == str(scratch / "triton")
    assert not (scratch / "triton").exists()
    env = {"TRITON_CACHE_DIR": str(tmp_path / "missing")}
    private_triton_cache(env, scratch, with_builds=True)  # nothing built yet: nothing to copy
    assert env["TRITON_CACHE_DIR"] == str(scratch / "triton")
