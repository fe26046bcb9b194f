"""The ``cuda`` platform: CUDA C++ kernels built with ``torch.utils.cpp_extension.load_inline``.

A candidate holds ``CUDA_SOURCE``, ``CPP_SOURCE`` and ``FUNCTIONS`` string constants and calls
:func:`kforge.platforms.cuda_runtime.load_extension` at import (see that module and
refs/cuda/). ``build`` reads the constants with ``ast`` (no execution), then::

    host with a CUDA device   a child process imports the candidate: load_inline compiles the
                              extension into <workdir>/cuda_ext/<digest name>; the worker later
                              reuses it (worker_env points KFORGE_CUDA_BUILD_ROOT there)
    CPU-only host with nvcc   nvcc -arch=sm_90 -c on CUDA_SOURCE: real compile errors and the
                              ptxas resource report (registers, spills) as the log; nothing runs

CUDA_SOURCE is meant to be a standalone translation unit. If it includes torch headers
anyway, the CPU-side check adds torch's and Python's include paths (slower, about 30 s).
CPP_SOURCE is compiled only on the GPU host (torch's headers cost ~27 s per build here).
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from kforge.platforms.base import candidate_file, run_child
from kforge.platforms.cuda_runtime import BUILD_ROOT_ENV
from kforge.schema import BuildResult, PlatformInfo

CANDIDATE_FILE = "candidate.py"
REQUIRED_CONSTANTS = ("CUDA_SOURCE", "CPP_SOURCE", "FUNCTIONS")
NVCC_TIMEOUT_S = 180.0
GPU_BUILD_TIMEOUT_S = 600.0
LOG_LIMIT = 8000
_Finish = Callable[..., BuildResult]
_TORCH_INCLUDE = re.compile(r"#\s*include\s*[<\"](torch|ATen|c10|pybind11)/")

_IMPORT_SCRIPT = r"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("kforge_candidate", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
if not isinstance(getattr(mod, "ModelNew", None), type):
    sys.exit("ModelNew is not a class after import")
print("extension built and imported")
"""


class CudaSourceError(ValueError):
    """The candidate does not follow the cuda candidate convention."""


def extract_constants(source: str) -> dict[str, object]:
    """The module-level ``CUDA_SOURCE``/``CPP_SOURCE``/``FUNCTIONS`` literals, without running
    anything. Raises :class:`CudaSourceError` (or ``SyntaxError``) when they are missing."""
    tree = ast.parse(source)
    found: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in REQUIRED_CONSTANTS:
                try:
                    found[target.id] = ast.literal_eval(node.value)
                except ValueError:
                    raise CudaSourceError(
                        f"{target.id} must be a literal (a string, or a list of names)"
                    ) from None
    if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body):
        raise CudaSourceError("no module-level class ModelNew")
    missing = [k for k in REQUIRED_CONSTANTS if k not in found]
    if missing:
        raise CudaSourceError(
            f"missing module-level constants {missing} (see refs/cuda/solution.py)"
        )
    for key in ("CUDA_SOURCE", "CPP_SOURCE"):
        if not isinstance(found[key], str) or not str(found[key]).strip():
            raise CudaSourceError(f"{key} must be a non-empty string")
    fns = found["FUNCTIONS"]
    if not isinstance(fns, list | tuple) or not fns or not all(isinstance(f, str) for f in fns):
        raise CudaSourceError("FUNCTIONS must be a non-empty list of function names")
    return found


def find_nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").is_file():
        return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def _nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
    match = re.search(r"release ([\d.]+)", out)
    return match.group(1) if match else "unknown"


def _torch_include_flags() -> list[str]:
    from torch.utils.cpp_extension import include_paths

    paths = [*include_paths(), sysconfig.get_paths()["include"]]
    return [f"-I{p}" for p in paths] + ["-std=c++17"]


def _tail(text: str, limit: int = LOG_LIMIT) -> str:
    return text if len(text) <= limit else "...[truncated]...\n" + text[-limit:]


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


