"""Run Triton candidates under TRITON_INTERPRET=1 and compare them with their references.

Used by the CPU tests in a child process: the interpreter flag is read when torch/triton are
imported, so it must be set before either. Prints one JSON object per case on stdout::

    python tests/platforms/interp_check.py refs            # refs/triton solution
    python tests/platforms/interp_check.py gen NAME POLICY PLAN_JSON SIZES_JSON
    python tests/platforms/interp_check.py file PROBLEM.py SOLUTION.py
    python tests/platforms/interp_check.py batch CASES_JSON   # [["refs"], ["gen", ...], ...]

``batch`` prints one JSON list (a case that raises becomes ``{"ok": false, "error": ...}``), so
several cases share one interpreter start-up.
"""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import importlib.util  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from types import ModuleType  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
TOL = {"strict": 1e-4, "relaxed": 1e-2}


def load_file(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compare(
    ref_model: torch.nn.Module, new_model: torch.nn.Module, inputs: list[Any], tol: float
) -> dict[str, Any]:
    with torch.no_grad():
        ref = ref_model(*inputs)
        out = new_model(*inputs)
    diff = (out.double() - ref.double()).abs()
    rel = float(
        torch.linalg.vector_norm(out.double() - ref.double())
        / torch.linalg.vector_norm(ref.double())
    )
    ok = (
        out.shape == ref.shape
        and bool(torch.isfinite(out).all())
        and bool((diff <= tol + tol * ref.double().abs()).all())
        and rel < tol
    )
    return {"ok": ok, "max_abs": float(diff.max()), "rel": rel, "shape": list(out.shape)}


def check_files(problem_path: Path, solution_path: Path) -> dict[str, Any]:
    problem = load_file(problem_path, "kf_problem")
    solution = load_file(solution_path, "kf_solution")
    torch.manual_seed(0)
    ref = problem.Model(*problem.get_init_inputs())
    torch.manual_seed(0)
    new = solution.ModelNew(*problem.get_init_inputs())  # seeded init must match the reference
    torch.manual_seed(1)
    return compare(ref, new, problem.get_inputs(), TOL["strict"])


def check_generated(
    name: str, policy: str, params: dict[str, Any], sizes: dict[str, int]
) -> dict[str, Any]:
    """The expert's Triton candidate of a starter problem, round 0's knobs with ``params``
    applied to its dominant kernel (as an analysis action is), against the reference."""
    from kforge.agents.expert.codegen.backend import get_backend
    from kforge.agents.expert.plan.planner import plan_problem
    from kforge.agents.expert.plan.record import dominant
    from kforge.agents.expert.plan.rounds import apply_action
    from kforge.problems import load_problem

    problem = load_problem(
        ROOT / "problems" / "starter" / f"{name}.py", preset="ci", sizes=sizes or None
    )
    program = plan_problem(problem.source)
    triton = get_backend("triton")
    knobs, _ = apply_action(triton.default_knobs(program, policy), dominant(program), "test", params)
    source = triton.render(program, triton.fit(program, knobs, policy), policy, problem.source)
    folder = Path(tempfile.mkdtemp())
    (folder / "cand.py").write_text(source)
    module = load_file(folder / "cand.py", f"kf_gen_{name}")
    torch.manual_seed(0)
    ref = problem.Model(*problem.get_init_inputs())
    torch.manual_seed(0)  # KernelBench order: the copied __init__ gives the same parameters
    new = module.ModelNew(*problem.get_init_inputs())
    torch.manual_seed(1)
    result = compare(ref, new, problem.get_inputs(), TOL[policy])
    result["kernels"] = source.count("@triton.jit")
    return result


def run_case(argv: list[str]) -> dict[str, Any]:
    mode = argv[0]
    if mode == "refs":
        folder = ROOT / "refs" / "triton"
        result = check_files(folder / "problem.py", folder / "solution.py")
    elif mode == "file":
        result = check_files(Path(argv[1]), Path(argv[2]))
    elif mode == "gen":
        result = check_generated(argv[1], argv[2], json.loads(argv[3]), json.loads(argv[4]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    return result


def main(argv: list[str]) -> None:
    if argv[0] != "batch":
        print(json.dumps(run_case(argv)))
        return
    results = []
    for case in json.loads(argv[1]):
        args = [c if isinstance(c, str) else json.dumps(c) for c in case]
        try:
            results.append(run_case(args))
        except Exception as err:  # reported per case; the test decides
            results.append({"ok": False, "error": f"{type(err).__name__}: {err}"})
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1:])
