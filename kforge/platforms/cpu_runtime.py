"""Runtime for CPU candidates: build plain C++ into a shared library, load it, call it.

A CPU candidate module holds its kernels as a module-level string constant::

    CPP_SOURCE = r'''
    #include <cstdint>
    extern "C" void bias_relu(const float* x, const float* b, float* y,
                              int64_t rows, int64_t cols, int64_t nthreads) { ... }
    '''
    lib = cpu_runtime.load_library(CPP_SOURCE)
    BIAS_RELU = cpu_runtime.entry(lib, "bias_relu", "ppp" + "iii")

and calls ``cpu_runtime.launch(BIAS_RELU, "bias_relu", x.data_ptr(), ...)`` inside
``ModelNew.forward`` on contiguous fp32 tensors (outputs from ``torch.empty``). ``launch``
wraps the call in ``torch.profiler.record_function("kforge::<entry>")`` only while a profiler
is recording, so the profile's kernel table shows our kernels at no cost otherwise.

Libraries are built with g++ (no torch headers: a torch extension costs ~27 s to build here,
a plain translation unit well under 3 s) into ``$KFORGE_BUILD_DIR`` (default
``$XDG_CACHE_HOME/kforge/cpu``), named by the sha256 of source + flags + compiler version, and
published atomically (private temp folder, then ``os.replace``), so concurrent builds of the
same source never collide. With ``KFORGE_NO_BUILD=1`` (the sandboxed worker) nothing is
compiled: a library that was not prebuilt is a :class:`LibraryNotBuiltError`.
"""

from __future__ import annotations

import ast
import ctypes
import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch loads only in processes that run candidates, not in build jobs
    import torch

CXX = os.environ.get("KFORGE_CXX", "g++")
# -fno-math-errno / -fno-trapping-math change no IEEE result; they let GCC vectorise sqrt and
# if-convert selects (`c ? a : b`) inside `#pragma omp simd` loops. No -ffast-math.
CXX_FLAGS: tuple[str, ...] = (
    "-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math",
    "-shared", "-fPIC", "-std=c++17",
)
SOURCE_CONSTANT = "CPP_SOURCE"
_ARGTYPES = {"p": ctypes.c_void_p, "i": ctypes.c_int64, "f": ctypes.c_float}


class CpuRuntimeError(RuntimeError):
    """Base of the CPU runtime's errors."""


class BuildError(CpuRuntimeError):
    """g++ rejected the source; ``log`` holds the compiler output."""

    def __init__(self, message: str, log: str) -> None:
        super().__init__(message)
        self.log = log


class LibraryNotBuiltError(CpuRuntimeError):
    """KFORGE_NO_BUILD=1 and no prebuilt library matches the source."""


class CandidateSourceError(CpuRuntimeError):
    """The candidate module has no usable ``CPP_SOURCE`` string constant."""


def default_build_dir() -> Path:
    env = os.environ.get("KFORGE_BUILD_DIR")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "kforge" / "cpu"


@functools.lru_cache(maxsize=4)
def compiler_version(cxx: str = CXX) -> str:
    """First line of ``g++ --version``; raises :class:`CpuRuntimeError` when it is missing."""
    if shutil.which(cxx) is None:
        raise CpuRuntimeError(f"C++ compiler {cxx!r} not found on PATH (install g++)")
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0].strip() if out.stdout else "unknown"


@functools.lru_cache(maxsize=4)
def vector_isa(cxx: str = CXX) -> str:
    """The widest vector ISA the compiler targets with :data:`CXX_FLAGS` (``-march=native``):
    ``avx512``, ``avx2`` or ``none`` (no compiler, or neither), read from its predefined macros."""
    if shutil.which(cxx) is None:
        return "none"
    flags = [f for f in CXX_FLAGS if f.startswith("-m")]
    out = subprocess.run([cxx, *flags, "-dM", "-E", "-x", "c++", os.devnull],
                         capture_output=True, text=True, check=False).stdout
    for isa, macro in (("avx512", "__AVX512F__"), ("avx2", "__AVX2__")):
        if f"#define {macro} 1" in out:
            return isa
    return "none"


