"""Runtime helper that ``cuda`` candidates call at import to build and load their extension.

Candidate convention (see refs/cuda/solution.py and docs/ADDING_A_PLATFORM.md)::

    CUDA_SOURCE = r'''...'''   # a standalone CUDA translation unit: kernels plus host launch
                               # functions taking raw pointers, sizes and a cudaStream_t; it
                               # includes no torch header, so nvcc alone can compile it
    CPP_SOURCE = r'''...'''    # torch-facing wrappers (torch::Tensor in, torch::Tensor out)
                               # that check arguments and call the launchers
    FUNCTIONS = ["my_op"]      # wrapper names exported to Python

    from kforge.platforms.cuda_runtime import load_extension
    _ext = load_extension(CUDA_SOURCE, CPP_SOURCE, FUNCTIONS)

The extension is named by the digest of everything that shapes the binary (sources, exported
functions, flags, target architecture), and built in its own folder ``<root>/<name>``, so
two different candidates can never collide and two builds of the same candidate share
torch's file lock and the finished library. ``<root>`` comes from ``build_root``, else the
``KFORGE_CUDA_BUILD_ROOT`` environment variable (set by the platform's ``worker_env``), else
``~/.cache/kforge/cuda_ext``. This module imports torch only when called and needs nothing
else from KForge (no pydantic), so it runs on a bare GPU host.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

BUILD_ROOT_ENV = "KFORGE_CUDA_BUILD_ROOT"
DEFAULT_CUDA_FLAGS = ("-O3", "--use_fast_math")
DEFAULT_CXX_FLAGS = ("-O3",)


def _import_built(name: str, path: Path) -> ModuleType:
    """The extension module ``load_inline`` would import from its build folder."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CudaBuildError(f"cannot import the built extension {path.name}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class CudaBuildError(RuntimeError):
    """The candidate's CUDA extension failed to compile or load; the message holds the log."""


def default_build_root() -> Path:
    env = os.environ.get(BUILD_ROOT_ENV)
    return Path(env) if env else Path.home() / ".cache" / "kforge" / "cuda_ext"


def device_arch() -> str:
    """``"9.0"`` style compute capability of the current CUDA device."""
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"{major}.{minor}"


def extension_name(
    cuda_source: str,
    cpp_source: str,
    functions: Sequence[str],
    cuda_flags: Sequence[str],
    arch: str,
) -> str:
    """Digest-derived, importable extension name: ``kf_cuda_<16 hex>``."""
    blob = json.dumps(
        {
            "cu": cuda_source,
            "cpp": cpp_source,
            "fn": list(functions),
            "flags": list(cuda_flags),
            "arch": arch,
        },
        sort_keys=True,
    )
    return "kf_cuda_" + hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_extension(
    cuda_source: str,
    cpp_source: str,
    functions: Sequence[str],
    *,
    build_root: str | Path | None = None,
    extra_cuda_cflags: Sequence[str] = DEFAULT_CUDA_FLAGS,
    verbose: bool = False,
) -> ModuleType:
    """Compile (or reuse) and import the candidate's extension through ``load_inline``."""
    import torch
    from torch.utils.cpp_extension import load_inline

    if not torch.cuda.is_available():
        raise CudaBuildError("no CUDA device: cuda candidates build and run only on a GPU host")
    arch = device_arch()
    gencode = f"-gencode=arch=compute_{arch.replace('.', '')},code=sm_{arch.replace('.', '')}"
    flags = [*extra_cuda_cflags, gencode]
    name = extension_name(cuda_source, cpp_source, functions, flags, arch)
    folder = Path(build_root) if build_root is not None else default_build_root()
    folder = folder / name
    built = folder / f"{name}.so"
    if built.is_file() and not os.access(folder, os.W_OK):
        # a sandboxed worker: the build folder is read-only (load_inline's lock file cannot be
        # made there), and the compile stage built this exact source (the name is its digest)
        return _import_built(name, built)
    folder.mkdir(parents=True, exist_ok=True)
    # Only our gencode flag: keep torch from adding every architecture it knows.
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", arch)
    try:
        return load_inline(
            name=name,
            cpp_sources=[cpp_source],
            cuda_sources=[cuda_source],
            functions=list(functions),
            extra_cflags=list(DEFAULT_CXX_FLAGS),
            extra_cuda_cflags=flags,
            build_directory=str(folder),
            verbose=verbose,
        )
    except (RuntimeError, OSError, ImportError) as err:
        raise CudaBuildError(f"building CUDA extension {name} failed:\n{err}") from err
