"""Load KernelBench-format problem files, apply size presets, and describe them.

A problem file defines ``class Model(nn.Module)``, ``get_inputs()`` and ``get_init_inputs()``
(KernelBench format), with module-level integer size constants that those functions read at
call time. KForge adds two optional names: ``CATEGORY`` (a string) and ``PRESETS`` (a dict of
named size overrides, e.g. ``{"ci": {"batch_size": 64}}``).

Presets (``preset=``):

* ``"full"``: the module's own values (plus ``PRESETS["full"]`` when a file defines one);
* ``"ci"``: ``PRESETS["ci"]`` when present, else
  :func:`kforge.problem_cost.generic_shrink` for unmodified foreign files: the largest
  integer constants are halved, one at a time, until the inputs from ``get_inputs()`` hold
  at most ``CI_MAX_INPUT_ELEMENTS`` (2**20) elements, the parameters at most
  ``CI_MAX_PARAM_ELEMENTS`` and the forward at most ``CI_MAX_FLOPS`` (all measured on the
  ``meta`` device, so nothing is allocated);
* ``"none"``: untouched; any other name: ``PRESETS[name]``.

Explicit ``sizes=`` are applied last. Every file is executed into a fresh module object with
a unique name; nothing is registered in ``sys.modules``.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kforge.problem_cost import (
    CI_MAX_FLOPS,
    CI_MAX_INPUT_ELEMENTS,
    CI_MAX_PARAM_ELEMENTS,
    flops_and_bytes,
    generic_shrink,
)
from kforge.problem_sizes import get_size, set_size, size_constants
from kforge.schema import ProblemMeta

__all__ = [
    "CI_MAX_FLOPS",
    "CI_MAX_INPUT_ELEMENTS",
    "CI_MAX_PARAM_ELEMENTS",
    "LoadedProblem",
    "ProblemError",
    "degenerate_flags",
    "generic_shrink",
    "load_problem",
    "load_problem_source",
    "load_suite",
    "one_line",
    "problem_meta",
    "reference_case",
    "size_constants",
    "get_size",
    "set_size",
]

ERROR_KINDS = (
    "import_error",
    "no_model",
    "model_not_module",
    "no_get_inputs",
    "no_get_init_inputs",
    "bad_inputs",
    "bad_preset",
)

_counter = itertools.count()


BRIEF_CHARS = 300


def one_line(text: str, limit: int = BRIEF_CHARS) -> str:
    """``text`` on one line for a report cell or a terminal: a traceback cut to its last line
    (the exception itself), whitespace collapsed, at most ``limit`` characters."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if any(line.startswith("Traceback (most recent call last)") for line in lines):
        lines = lines[-1:]
    flat = " ".join(" ".join(lines).split())
    return flat if len(flat) <= limit else flat[: limit - 3].rstrip() + "..."


class ProblemError(Exception):
    """A problem file that cannot be used; ``kind`` is one of ``ERROR_KINDS``."""

    def __init__(self, kind: str, message: str, *, name: str = "", path: Path | None = None):
        assert kind in ERROR_KINDS, kind
        self.kind = kind
        self.name = name
        self.path = path
        self.message = message
        where = f" ({path})" if path is not None else ""
        super().__init__(f"problem {name!r}{where}: {kind}: {message}")

    @property
    def brief(self) -> str:
        """``kind: message`` on one line (:func:`one_line`), for the report and a terminal."""
        return one_line(f"{self.kind}: {self.message}")