def library_key(cpp_source: str, cxx: str = CXX) -> str:
    h = hashlib.sha256()
    for part in (cpp_source, " ".join(CXX_FLAGS), compiler_version(cxx)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def library_path(cpp_source: str, build_dir: Path | None = None) -> Path:
    folder = Path(build_dir) if build_dir is not None else default_build_dir()
    return folder / f"kf_{library_key(cpp_source)[:32]}.so"


def build_library(cpp_source: str, build_dir: Path | None = None) -> tuple[Path, str, float]:
    """Compile ``cpp_source`` (or reuse the cached build): ``(library path, log, seconds)``.

    Raises :class:`BuildError` with the compiler log when g++ fails.
    """
    target = library_path(cpp_source, build_dir)
    if target.is_file():
        return target, "cached", 0.0
    target.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=".build-", dir=target.parent) as tmp:
        src = Path(tmp) / "kernel.cpp"
        src.write_text(cpp_source)
        out = Path(tmp) / target.name
        cmd = [CXX, *CXX_FLAGS, str(src), "-o", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        log = (proc.stdout + proc.stderr).replace(str(src), "kernel.cpp").replace(tmp, ".")
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            raise BuildError(f"g++ failed with exit code {proc.returncode}", log)
        record = {"cmd": [CXX, *CXX_FLAGS], "compiler": compiler_version(), "seconds": seconds,
                  "log": log}
        meta = Path(tmp) / "build.json"
        meta.write_text(json.dumps(record, indent=1))
        os.replace(meta, target.with_suffix(".json"))
        os.replace(out, target)  # atomic publish: readers see a whole library or none
    return target, log, seconds


_LOADED: dict[Path, ctypes.CDLL] = {}


def load_library(cpp_source: str) -> ctypes.CDLL:
    """Load the library for ``cpp_source``, building it unless ``KFORGE_NO_BUILD=1``."""
    path = library_path(cpp_source)
    if path in _LOADED:
        return _LOADED[path]
    if not path.is_file():
        if os.environ.get("KFORGE_NO_BUILD") == "1":
            raise LibraryNotBuiltError(
                f"no prebuilt library {path.name} in {path.parent} and KFORGE_NO_BUILD=1: "
                "build the candidate with the cpu platform before running it"
            )
        path, _, _ = build_library(cpp_source)
    lib = ctypes.CDLL(str(path))
    _LOADED[path] = lib
    return lib


def entry(lib: ctypes.CDLL, name: str, signature: str) -> Callable[..., Any]:
    """The ``extern "C"`` function ``name``; ``signature`` has one letter per argument:
    ``p`` pointer (pass ``tensor.data_ptr()``), ``i`` int64, ``f`` float."""
    fn = getattr(lib, name)
    fn.argtypes = [_ARGTYPES[c] for c in signature]
    fn.restype = None
    return fn


def launch(fn: Callable[..., Any], name: str, *args: Any) -> None:
    """Call a kernel, labelled ``kforge::<name>`` in the profiler while one is recording."""
    import torch

    if torch.autograd.profiler._is_profiler_enabled:
        with torch.profiler.record_function(f"kforge::{name}"):
            fn(*args)
    else:
        fn(*args)


def threads() -> int:
    """Threads a kernel should use: torch's setting, so candidates and baselines match."""
    import torch

    return torch.get_num_threads()


def as_input(t: torch.Tensor) -> torch.Tensor:
    """A contiguous fp32 view (or copy) of ``t``, as the kernels expect."""
    import torch

    if t.dtype != torch.float32:
        raise TypeError(f"CPU kernels take float32 tensors, got {t.dtype}")
    return t if t.is_contiguous() else t.contiguous()


def extract_cpp_sources(candidate_source: str) -> list[str]:
    """Every module-level ``CPP_SOURCE`` string constant of a candidate module (``CPP_SOURCE``
    itself, and ``CPP_SOURCE_<name>`` ones: a stitched model holds one per region kernel), read
    with ``ast`` (the candidate is never executed)."""
    try:
        tree = ast.parse(candidate_source)
    except SyntaxError as err:
        raise CandidateSourceError(f"candidate is not valid Python: {err}") from None
    found = []
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        if any(n == SOURCE_CONSTANT or n.startswith(SOURCE_CONSTANT + "_") for n in names):
            value = node.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.append(value.value)
                continue
            raise CandidateSourceError(
                f"{SOURCE_CONSTANT} must be a plain string literal (no f-string or expression)"
            )
    if not found:
        raise CandidateSourceError(f"candidate defines no module-level {SOURCE_CONSTANT} string")
    return found


def extract_cpp_source(candidate_source: str) -> str:
    """The candidate's ``CPP_SOURCE`` (the first of :func:`extract_cpp_sources`)."""
    return extract_cpp_sources(candidate_source)[0]
