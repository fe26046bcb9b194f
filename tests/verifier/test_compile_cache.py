"""torch.compile's baseline from a warmed cache (kforge/verifier/compile_cache.py): the warm job
keeps the caches with a manifest; a timing job plants a copy and uses it only if every file
matches; anything else compiles from nothing and says so."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kforge.verifier.compile_cache import Seed, manifest_of, seed_from_record, warm
from kforge.verifier.profiling import profile_candidate

from .conftest import HONEST, SCALE_TANH


def _cache(folder: Path) -> Path:
    (folder / "inductor" / "fxgraph").mkdir(parents=True)
    (folder / "inductor" / "fxgraph" / "entry").write_bytes(b"graph")
    (folder / "triton" / "k").mkdir(parents=True)
    (folder / "triton" / "k" / "kernel.so").write_bytes(b"\x7fELF")
    (folder / "unrelated.txt").write_text("not a cache dir: not in the manifest")
    return folder


def test_the_manifest_hashes_every_cache_file_and_refuses_links(tmp_path: Path) -> None:
    folder = _cache(tmp_path / "warm")
    manifest = manifest_of(folder)
    assert sorted(manifest) == ["inductor/fxgraph/entry", "triton/k/kernel.so"]
    assert len(set(manifest.values())) == 2 and all(len(v) == 64 for v in manifest.values())
    os.symlink("/etc/hostname", folder / "triton" / "k" / "link")
    with pytest.raises(ValueError, match="not a plain file"):
        manifest_of(folder)


def test_a_matching_copy_is_planted(tmp_path: Path) -> None:
    folder = _cache(tmp_path / "warm")
    seed = Seed(folder, manifest_of(folder))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    seed(scratch)
    assert seed.status == "hit: 2 files"
    assert (scratch / "triton" / "k" / "kernel.so").read_bytes() == b"\x7fELF"
    assert not (scratch / "unrelated.txt").exists()


@pytest.mark.parametrize("tamper", ["changed", "added", "removed"])
def test_a_copy_that_differs_from_the_manifest_is_dropped(tmp_path: Path, tamper: str) -> None:
    folder = _cache(tmp_path / "warm")
    seed = Seed(folder, manifest_of(folder))
    target = folder / "inductor" / "fxgraph" / "entry"
    if tamper == "changed":
        target.write_bytes(b"another graph")
    elif tamper == "added":
        (folder / "triton" / "k" / "extra.py").write_text("print('hello')")
    else:
        target.unlink()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    seed(scratch)
    assert seed.status.startswith("cold: the warmed cache was not used (1 files differ")
    assert not (scratch / "inductor").exists() and not (scratch / "triton").exists()


def test_no_seed_without_a_warmed_folder(tmp_path: Path) -> None:
    assert seed_from_record(None) is None
    assert seed_from_record({"ok": False, "detail": "timeout"}) is None
    seed = seed_from_record({"ok": True, "folder": str(tmp_path), "manifest": {"triton/a": "0" * 64}})
    assert isinstance(seed, Seed) and seed.manifest == {"triton/a": "0" * 64}


@pytest.mark.slow
def test_a_warmed_compile_is_found_by_the_timing_job(tmp_path: Path) -> None:
    """The real thing on the CPU: warm compiles the reference with inductor, then a profile with
    both baselines plants the caches and its torch.compile finds them."""
    result = warm(SCALE_TANH, platform="cpu", dest=tmp_path / "cache", preset="ci", sizes=None,
                  build_dir=tmp_path / "build", threads=1, timeout_s=300)
    assert result["ok"], result["detail"]
    assert result["files"] > 0 and result["manifest"] == manifest_of(tmp_path / "cache")
    assert not any(name.endswith(".best_config") for name in result["manifest"])
    seed = seed_from_record(result)
    prof = profile_candidate(HONEST, SCALE_TANH, platform="cpu", baselines=True, reps=5, threads=1,
                             build_dir=tmp_path / "build", policy="strict", compile_cache=seed)
    assert prof.ok and prof.compiled is not None
    assert prof.extra["compile_cache"] == f"hit: {result['files']} files"



@pytest.mark.slow
def test_a_suite_warms_in_one_worker_and_a_broken_problem_spoils_only_its_own(tmp_path: Path) -> None:
    """Two problems and one whose reference raises, compiled by one worker into one folder:
    the two are ok with the folder's manifest, the broken one says why, and a timing job of the
    second problem finds its compile in the shared caches."""
    from kforge.verifier.compile_cache import warm_many

    broken = tmp_path / "broken.py"
    broken.write_text(SCALE_TANH.read_text().replace("def forward(self, x", "def forward(self, x_not_used=None, *, x"))
    softmax = Path(__file__).resolve().parents[2] / "problems" / "starter" / "softmax_rows.py"
    results = warm_many({"tanh": SCALE_TANH, "broken": broken, "softmax": softmax}, platform="cpu",
                        dest=tmp_path / "cache", preset="ci", sizes=None, build_dir=tmp_path / "build", threads=1,
                        timeout_s=300)
    assert results["tanh"]["ok"] and results["softmax"]["ok"], results
    assert results["tanh"]["folder"] == results["softmax"]["folder"] == str(tmp_path / "cache")
    assert results["softmax"]["manifest"] == manifest_of(tmp_path / "cache")
    assert not results["broken"]["ok"] and results["broken"]["detail"].startswith("harness_error: ")
    assert seed_from_record(results["broken"]) is None
    seed = seed_from_record(results["softmax"])
    from kforge.agents.expert.codegen.backend import render_default
    from kforge.agents.expert.plan.planner import plan_problem
    from kforge.platforms import get_platform
    from kforge.verifier.profiling import profile_candidate
    from kforge.verifier.runner import build_folder

    candidate = render_default(plan_problem(softmax.read_text()), "cpu", "strict", softmax.read_text())
    assert get_platform("cpu").build(candidate, build_folder("cpu", tmp_path / "build")).ok
    prof = profile_candidate(candidate, softmax, platform="cpu", preset="ci", baselines=True, reps=3, threads=1,
                             build_dir=tmp_path / "build", policy="strict", compile_cache=seed)
    assert prof.ok and prof.extra["compile_cache"] == f"hit: {results['softmax']['files']} files"

def test_warm_keeps_nothing_when_the_caches_hold_a_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A link among the worker's caches (kept as a link, never followed) fails the warm job with
    its reason; no folder is left for a timing job to plant."""
    from types import SimpleNamespace

    import kforge.verifier.compile_cache as compile_cache

    def fake_run_job(job: dict, *, keep_to: Path, **_: object) -> SimpleNamespace:
        _cache(keep_to)
        os.symlink("/etc/hostname", keep_to / "triton" / "k" / "link")
        frame = SimpleNamespace(header={"kind": "compile_cache", "phase_s": {}})
        return SimpleNamespace(reason=None, detail="", frames=[frame])

    monkeypatch.setattr(compile_cache, "run_job", fake_run_job)
    dest = tmp_path / "cache"
    result = warm(SCALE_TANH, platform="cpu", dest=dest, preset="ci", sizes=None, build_dir=tmp_path / "build",
                  threads=1)
    assert not result["ok"] and "not a plain file" in result["detail"]
    assert not dest.exists() and list(tmp_path.glob("cache.tmp-*")) == []
    assert seed_from_record(result) is None
