"""The ``metal`` platform: Metal Shading Language kernels on Apple GPUs through PyTorch MPS.

A candidate holds a ``METAL_SOURCE`` string constant, compiles it at import with
``torch.mps.compile_shader`` and calls its kernels on ``mps`` tensors (see refs/metal/).
Runnable only on macOS with an MPS device and a torch that has ``torch.mps.compile_shader``
(2.6+); anywhere else ``describe`` reports the platform unavailable and says why, and
``build`` fails with that reason without running anything.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import platform as host_platform
import sys
import time
from pathlib import Path

from kforge.platforms.base import candidate_file, run_child
from kforge.schema import BuildResult, PlatformInfo

CANDIDATE_FILE = "candidate.py"
BUILD_TIMEOUT_S = 120.0
REPO_ROOT = Path(__file__).resolve().parents[2]

_COMPILE_SCRIPT = r"""
import ast, sys, torch
tree = ast.parse(open(sys.argv[1]).read())
src = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
           and getattr(n.targets[0], "id", "") == "METAL_SOURCE")
lib = torch.mps.compile_shader(src)
print("compiled Metal library:", lib)
"""


def unavailable_reason() -> str | None:
    """Why Metal candidates cannot run here, or None when they can."""
    if host_platform.system() != "Darwin":
        return f"Metal needs macOS with an Apple GPU; this host is {host_platform.system()}"
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    if not torch.backends.mps.is_available():
        return "torch reports no MPS device (torch.backends.mps.is_available() is False)"
    if not hasattr(torch.mps, "compile_shader"):
        return f"torch {torch.__version__} has no torch.mps.compile_shader (needs 2.6 or later)"
    return None


def static_check(source: str) -> list[str]:
    """Syntax, a module-level ``ModelNew`` and a ``METAL_SOURCE`` string literal."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        return [f"SyntaxError: {err.msg} (line {err.lineno})\n{err.text or ''}"]
    problems = []
    if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body):
        problems.append("no module-level class ModelNew")
    has_source = any(
        isinstance(n, ast.Assign)
        and isinstance(n.targets[0], ast.Name)
        and n.targets[0].id == "METAL_SOURCE"
        and isinstance(n.value, ast.Constant)
        and isinstance(n.value.value, str)
        for n in tree.body
    )
    if not has_source:
        problems.append("no module-level METAL_SOURCE string constant")
    return problems


class MetalPlatform:
    name = "metal"
    language = "metal shading language (torch.mps.compile_shader)"

    def describe(self) -> PlatformInfo:
        reason = unavailable_reason()
        if reason is not None:
            return PlatformInfo(
                name=self.name,
                language=self.language,
                runnable=False,
                can_build=False,
                reason=reason,
                missing=["macOS + MPS"],
            )
        return PlatformInfo(name=self.name, language=self.language, runnable=True, can_build=True)

    def device(self) -> str:
        return "mps"

    def worker_env(self, build_dir: Path) -> dict[str, str]:
        return {"PYTORCH_ENABLE_MPS_FALLBACK": "0"}  # a missing MPS op must fail, not use the CPU

    def build(self, source: str, workdir: Path) -> BuildResult:
        start = time.perf_counter()
        problems = static_check(source)
        if problems:
            return BuildResult(
                ok=False,
                seconds=time.perf_counter() - start,
                log="static check failed:\n" + "\n".join(problems),
            )
        reason = unavailable_reason()
        if reason is not None:
            return BuildResult(
                ok=False, seconds=time.perf_counter() - start, log=f"cannot build: {reason}"
            )
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        path = candidate_file(workdir, source, CANDIDATE_FILE)
        env = {**os.environ, **self.worker_env(workdir)}
        proc = run_child([sys.executable, "-c", _COMPILE_SCRIPT, str(path)], path.parent, BUILD_TIMEOUT_S, env)
        if proc is None:
            return BuildResult(
                ok=False, seconds=time.perf_counter() - start, log="Metal compile timed out"
            )
        ok = proc.returncode == 0
        return BuildResult(
            ok=ok,
            seconds=time.perf_counter() - start,
            log=(proc.stdout + proc.stderr)[-8000:],
            artifact=str(path) if ok else None,
        )


PLATFORM = MetalPlatform()
