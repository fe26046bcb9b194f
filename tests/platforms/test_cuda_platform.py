"""CPU-side checks of the cuda platform: describe, the candidate convention, nvcc compile
feedback (a good and a broken candidate), digest-named extensions."""

from __future__ import annotations

from pathlib import Path

import pytest

from kforge.platforms import get_platform
from kforge.platforms.base import load_example
from kforge.platforms.cuda import CudaSourceError, extract_constants, find_nvcc
from kforge.platforms.cuda_runtime import BUILD_ROOT_ENV, extension_name

torch = pytest.importorskip("torch")
CPU_ONLY = not torch.cuda.is_available()
needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not installed")


@pytest.mark.skipif(not CPU_ONLY, reason="describes the CPU-only host")
def test_describe_without_device() -> None:
    info = get_platform("cuda").describe()
    assert not info.runnable
    assert info.reason.startswith("no CUDA device")
    assert info.can_build == (find_nvcc() is not None)


def test_worker_env_points_at_build_folder(tmp_path: Path) -> None:
    env = get_platform("cuda").worker_env(tmp_path)
    assert env == {BUILD_ROOT_ENV: str(tmp_path / "cuda_ext")}


def test_gpu_build_runs_in_the_workers_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch writes CC, the CUDA root and the arch list into an extension's build commands: the
    compile stage's build and the verify worker must see the same ones, or ninja rebuilds."""
    import json

    import kforge.platforms.cuda as cuda
    from kforge.verifier.runner import worker_env

    dump = tmp_path / "env.json"
    script = f"import json, os; open({str(dump)!r}, 'w').write(json.dumps(dict(os.environ)))"
    monkeypatch.setattr(cuda, "_IMPORT_SCRIPT", script)
    for key, value in {"CC": "/opt/gcc-13/bin/gcc", "CUDA_PATH": "/opt/cuda-x", "TORCH_CUDA_ARCH_LIST": "9.0a",
                       "KFORGE_UNRELATED": "1"}.items():
        monkeypatch.setenv(key, value)
    result = cuda.PLATFORM._build_on_gpu(load_example("cuda").solution_source, tmp_path,
                                         lambda ok, log, artifact=None: (ok, log))
    assert result[0], result[1]
    built = json.loads(dump.read_text())
    worker = worker_env(cuda.PLATFORM.worker_env(tmp_path), tmp_path / "scratch", threads=None)
    for key in ("CC", "CUDA_PATH", "TORCH_CUDA_ARCH_LIST", "PATH", "PYTHONPATH", BUILD_ROOT_ENV):
        assert built.get(key) == worker.get(key), key
    assert built["CC"] == "/opt/gcc-13/bin/gcc" and "KFORGE_UNRELATED" not in built


def test_extract_constants_of_refs_solution() -> None:
    consts = extract_constants(load_example("cuda").solution_source)
    assert "__global__" in str(consts["CUDA_SOURCE"])
    assert consts["FUNCTIONS"] == ["l2_normalize_rows"]


@pytest.mark.parametrize(
    "source,message",
    [
        ("CUDA_SOURCE = 'x'\nCPP_SOURCE = 'y'\nFUNCTIONS = ['f']\n", "ModelNew"),
        ("class ModelNew: pass\nCUDA_SOURCE = 'x'\n", "missing module-level constants"),
        (
            "class ModelNew: pass\nCUDA_SOURCE = f()\nCPP_SOURCE = 'y'\nFUNCTIONS = ['f']\n",
            "literal",
        ),
        (
            "class ModelNew: pass\nCUDA_SOURCE = ''\nCPP_SOURCE = 'y'\nFUNCTIONS = ['f']\n",
            "non-empty",
        ),
        (
            "class ModelNew: pass\nCUDA_SOURCE = 'x'\nCPP_SOURCE = 'y'\nFUNCTIONS = []\n",
            "FUNCTIONS",
        ),
    ],
)
def test_convention_violations_are_named(source: str, message: str) -> None:
    with pytest.raises(CudaSourceError, match=message):
        extract_constants(source)


def test_extension_names_follow_the_source() -> None:
    args = ("__global__ void k() {}", "void f();", ["f"], ["-O3"], "9.0")
    assert extension_name(*args) == extension_name(*args)
    assert extension_name(*args).startswith("kf_cuda_")
    assert extension_name("__global__ void k2() {}", *args[1:]) != extension_name(*args)
    assert extension_name(*args[:3], ["-O2"], "9.0") != extension_name(*args)


