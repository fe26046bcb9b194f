"""The ``triton`` platform: Triton kernels launched from a ``ModelNew`` module.

Where it runs::

    host with a CUDA device   runnable, timed          build = static check + import/warm in a
                                                        subprocess (Triton compiles at first launch)
    CPU-only host             runnable, interpreted    build = static check + import under
                              (correctness only)       TRITON_INTERPRET=1; never timed as performance

``build`` never executes the candidate in this process: the static check parses it with
``ast`` (a ``ModelNew`` class and at least one ``@triton.jit`` kernel), and anything that runs
candidate code does so in a child process whose output becomes ``BuildResult.log``.

Warm-up convention: if ``workdir`` holds a ``problem.py`` (the KernelBench reference), the
GPU build also constructs ``ModelNew(*get_init_inputs())`` and runs one forward pass on the
problem's inputs, so Triton compile errors surface at build time rather than in verification.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import sys
import time
from pathlib import Path

from kforge.platforms.base import candidate_file, run_child
from kforge.schema import BuildResult, PlatformInfo

CANDIDATE_FILE = "candidate.py"
BUILD_TIMEOUT_S = 300.0
LOG_LIMIT = 8000

_CHECK_SCRIPT = r"""
import importlib.util, sys
path, problem = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location("kforge_candidate", path)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
cls = getattr(mod, "ModelNew", None)
if not isinstance(cls, type):
    sys.exit("ModelNew is not a class after import")
import triton
kernels = [n for n, v in vars(mod).items() if isinstance(v, triton.runtime.jit.KernelInterface)]
if not kernels:
    sys.exit("no Triton kernel (JITFunction) found after import")
print("kernels:", ",".join(sorted(kernels)))
if problem:
    import torch
    pspec = importlib.util.spec_from_file_location("kforge_problem", problem)
    pmod = importlib.util.module_from_spec(pspec)
    pspec.loader.exec_module(pmod)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = cls(*pmod.get_init_inputs()).to(dev)
    inputs = [x.to(dev) if isinstance(x, torch.Tensor) else x for x in pmod.get_inputs()]
    with torch.no_grad():
        model(*inputs)
    if dev == "cuda":
        torch.cuda.synchronize()
    print("warm: one forward pass ran on", dev)
"""


class CandidateSourceError(ValueError):
    """The candidate source fails the platform's static checks (no code was run)."""


def _is_triton_jit(decorator: ast.expr) -> bool:
    """``@triton.jit``, ``@triton.jit(...)``, ``@jit`` (imported from triton)."""
    node = decorator.func if isinstance(decorator, ast.Call) else decorator
    if isinstance(node, ast.Attribute):
        return node.attr == "jit" and isinstance(node.value, ast.Name) and node.value.id == "triton"
    return isinstance(node, ast.Name) and node.id == "jit"


def static_check(source: str) -> list[str]:
    """Problems found without running the source: syntax, ``ModelNew``, ``@triton.jit``.

    Returns the list of problems (empty when the candidate passes)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        return [
            f"SyntaxError: {err.msg} (line {err.lineno}, column {err.offset})\n{err.text or ''}"
        ]
    problems: list[str] = []
    top = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)}
    if not isinstance(top.get("ModelNew"), ast.ClassDef):
        problems.append("no module-level class ModelNew")
    kernels = [
        n.name
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef) and any(_is_triton_jit(d) for d in n.decorator_list)
    ]
    if not kernels:
        problems.append(
            "no @triton.jit kernel: the candidate must launch a Triton kernel of its own"
        )
    return problems


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (imports torch lazily)."""
    import torch

    return bool(torch.cuda.is_available())


def _tail(text: str, limit: int = LOG_LIMIT) -> str:
    return text if len(text) <= limit else "...[truncated]...\n" + text[-limit:]


class TritonPlatform:
    name = "triton"
    language = "triton"

    def describe(self) -> PlatformInfo:
        missing = [m for m in ("triton", "numpy", "torch") if importlib.util.find_spec(m) is None]
        if "torch" in missing or "triton" in missing:
            return PlatformInfo(
                name=self.name,
                language=self.language,
                runnable=False,
                can_build=False,
                reason=f"missing Python packages: {', '.join(missing)}",
                missing=missing,
            )
        if cuda_available():
            return PlatformInfo(
                name=self.name, language=self.language, runnable=True, can_build=True
            )
        if "numpy" in missing:
            return PlatformInfo(
                name=self.name,
                language=self.language,
                runnable=False,
                can_build=True,
                reason="no CUDA device, and the Triton interpreter needs numpy",
                missing=missing,
            )
        return PlatformInfo(
            name=self.name,
            language=self.language,
            runnable=True,
            can_build=True,
            interpreted=True,
            reason="no CUDA device: kernels run under TRITON_INTERPRET=1, for correctness only",
        )

    def device(self) -> str:
        return "cuda" if cuda_available() else "cpu"

    def worker_env(self, build_dir: Path) -> dict[str, str]:
        env = {"TRITON_CACHE_DIR": str(Path(build_dir) / "triton_cache")}
        if not cuda_available():
            env["TRITON_INTERPRET"] = "1"
        return env

    def tool_versions(self) -> dict[str, str]:
        return {k: v for k in ("triton", "torch") if (v := _version(k)) is not None}

    def build(self, source: str, workdir: Path) -> BuildResult:
        start = time.perf_counter()
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        problems = static_check(source)
        if problems:
            return BuildResult(
                ok=False,
                seconds=time.perf_counter() - start,
                log="static check failed:\n" + "\n".join(problems),
                tool_versions=self.tool_versions(),
            )
        path = candidate_file(workdir, source, CANDIDATE_FILE)
        problem = workdir / "problem.py"
        env = {**os.environ, **self.worker_env(workdir)}
        cmd = [
            sys.executable,
            "-c",
            _CHECK_SCRIPT,
            str(path),
            str(problem) if problem.is_file() else "",
        ]
        proc = run_child(cmd, path.parent, BUILD_TIMEOUT_S, env)
        if proc is None:
            return BuildResult(
                ok=False,
                seconds=time.perf_counter() - start,
                log=f"build check timed out after {BUILD_TIMEOUT_S:.0f} s (import or warm-up hangs)",
                tool_versions=self.tool_versions(),
            )
        log = _tail((proc.stdout + proc.stderr).replace(str(workdir), "<build>"))
        return BuildResult(
            ok=proc.returncode == 0,
            seconds=time.perf_counter() - start,
            log=log,
            artifact=str(path) if proc.returncode == 0 else None,
            tool_versions=self.tool_versions(),
        )


PLATFORM = TritonPlatform()
