"""The ``cpu`` platform: C++17 + OpenMP kernels, built with g++, called through ctypes.

See :mod:`kforge.platforms.cpu_runtime` for the candidate convention and ``refs/cpu/`` for
the one-shot example.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from kforge.agents.prompting import truncate
from kforge.platforms import cpu_runtime
from kforge.schema import BuildResult, PlatformInfo

BUILD_LOG_CHARS = 4000


class CpuPlatform:
    name = "cpu"
    language = "C++17 + OpenMP (ctypes)"
    # numpy, scipy and friends are not in a candidate's view (sandbox_view.foreign_libraries):
    # on a CPU their BLAS would do the work beside a trivial kernel of the candidate's own
    hides_foreign_libraries = True

    def describe(self) -> PlatformInfo:
        missing = [tool for tool in (cpu_runtime.CXX,) if shutil.which(tool) is None]
        if missing:
            return PlatformInfo(
                name=self.name, language=self.language, runnable=False, can_build=False,
                reason=f"missing tools: {', '.join(missing)} (install g++ with OpenMP)",
                missing=missing,
            )
        return PlatformInfo(name=self.name, language=self.language, runnable=True, can_build=True)

    def tool_versions(self) -> dict[str, str]:
        try:
            return {"g++": cpu_runtime.compiler_version(), "flags": " ".join(cpu_runtime.CXX_FLAGS)}
        except cpu_runtime.CpuRuntimeError:
            return {}

    def build(self, source: str, workdir: Path) -> BuildResult:
        """Extract ``CPP_SOURCE`` with ``ast`` and compile it into ``workdir`` (the build dir
        the worker later gets through :meth:`worker_env`)."""
        start = time.perf_counter()
        versions = self.tool_versions()
        try:
            logs, path = [], None
            for cpp in cpu_runtime.extract_cpp_sources(source):
                path, log, _ = cpu_runtime.build_library(cpp, Path(workdir))
                logs.append(log)
            log = "\n".join(logs)
        except cpu_runtime.BuildError as err:
            return BuildResult(ok=False, seconds=time.perf_counter() - start,
                               log=truncate(f"{err}\n{err.log}", BUILD_LOG_CHARS),
                               tool_versions=versions)
        except cpu_runtime.CpuRuntimeError as err:
            return BuildResult(ok=False, seconds=time.perf_counter() - start,
                               log=truncate(str(err), BUILD_LOG_CHARS), tool_versions=versions)
        return BuildResult(ok=True, seconds=time.perf_counter() - start,
                           log=truncate(log, BUILD_LOG_CHARS), artifact=str(path),
                           tool_versions=versions)

    def built(self, source: str, workdir: Path) -> bool:
        """Whether ``source``'s library is already in ``workdir`` (the worker never builds)."""
        try:
            return all(cpu_runtime.library_path(cpp, Path(workdir)).is_file()
                       for cpp in cpu_runtime.extract_cpp_sources(source))
        except cpu_runtime.CpuRuntimeError:
            return False

    def device(self) -> str:
        return "cpu"

    def sandbox_inputs(self, source: str, build_dir: Path) -> list[Path]:
        """What of the build folder a sandboxed run of ``source`` sees: its own libraries, not
        every other candidate's (the folder is shared)."""
        try:
            return [cpu_runtime.library_path(cpp, Path(build_dir)) for cpp in cpu_runtime.extract_cpp_sources(source)]
        except cpu_runtime.CpuRuntimeError:
            return []

    def worker_env(self, build_dir: Path) -> dict[str, str]:
        return {"KFORGE_BUILD_DIR": str(build_dir), "KFORGE_NO_BUILD": "1"}


PLATFORM = CpuPlatform()