@dataclass
class LoadedProblem:
    """One problem, executed into its own module with its sizes applied."""

    name: str
    suite: str
    path: Path | None
    source: str
    preset: str
    module: types.ModuleType
    Model: type[torch.nn.Module]

    def get_inputs(self) -> list[Any]:
        return list(self.module.get_inputs())

    def get_init_inputs(self) -> list[Any]:
        return list(self.module.get_init_inputs())

    def sizes(self) -> dict[str, int]:
        """The effective integer size constants of the module."""
        return size_constants(self.module)

    @property
    def category(self) -> str:
        value = getattr(self.module, "CATEGORY", "unknown")
        return value if isinstance(value, str) else "unknown"

    @property
    def source_digest(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()


# --------------------------------------------------------------------------- loading


def load_problem(
    path: str | Path,
    *,
    suite: str = "",
    preset: str = "ci",
    sizes: dict[str, int] | None = None,
) -> LoadedProblem:
    """Load one problem file; raises :class:`ProblemError`."""
    path = Path(path)
    try:
        source = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ProblemError(
            "import_error", f"cannot read file: {exc}", name=path.stem, path=path
        ) from exc
    return _load(source, path.stem, suite=suite, preset=preset, sizes=sizes, path=path)


def load_problem_source(
    source: str,
    name: str,
    *,
    suite: str = "",
    preset: str = "ci",
    sizes: dict[str, int] | None = None,
) -> LoadedProblem:
    """Load a problem from its source text (e.g. one read back from the artifact store)."""
    return _load(source, name, suite=suite, preset=preset, sizes=sizes, path=None)


def load_suite(
    folder: str | Path,
    *,
    suite: str,
    preset: str = "ci",
    sizes: dict[str, int] | None = None,
    include: list[str] | None = None,
) -> tuple[list[LoadedProblem], list[ProblemError]]:
    """Load every ``*.py`` of a folder (names starting with ``_`` skipped), sorted by name.

    ``include`` keeps only the listed file stems. Suite-wide ``sizes`` are applied to the
    problems that define the constant and ignored by the others. One bad file never stops
    the others: its error is returned beside the loaded problems.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"problem suite folder not found: {folder}")
    paths = sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))
    if include is not None:
        wanted = set(include)
        paths = [p for p in paths if p.stem in wanted]
    problems: list[LoadedProblem] = []
    errors: list[ProblemError] = []
    for path in paths:
        try:
            source = path.read_text()
            problems.append(
                _load(
                    source,
                    path.stem,
                    suite=suite,
                    preset=preset,
                    sizes=sizes,
                    path=path,
                    lenient=True,
                )
            )
        except ProblemError as exc:
            errors.append(exc)
        except OSError as exc:
            errors.append(ProblemError("import_error", str(exc), name=path.stem, path=path))
    return problems, errors


def _exec(source: str, name: str, suite: str, path: Path | None) -> types.ModuleType:
    slug = re.sub(r"\W", "_", f"{suite}_{name}")
    module = types.ModuleType(f"kforge_problem_{slug}_{next(_counter)}")
    module.__file__ = str(path) if path is not None else f"<problem {name}>"
    try:
        code = compile(source, module.__file__, "exec")
        exec(code, module.__dict__)
    except BaseException as exc:  # noqa: BLE001 - a problem file may raise anything
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise ProblemError(
            "import_error", f"{type(exc).__name__}: {exc}", name=name, path=path
        ) from exc
    return module


def _load(
    source: str,
    name: str,
    *,
    suite: str,
    preset: str,
    sizes: dict[str, int] | None,
    path: Path | None,
    lenient: bool = False,
) -> LoadedProblem:
    def fail(kind: str, message: str) -> ProblemError:
        return ProblemError(kind, message, name=name, path=path)

    module = _exec(source, name, suite, path)
    model = getattr(module, "Model", None)
    if model is None:
        raise fail("no_model", "the file defines no `Model`")
    if not (isinstance(model, type) and issubclass(model, torch.nn.Module)):
        raise fail("model_not_module", f"`Model` is {model!r}, not an nn.Module subclass")
    if not callable(getattr(module, "get_inputs", None)):
        raise fail("no_get_inputs", "the file defines no callable `get_inputs()`")
    if not callable(getattr(module, "get_init_inputs", None)):
        raise fail("no_get_init_inputs", "the file defines no callable `get_init_inputs()`")

    for key, value in _preset_sizes(module, preset, fail).items():
        set_size(module, key, value)
    known = size_constants(module)
    for key, value in (sizes or {}).items():
        if key not in known and lenient:
            continue  # suite-wide sizes: only for the problems that define the constant
        if key not in known:
            raise fail("bad_preset", f"unknown size constant {key!r}; known: {sorted(known)}")
        if type(value) is not int:
            raise fail("bad_preset", f"size {key!r} must be an int, got {value!r}")
        set_size(module, key, value)

    _check_inputs(module, fail)
    return LoadedProblem(name, suite, path, source, preset, module, model)


def _preset_sizes(
    module: types.ModuleType, preset: str, fail: Callable[[str, str], ProblemError]
) -> dict[str, int]:
    presets = getattr(module, "PRESETS", {})
    if not isinstance(presets, dict):
        raise fail("bad_preset", "PRESETS must be a dict of {preset name: {constant: int}}")
    known = size_constants(module)
    for pname, values in presets.items():
        if not isinstance(values, dict):
            raise fail("bad_preset", f"PRESETS[{pname!r}] must be a dict")
        for key, value in values.items():
            if key not in known:
                raise fail("bad_preset", f"PRESETS[{pname!r}] sets unknown constant {key!r}")
            if type(value) is not int:
                raise fail("bad_preset", f"PRESETS[{pname!r}][{key!r}] must be an int")
    if preset == "none":
        return {}
    if preset == "full":
        return dict(presets.get("full", {}))
    if preset in presets:
        return dict(presets[preset])
    if preset == "ci":
        return generic_shrink(module, known)
    raise fail("bad_preset", f"unknown preset {preset!r}; have full, ci, none, {sorted(presets)}")


def _check_inputs(module: types.ModuleType, fail: Callable[[str, str], ProblemError]) -> None:
    """``get_inputs``/``get_init_inputs`` must return lists; tried on meta first (free)."""
    for fn_name in ("get_init_inputs", "get_inputs"):
        fn = getattr(module, fn_name)
        try:
            with torch.device("meta"):
                value = fn()
        except Exception:  # noqa: BLE001 - retry for real: some code cannot run on meta
            try:
                value = fn()
            except Exception as exc:  # noqa: BLE001
                raise fail("bad_inputs", f"{fn_name}() raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(value, list | tuple):
            raise fail("bad_inputs", f"{fn_name}() must return a list, got {type(value).__name__}")
        if fn_name == "get_inputs" and not any(isinstance(v, torch.Tensor) for v in value):
            raise fail("bad_inputs", "get_inputs() returned no tensor")


# --------------------------------------------------------------------------- description


def reference_case(
    problem: LoadedProblem, seed: int = 0, device: str | torch.device = "cpu"
) -> tuple[torch.nn.Module, list[Any]]:
    """The seeded reference model and inputs (KernelBench order: seed, init, seed, inputs).

    On a GPU the inputs are drawn there (``device`` as the default device): full-size inputs
    are GBs, seconds of CPU sampling each."""
    torch.manual_seed(seed)
    model = problem.Model(*problem.get_init_inputs()).to(device)
    torch.manual_seed(seed)
    with torch.device(device):
        raw = problem.get_inputs()
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in raw]
    return model, inputs


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for item in value for t in _tensors(item)]
    return []


def _passes(answer: list[torch.Tensor], reference: list[torch.Tensor], tol: float) -> bool:
    """Would ``answer`` pass a strict check: allclose and relative-error norm below ``tol``."""
    if len(answer) != len(reference) or not reference:
        return False
    for got, ref in zip(answer, reference, strict=True):
        if got.shape != ref.shape:
            return False
        got, ref = got.detach().double(), ref.detach().double()
        if not torch.allclose(got, ref, atol=tol, rtol=tol, equal_nan=True):
            return False
        ref_norm = float(torch.linalg.vector_norm(ref))
        err_norm = float(torch.linalg.vector_norm(got - ref))
        if err_norm > 0 and (ref_norm == 0 or err_norm / ref_norm >= tol):
            return False
    return True


def degenerate_flags(problem: LoadedProblem, seed: int = 0, tol: float = 1e-4) -> list[str]:
    """Flags for problems a trivial or impossible answer would game.

    ``zero_output_passes`` / ``constant_output_passes`` / ``identity_output_passes``: all
    zeros, the reference mean, or the first input would pass a strict check on seeded inputs.
    ``nondeterministic``: calling the reference twice in a row on the same inputs, from the
    same seed, disagrees (e.g. dropout in training mode, which no kernel can reproduce).
    """
    model, inputs = reference_case(problem, seed)
    with torch.no_grad():
        torch.manual_seed(seed)
        first = _tensors(model(*inputs))
        second = _tensors(model(*inputs))
    flags: list[str] = []
    if _passes([torch.zeros_like(t, dtype=torch.float64) for t in first], first, tol):
        flags.append("zero_output_passes")
    constant = [torch.full_like(t, float(t.double().mean()), dtype=torch.float64) for t in first]
    # A scalar output (a loss) is trivially equal to its own mean: not a degenerate problem.
    if any(t.numel() > 1 for t in first) and _passes(constant, first, tol):
        flags.append("constant_output_passes")
    head = inputs[0] if inputs and isinstance(inputs[0], torch.Tensor) else None
    if head is not None and len(first) == 1 and _passes([head], first, tol):
        flags.append("identity_output_passes")
    if not _passes(second, first, tol):
        flags.append("nondeterministic")
    return flags


def problem_meta(problem: LoadedProblem, *, check_degenerate: bool = True) -> ProblemMeta:
    """Category, cost, degenerate flags and digest of a loaded problem.

    Failures of the cost count or of the reference run are reported in ``error`` rather
    than raised, so a suite can always be described.
    """
    meta = ProblemMeta(
        name=problem.name,
        suite=problem.suite,
        path=str(problem.path) if problem.path is not None else "",
        source_digest=problem.source_digest,
        preset=problem.preset,
        sizes=problem.sizes(),
        category=problem.category,
    )
    errors: list[str] = []
    try:
        meta.flops, meta.min_bytes = flops_and_bytes(problem)
    except Exception as exc:  # noqa: BLE001
        errors.append(f"cost: {type(exc).__name__}: {exc}")
    if check_degenerate:
        try:
            meta.degenerate = degenerate_flags(problem)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"reference: {type(exc).__name__}: {exc}")
    meta.error = "; ".join(errors) or None
    return meta