class CudaPlatform:
    name = "cuda"
    language = "cuda c++"
    arch = "sm_90"

    def describe(self) -> PlatformInfo:
        nvcc = find_nvcc()
        missing = [] if nvcc else ["nvcc"]
        if _cuda_available():
            return PlatformInfo(
                name=self.name,
                language=self.language,
                runnable=True,
                can_build=True,
                missing=missing,
            )
        return PlatformInfo(
            name=self.name,
            language=self.language,
            runnable=False,
            can_build=nvcc is not None,
            reason="no CUDA device"
            + ("" if nvcc else "; no nvcc either, so nothing can be compiled"),
            missing=missing,
        )

    def device(self) -> str:
        return "cuda"

    def worker_env(self, build_dir: Path) -> dict[str, str]:
        return {BUILD_ROOT_ENV: str(Path(build_dir) / "cuda_ext")}

    def tool_versions(self, nvcc: str | None) -> dict[str, str]:
        versions = {"nvcc": _nvcc_version(nvcc)} if nvcc else {}
        try:
            versions["torch"] = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            pass
        return versions

    def build(self, source: str, workdir: Path) -> BuildResult:
        start = time.perf_counter()
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        nvcc = find_nvcc()
        versions = self.tool_versions(nvcc)

        def result(ok: bool, log: str, artifact: str | None = None) -> BuildResult:
            log = _tail(log.replace(str(workdir), "<build>"))
            return BuildResult(
                ok=ok,
                seconds=time.perf_counter() - start,
                log=log,
                artifact=artifact,
                tool_versions=versions,
            )

        try:
            consts = extract_constants(source)
        except SyntaxError as err:
            return result(False, f"SyntaxError: {err.msg} (line {err.lineno})\n{err.text or ''}")
        except CudaSourceError as err:
            return result(False, f"static check failed: {err}")
        if _cuda_available():
            return self._build_on_gpu(source, workdir, result)
        if nvcc is None:
            return result(False, "cannot build: no CUDA device and no nvcc on this host")
        return self._nvcc_check(nvcc, str(consts["CUDA_SOURCE"]), workdir, result)

    def _nvcc_check(
        self, nvcc: str, cuda_source: str, workdir: Path, result: _Finish
    ) -> BuildResult:
        cu = candidate_file(workdir, cuda_source, "candidate.cu")
        obj = cu.with_suffix(".o")
        cmd = [nvcc, f"-arch={self.arch}", "-O3", "-c", str(cu), "-o", str(obj), "-Xptxas", "-v"]
        if _TORCH_INCLUDE.search(cuda_source):
            cmd += _torch_include_flags()
        proc = run_child(cmd, cu.parent, NVCC_TIMEOUT_S)
        if proc is None:
            return result(False, f"nvcc timed out after {NVCC_TIMEOUT_S:.0f} s")
        log = f"$ nvcc -arch={self.arch} -O3 -c candidate.cu\n{proc.stdout}{proc.stderr}"
        ok = proc.returncode == 0
        if ok:
            log += "\nnote: CUDA_SOURCE compiled with nvcc only (no CUDA device: CPP_SOURCE not built, nothing ran)"
        return result(ok, log, str(obj) if ok else None)

    def _build_on_gpu(self, source: str, workdir: Path, result: _Finish) -> BuildResult:
        from kforge.verifier.runner import worker_env

        path = candidate_file(workdir, source, CANDIDATE_FILE)
        with tempfile.TemporaryDirectory(prefix="kf-cuda-build-") as home:
            # The verify and profile workers' environment (same extension root, compiler,
            # CUDA root, arch list; this checkout importable), so they reuse this build.
            env = worker_env(self.worker_env(workdir), Path(home), threads=None)
            proc = run_child([sys.executable, "-c", _IMPORT_SCRIPT, str(path)], path.parent,
                             GPU_BUILD_TIMEOUT_S, env)
        if proc is None:
            return result(False, f"extension build timed out after {GPU_BUILD_TIMEOUT_S:.0f} s")
        return result(
            proc.returncode == 0,
            proc.stdout + proc.stderr,
            str(path) if proc.returncode == 0 else None,
        )


PLATFORM = CudaPlatform()
