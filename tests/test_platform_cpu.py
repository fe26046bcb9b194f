from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from kforge.platforms import cpu_runtime, get_platform
from kforge.platforms.base import load_example

SRC = 'extern "C" void add1(float* x, long long n) { for (long long i = 0; i < n; ++i) x[i] += 1.0f; }\n'


def test_platform_is_registered_and_describes_itself() -> None:
    platform = get_platform("cpu")
    info = platform.describe()
    assert info.name == "cpu" and info.runnable and info.can_build
    assert platform.device() == "cpu"
    env = platform.worker_env(Path("/tmp/b"))
    assert env == {"KFORGE_BUILD_DIR": "/tmp/b", "KFORGE_NO_BUILD": "1"}


def test_build_ok_records_tool_versions(tmp_path: Path) -> None:
    example = load_example("cpu")
    result = get_platform("cpu").build(example.solution_source, tmp_path)
    assert result.ok, result.log
    assert result.artifact and Path(result.artifact).is_file()
    assert result.tool_versions["g++"].startswith("g++")
    assert "-fopenmp" in result.tool_versions["flags"]
    assert Path(result.artifact).with_suffix(".json").is_file()


def test_build_error_is_a_truncated_log_without_host_paths(tmp_path: Path) -> None:
    bad = 'CPP_SOURCE = r"""\nextern "C" void f() { this is not C++; }\n"""\n'
    result = get_platform("cpu").build(bad, tmp_path)
    assert not result.ok
    assert "error" in result.log and str(tmp_path) not in result.log
    assert len(result.log) <= 4200


@pytest.mark.parametrize(
    "source,message",
    [("x = 1\n", "defines no"), ("CPP_SOURCE = 'a' + 'b'\n", "plain string"), ("def (:\n", "not valid")],
)
def test_extract_cpp_source_errors(source: str, message: str) -> None:
    with pytest.raises(cpu_runtime.CandidateSourceError, match=message):
        cpu_runtime.extract_cpp_source(source)


def test_extract_never_executes_the_candidate(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    source = f'open({str(marker)!r}, "w").write("x")\nCPP_SOURCE = r"""int f() {{ return 1; }}"""\n'
    assert cpu_runtime.extract_cpp_source(source) == "int f() { return 1; }"
    assert not marker.exists()


def test_concurrent_builds_of_one_source_publish_one_library(tmp_path: Path) -> None:
    src = SRC + f"// concurrency {os.getpid()}\n"
    results: list[Path] = []
    errors: list[BaseException] = []

    def build() -> None:
        try:
            results.append(cpu_runtime.build_library(src, tmp_path)[0])
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=build) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(results)) == 1
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".so"]  # no temp leftovers
    path, log, seconds = cpu_runtime.build_library(src, tmp_path)
    assert (path, log, seconds) == (results[0], "cached", 0.0)


def test_library_key_depends_on_source() -> None:
    assert cpu_runtime.library_key(SRC) != cpu_runtime.library_key(SRC + " ")


def test_no_build_mode_refuses_to_compile(tmp_path: Path) -> None:
    code = (
        "from kforge.platforms import cpu_runtime\n"
        f"cpu_runtime.load_library({(SRC + '// nobuild').__repr__()})\n"
    )
    env = {**os.environ, "KFORGE_BUILD_DIR": str(tmp_path), "KFORGE_NO_BUILD": "1"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "LibraryNotBuiltError" in proc.stderr and "KFORGE_NO_BUILD=1" in proc.stderr
    assert not list(tmp_path.glob("*.so"))


def test_prebuilt_library_loads_in_no_build_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = SRC + "// prebuilt\n"
    cpu_runtime.build_library(src, tmp_path)
    monkeypatch.setenv("KFORGE_BUILD_DIR", str(tmp_path))
    monkeypatch.setenv("KFORGE_NO_BUILD", "1")
    lib = cpu_runtime.load_library(src)
    fn = cpu_runtime.entry(lib, "add1", "pi")
    x = torch.zeros(5)
    cpu_runtime.launch(fn, "add1", x.data_ptr(), 5)
    assert x.tolist() == [1.0] * 5


def test_one_shot_example_verifies_and_shows_in_the_profiler() -> None:
    example = load_example("cpu")
    ref: dict[str, object] = {}
    exec(example.problem_source, ref)
    sol: dict[str, object] = {"__name__": "solution"}
    exec(example.solution_source, sol)
    torch.manual_seed(0)
    model = ref["Model"](*ref["get_init_inputs"]())  # type: ignore[operator]
    torch.manual_seed(0)
    new = sol["ModelNew"](*ref["get_init_inputs"]())  # type: ignore[operator]
    x = torch.randn(37, 1000)
    with torch.profiler.profile() as prof:
        got = new(x)
    assert torch.allclose(got, model(x), atol=1e-4, rtol=1e-4)
    assert any(e.key == "kforge::bias_relu" for e in prof.key_averages())
