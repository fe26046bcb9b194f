"""The platform seam: describe, one-shot example, build; verification and profiling run in a
sandboxed worker process that calls the platform's hooks (see ``kforge.worker``)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from typing import Protocol

from kforge.schema import BuildResult, OneShotExample, PlatformInfo

REFS_DIR = Path(__file__).resolve().parents[2] / "refs"


class Platform(Protocol):
    name: str
    language: str

    def describe(self) -> PlatformInfo:
        """Whether candidates can be built and run on this host, and if not, why."""
        ...

    def build(self, source: str, workdir: Path) -> BuildResult:
        """Compile the kernels a candidate module embeds (no execution of the candidate)."""
        ...

    def device(self) -> str:
        """The torch device string candidates run on ("cpu", "cuda")."""
        ...

    def worker_env(self, build_dir: Path) -> dict[str, str]:
        """Extra environment for the sandboxed worker that imports and runs candidates
        (e.g. ``TRITON_INTERPRET=1`` on a CPU-only host, where prebuilt libraries live)."""
        ...


def sandbox_inputs(platform: object, source: str, build_dir: Path) -> list[Path]:
    """What of the build folder a sandboxed run of ``source`` may see: the adapter's
    ``sandbox_inputs`` where it has one (the cpu platform: the candidate's own library), else the
    whole folder (Triton's and CUDA's caches and extension builds)."""
    own = getattr(platform, "sandbox_inputs", None)
    return list(own(source, build_dir)) if own is not None else [Path(build_dir)]


def candidate_file(workdir: Path, source: str, name: str = "candidate.py") -> Path:
    """Write ``source`` to ``<workdir>/candidates/<digest>/<name>`` (atomically) and return it.

    Compile jobs run concurrently over one shared build folder; a path of its own per source
    keeps one job from importing another's file. (They once shared ``<workdir>/candidate.py``:
    on the H200 a Triton check imported a CUDA candidate written there a moment later.)"""
    folder = Path(workdir) / "candidates" / hashlib.sha256(source.encode()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    tmp = folder / f".{name}.{os.getpid()}.tmp"
    tmp.write_text(source)
    os.replace(tmp, path)
    return path


def run_child(
    cmd: list[str], cwd: Path, timeout_s: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str] | None:
    """Run a build or check command (output captured as text); None when it ran past
    ``timeout_s`` (the adapter says what timed out)."""
    try:
        return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None


def load_example(platform: str, refs_dir: Path | None = None) -> OneShotExample:
    """Read ``refs/<platform>/{problem.py,solution.py,NOTES.md}``.

    An adapter may name its own folder with a ``refs_dir`` attribute (platforms that live
    outside this package); otherwise ``refs_dir / platform`` (default: the repo's ``refs/``).
    """
    if refs_dir is not None:
        folder = refs_dir / platform
    else:
        from kforge.platforms import get_platform

        folder = getattr(get_platform(platform), "refs_dir", None) or REFS_DIR / platform
    folder = Path(folder)
    missing = [f for f in ("problem.py", "solution.py", "NOTES.md") if not (folder / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"platform {platform!r} has no complete one-shot example in {folder}: missing {missing}"
        )
    return OneShotExample(
        platform=platform,
        problem_source=(folder / "problem.py").read_text(),
        solution_source=(folder / "solution.py").read_text(),
        notes=(folder / "NOTES.md").read_text(),
    )
