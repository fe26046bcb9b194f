"""A platform added from outside the package: one adapter module + one refs folder
(docs/ADDING_A_PLATFORM.md), found by a dotted module name and loaded as a one-shot example."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kforge.platforms import UnknownPlatformError, get_platform
from kforge.platforms.base import load_example

ADAPTER = '''
from __future__ import annotations

import ast
import time
from pathlib import Path

from kforge.schema import BuildResult, PlatformInfo


class ToyPlatform:
    """Candidates are plain Python: 'building' is parsing."""

    name = "toy"
    language = "python"

    def describe(self) -> PlatformInfo:
        return PlatformInfo(name=self.name, language=self.language, runnable=True, can_build=True)

    def build(self, source: str, workdir: Path) -> BuildResult:
        start = time.perf_counter()
        try:
            ast.parse(source)
        except SyntaxError as err:
            return BuildResult(ok=False, seconds=time.perf_counter() - start, log=str(err))
        return BuildResult(ok=True, seconds=time.perf_counter() - start)

    def device(self) -> str:
        return "cpu"

    def worker_env(self, build_dir: Path) -> dict[str, str]:
        return {"TOY_BUILD_DIR": str(build_dir)}


PLATFORM = ToyPlatform()
'''


@pytest.fixture
def toy_package(tmp_path: Path) -> Iterator[Path]:
    package = tmp_path / "toypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "toy.py").write_text(ADAPTER)
    (package / "empty.py").write_text("# an adapter module that forgot PLATFORM\n")
    refs = tmp_path / "refs" / "toypkg.toy"
    refs.mkdir(parents=True)
    (refs / "problem.py").write_text("class Model: ...\n")
    (refs / "solution.py").write_text("class ModelNew: ...\n")
    (refs / "NOTES.md").write_text("# toy\nPlain Python.\n")
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in [m for m in sys.modules if m == "toypkg" or m.startswith("toypkg.")]:
        del sys.modules[name]


def test_found_by_dotted_name(toy_package: Path) -> None:
    platform = get_platform("toypkg.toy")
    info = platform.describe()
    assert info.name == "toy" and info.runnable
    assert platform.build("class ModelNew: ...\n", toy_package).ok
    assert not platform.build("class ModelNew(:\n", toy_package).ok
    assert platform.worker_env(toy_package)["TOY_BUILD_DIR"] == str(toy_package)


def test_example_loaded_from_its_refs_folder(toy_package: Path) -> None:
    example = load_example("toypkg.toy", refs_dir=toy_package / "refs")
    assert example.platform == "toypkg.toy"
    assert "ModelNew" in example.solution_source and "Plain Python" in example.notes


def test_missing_pieces_are_clear_errors(toy_package: Path) -> None:
    with pytest.raises(UnknownPlatformError, match="defines no PLATFORM"):
        get_platform("toypkg.empty")
    with pytest.raises(UnknownPlatformError, match="unknown platform"):
        get_platform("toypkg.nothing_here")
    (toy_package / "refs" / "toypkg.toy" / "NOTES.md").unlink()
    with pytest.raises(FileNotFoundError, match=re.escape("missing ['NOTES.md']")):
        load_example("toypkg.toy", refs_dir=toy_package / "refs")
