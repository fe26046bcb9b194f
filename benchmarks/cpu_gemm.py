"""The expert's CPU GEMM against torch.matmul (oneDNN / MKL) at the GEMM shapes of the starter
and level-2 suites' ``ci`` sizes, on 1 and 2 threads.

Each problem's reference runs once at its ci sizes under a dispatch mode that records the shape
of every ``mm`` / ``addmm`` / ``bmm`` it calls; each distinct shape becomes a bare
``torch.matmul`` problem, planned and rendered by the expert's CPU backend with the host's
default knobs (the tile its compiler's ISA picks), built, checked against torch, then timed
against ``torch.matmul`` on the same operands, alternating, median of ``--reps``.

    python benchmarks/cpu_gemm.py [--reps 30] [--threads 1 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kforge.agents.expert.codegen.backend import render_default  # noqa: E402
from kforge.agents.expert.plan.planner import plan_problem  # noqa: E402
from kforge.platforms import cpu_runtime  # noqa: E402
from kforge.problems import load_problem, reference_case  # noqa: E402

Shape = tuple[int, int, int, int]  # batch, M, K, N


class _Shapes(TorchDispatchMode):
    """Records (batch, M, K, N) of every GEMM the model calls."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Shape] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        if name in ("mm", "addmm", "bmm"):
            a, b = (args[1], args[2]) if name == "addmm" else (args[0], args[1])
            if name == "bmm":
                self.seen.append((a.shape[0], a.shape[1], a.shape[2], b.shape[2]))
            else:
                self.seen.append((1, a.shape[0], a.shape[1], b.shape[1]))
        return func(*args, **(kwargs or {}))


def gemm_shapes(path: Path) -> list[Shape]:
    problem = load_problem(path, preset="ci")
    model, inputs = reference_case(problem, seed=0)
    mode = _Shapes()
    with torch.no_grad(), mode:
        model(*inputs)
    return mode.seen


def matmul_source(shape: Shape) -> str:
    bat, m, k, n = shape
    lead = f"{bat}, " if bat > 1 else ""
    return f"""import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn({lead}{m}, {k}), torch.randn({lead}{k}, {n})]


def get_init_inputs():
    return []
"""


def load_candidate(source: str, folder: Path, name: str) -> ModuleType:
    file = folder / f"{name}.py"
    file.write_text(source)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def time_pair(ours: Any, theirs: Any, reps: int) -> tuple[float, float]:
    """Median ms of each, called alternately after a warm-up."""
    for _ in range(3):
        ours()
        theirs()
    a, b = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        ours()
        a.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        theirs()
        b.append(time.perf_counter() - t0)
    return statistics.median(a) * 1e3, statistics.median(b) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    shapes: dict[Shape, list[str]] = {}
    for suite in ("starter", "level2"):
        for path in sorted((ROOT / "problems" / suite).glob("*.py")):
            if not any(w in path.stem for w in ("gemm", "matmul", "bmm", "mlp", "linear")):
                continue
            for shape in gemm_shapes(path):
                shapes.setdefault(shape, []).append(f"{suite}/{path.stem}")

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True, check=False).stdout.strip() or "unknown"
    isa = cpu_runtime.vector_isa()
    rows = []
    with tempfile.TemporaryDirectory(prefix="kforge-gemm-") as tmp, torch.no_grad():
        for i, (shape, users) in enumerate(sorted(shapes.items(), key=lambda kv: -kv[0][1] * kv[0][2] * kv[0][3])):
            src = matmul_source(shape)
            module = load_candidate(render_default(plan_problem(src), "cpu", "strict", src), Path(tmp), f"g{i}")
            new = module.ModelNew()
            bat, m, k, n = shape
            a = torch.randn(bat, m, k) if bat > 1 else torch.randn(m, k)
            b = torch.randn(bat, k, n) if bat > 1 else torch.randn(k, n)
            torch.testing.assert_close(new(a, b), torch.matmul(a, b), atol=1e-4, rtol=1e-4)
            flop = 2.0 * bat * m * k * n
            cells = []
            for threads in args.threads:
                torch.set_num_threads(threads)
                ours, theirs = time_pair(lambda new=new, a=a, b=b: new(a, b), lambda a=a, b=b: torch.matmul(a, b), args.reps)
                cells.append((threads, flop / ours / 1e6, flop / theirs / 1e6, theirs / ours))
            rows.append((shape, users, cells))
            print(f"{shape}: " + "; ".join(f"{t}t {o:.0f} vs {r:.0f} GFLOP/s ({x:.2f}x)" for t, o, r, x in cells),
                  file=sys.stderr)

    head = (f"host {platform.node()} ({len(__import__('os').sched_getaffinity(0))} cores, {platform.machine()}, "
            f"compiler ISA {isa}), {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {commit}; torch {torch.__version__}; "
            f"median of {args.reps} alternating calls; fp32, checked against torch.matmul (1e-4)")
    cols = "".join(f" ours {t}t GFLOP/s | torch {t}t GFLOP/s | ratio {t}t |" for t in args.threads)
    lines = ["# Expert CPU GEMM vs torch.matmul", "", head, "",
             "| batch x M x K x N | problems |" + cols, "|---|---|" + "---|---|---|" * len(args.threads)]
    for (bat, m, k, n), users, cells in rows:
        shown = ", ".join(users[:3]) + (f" +{len(users) - 3}" if len(users) > 3 else "")
        lines.append(f"| {bat} x {m} x {k} x {n} | {shown} |"
                     + "".join(f" {o:.0f} | {r:.0f} | {x:.2f}x |" for _, o, r, x in cells))
    for j, t in enumerate(args.threads):
        ratios = [cells[j][3] for _, _, cells in rows]
        geo = statistics.geometric_mean(ratios) if ratios else float("nan")
        lines.append(f"\n{t} thread(s): geomean ratio {geo:.2f}x over {len(ratios)} shapes, "
                     f"{sum(r > 1 for r in ratios)} faster than torch")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
