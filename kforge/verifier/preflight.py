"""What ``kforge verify`` and ``kforge bench`` check before anything runs, and the build.

A user's mistake is a :class:`UserError` with a one-line message and an exit code of its own
(never a traceback)::

    1  BuildFailed          the platform's build rejected the candidate (compiler log printed)
    3  MissingFile          the candidate or the problem file does not exist / is unreadable
    4  NoModelNew           the candidate defines no top-level class ModelNew
    5  WrongSignature       ModelNew's __init__ / forward cannot take what the problem passes
    6  UnknownPlatform      no adapter module for --platform
    7  PlatformUnavailable  the platform cannot build or run on this host
    8  BadProblem           the problem file is not valid Python or has no class Model
    9  ProblemDoesNotLoad   the problem file does not load: it raises at import, get_inputs() /
                            get_init_inputs() raise or return no list, its PRESETS are bad
                            (the pipeline's ``problem_error``)

(2 stays argparse's "bad usage"; 0 verified, 1 rejected.) The signature check reads both
files with ``ast`` and runs nothing; then the problem file, the trusted reference, is loaded in
this process at the ci sizes, as the pipeline's problem stage loads it (the candidate runs only
in the sandbox).
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kforge.schema import BuildResult


class UserError(Exception):
    """A mistake in what the user passed; ``code`` is the command's exit status."""

    code = 2

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.log = log


class BuildFailed(UserError):
    code = 1


class MissingFile(UserError):
    code = 3


class NoModelNew(UserError):
    code = 4


class WrongSignature(UserError):
    code = 5


class UnknownPlatform(UserError):
    code = 6


class PlatformUnavailable(UserError):
    code = 7


class BadProblem(UserError):
    code = 8


class ProblemDoesNotLoad(UserError):
    code = 9


@dataclass(frozen=True)
class Arity:
    """How many positional arguments (after self) a method accepts."""

    required: int
    most: int | None  # None: *args

    def accepts(self, n: int) -> bool:
        return self.required <= n and (self.most is None or n <= self.most)

    def __str__(self) -> str:
        if self.most is None:
            return f"at least {self.required}"
        return str(self.required) if self.required == self.most else f"{self.required} to {self.most}"


def read_source(path: Path, label: str) -> str:
    if not path.is_file():
        raise MissingFile(f"{label} file not found: {path}")
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise MissingFile(f"cannot read {label} file {path}: {err}") from None


def _class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _arity(cls: ast.ClassDef, method: str) -> Arity | None:
    fn = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method), None)
    if fn is None:
        return None
    positional = [*fn.args.posonlyargs, *fn.args.args][1:]  # drop self
    required = len(positional) - len(fn.args.defaults)
    return Arity(max(0, required), None if fn.args.vararg else len(positional))


def _ref_count(cls: ast.ClassDef, method: str) -> int | None:
    """The number of positional arguments the reference's method is called with (its own
    positional parameter count; None when it takes *args)."""
    arity = _arity(cls, method)
    return None if arity is None or arity.most is None else arity.most


def check_sources(candidate: str, problem: str) -> None:
    """``NoModelNew``, ``WrongSignature`` or ``BadProblem`` when visible without running."""
    try:
        ptree = ast.parse(problem)
    except SyntaxError as err:
        raise BadProblem(f"problem file is not valid Python (line {err.lineno}: {err.msg})") from None
    model = _class(ptree, "Model")
    if model is None:
        raise BadProblem("problem file defines no top-level class Model")
    try:
        ctree = ast.parse(candidate)
    except SyntaxError:
        return  # reported by the verifier as syntax_error, with the line
    new = _class(ctree, "ModelNew")
    if new is None:
        raise NoModelNew("candidate defines no top-level class ModelNew")
    for method, source in (("forward", "get_inputs()"), ("__init__", "get_init_inputs()")):
        want = _ref_count(model, method)
        got = _arity(new, method)
        if want is None or got is None:
            continue  # inherited or *args: only a run can tell
        if not got.accepts(want):
            raise WrongSignature(f"ModelNew.{method} takes {got} positional argument(s); the problem "
                                 f"passes {want} (Model.{method}, from {source})")


def check_problem_loads(problem_path: Path) -> None:
    """``ProblemDoesNotLoad`` with the problem's own error on one line, when loading it (as the
    pipeline's problem stage does, at the ci sizes) fails."""
    from kforge.problems import ProblemError, load_problem

    try:
        load_problem(problem_path, preset="ci")
    except ProblemError as err:
        raise ProblemDoesNotLoad(f"problem file {problem_path} does not load: {err.brief} "
                                 "(fix the problem file; nothing was verified)") from None


def resolve_platform(name: str) -> Any:
    from kforge.platforms import UnknownPlatformError, get_platform

    try:
        plat = get_platform(name)
    except (UnknownPlatformError, ImportError) as err:
        raise UnknownPlatform(str(err).strip("'\"")) from None
    info = plat.describe()
    if not info.can_build:
        raise PlatformUnavailable(f"platform {name} cannot build here: {info.reason}")
    return plat


def build_candidate(plat: Any, source: str, build_dir: Path) -> BuildResult:
    """The platform's build of ``source`` into ``build_dir`` (what the pipeline's compile stage
    does); ``BuildFailed`` carries the compiler's log."""
    build_dir.mkdir(parents=True, exist_ok=True)
    old = os.environ.get("KFORGE_BUILD_DIR")
    os.environ["KFORGE_BUILD_DIR"] = str(build_dir)
    try:
        result: BuildResult = plat.build(source, build_dir)
    finally:
        if old is None:
            os.environ.pop("KFORGE_BUILD_DIR", None)
        else:
            os.environ["KFORGE_BUILD_DIR"] = old
    if not result.ok:
        first = next((line for line in result.log.splitlines() if "error" in line.lower()),
                     result.log.strip().splitlines()[0] if result.log.strip() else "no log")
        raise BuildFailed(f"build failed on platform {plat.name}: {first.strip()[:300]}", log=result.log)
    return result


def prepare(candidate_path: Path, problem_path: Path, platform: str,
            build_dir: Path | None = None) -> tuple[str, Path]:
    """Read, check and build: the candidate's source and the build folder it was built into."""
    from kforge.verifier.runner import build_folder

    source = read_source(candidate_path, "candidate")
    check_sources(source, read_source(problem_path, "problem"))
    check_problem_loads(problem_path)
    plat = resolve_platform(platform)
    folder = build_folder(platform, build_dir).resolve()
    build_candidate(plat, source, folder)
    info = plat.describe()
    if not info.runnable:
        raise PlatformUnavailable(f"built; platform {platform} cannot run here: {info.reason}")
    return source, folder