@needs_nvcc
@pytest.mark.skipif(not CPU_ONLY, reason="on a GPU host build runs load_inline (see GPU tests)")
def test_refs_solution_compiles_with_nvcc(tmp_path: Path) -> None:
    result = get_platform("cuda").build(load_example("cuda").solution_source, tmp_path)
    assert result.ok, result.log
    assert "nvcc -arch=sm_90" in result.log and "registers" in result.log  # ptxas report
    assert Path(result.artifact or "").is_file()
    assert result.tool_versions["nvcc"].startswith("1")


@needs_nvcc
@pytest.mark.skipif(not CPU_ONLY, reason="on a GPU host build runs load_inline (see GPU tests)")
def test_broken_solution_yields_nvcc_error(tmp_path: Path) -> None:
    source = load_example("cuda").solution_source.replace(
        "acc += v * v;", "acc += v * not_declared;"
    )
    result = get_platform("cuda").build(source, tmp_path)
    assert not result.ok
    assert 'identifier "not_declared" is undefined' in result.log
    assert str(tmp_path) not in result.log  # build paths are scrubbed


def test_syntax_error_is_reported_without_compiling(tmp_path: Path) -> None:
    result = get_platform("cuda").build("class ModelNew(:\n", tmp_path)
    assert not result.ok and result.log.startswith("SyntaxError")


@needs_nvcc
@pytest.mark.skipif(not CPU_ONLY, reason="on a GPU host build runs load_inline (see GPU tests)")
def test_concurrent_compile_jobs_in_one_build_folder_keep_their_own_files(tmp_path: Path) -> None:
    """Compile jobs share the store's build folder; each source gets a folder of its own, so a
    broken candidate built beside a good one fails and the good one passes, every time."""
    from concurrent.futures import ThreadPoolExecutor

    good = load_example("cuda").solution_source
    variant = good.replace("acc += v * v;", "acc += v * v + 0.0f;")
    broken = good.replace("acc += v * v;", "acc += v * not_declared;")
    platform = get_platform("cuda")
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda s: platform.build(s, tmp_path), [good, broken, variant]))
    assert results[0].ok and results[2].ok, (results[0].log, results[2].log)
    assert not results[1].ok and '"not_declared" is undefined' in results[1].log
    objects = sorted((tmp_path / "candidates").glob("*/candidate.o"))
    assert len(objects) == 2 and {Path(r.artifact or "") for r in results if r.ok} == set(objects)


def test_a_built_extension_loads_from_a_read_only_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the sandbox the build folder is read-only and load_inline cannot make its lock file
    there: the extension the compile stage built (its name is the source's digest) is imported
    directly. A writable folder still goes through load_inline (which rebuilds if needed)."""
    import os
    import shutil
    import subprocess
    import sysconfig

    import kforge.platforms.cuda_runtime as rt

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a stand-in extension")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(rt, "device_arch", lambda: "9.0")
    flags = [*rt.DEFAULT_CUDA_FLAGS, "-gencode=arch=compute_90,code=sm_90"]
    name = extension_name("__global__ void k() {}", "void f();", ["f"], flags, "9.0")
    folder = tmp_path / "ext" / name
    folder.mkdir(parents=True)
    (tmp_path / "m.c").write_text(
        "#include <Python.h>\n"
        f"static struct PyModuleDef d = {{PyModuleDef_HEAD_INIT, \"{name}\", NULL, -1, NULL}};\n"
        f"PyMODINIT_FUNC PyInit_{name}(void) {{ PyObject *m = PyModule_Create(&d);"
        " PyModule_AddIntConstant(m, \"built\", 7); return m; }\n")
    subprocess.run([cc, "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", str(tmp_path / "m.c"),
                    "-o", str(folder / f"{name}.so")], check=True)
    calls: list[str] = []
    monkeypatch.setattr("torch.utils.cpp_extension.load_inline", lambda **kw: calls.append(kw["name"]) or "built")
    # writable: load_inline decides (it reuses or rebuilds the folder's build)
    assert rt.load_extension("__global__ void k() {}", "void f();", ["f"], build_root=tmp_path / "ext") == "built"
    assert calls == [name]
    real_access = os.access
    monkeypatch.setattr(rt.os, "access", lambda p, mode: False if Path(p) == folder and mode == os.W_OK
                        else real_access(p, mode))
    module = rt.load_extension("__global__ void k() {}", "void f();", ["f"], build_root=tmp_path / "ext")
    assert module.built == 7 and calls == [name]  # imported from the folder, load_inline not called
