"""What the parent's clock costs on the CPU: the same candidates timed through the verifier's
checked timing path with the worker's own clock (in-process) and with the trusted parent's
clock (handshake.py), alternated, several rounds.

    python benchmarks/verify_cpu_clock.py [--rounds 3] [--reps 30] [--threads 1]
        [--candidates DIR] [--tree PATH] [--out FILE]

Candidates: the expert agent's round 0 for every starter problem (ci preset), plus refs/cpu's
solution (bias + ReLU, the honest control of tests/verifier/cpu_offenders.py) and the same at
16 x 64 (tests/verifier/fixtures/bias_relu_small.py, a call of microseconds). ``--candidates``
keeps the generated sources (reused when present), so an older checkout (``--tree``, its
``profile_candidate`` taking ``parent_clock``) can time the very same kernels: that is how the
before/after numbers in docs/VERIFY_DESIGN.md were taken.

Modes: ``inproc`` (worker clock, one call per figure), ``parent`` (the parent's clock, one call
per handshake), and on a tree that has batches ``inproc-batch`` (worker clock, the same batches)
and ``parent-batch`` (the parent's clock with batches: the default path).
"""

from __future__ import annotations

import argparse
import inspect
import platform
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--only", default="", help="problems whose name contains one of these (comma-separated)")
    p.add_argument("--candidates", type=Path, default=None, help="folder of <problem>.py candidates (kept)")
    p.add_argument("--tree", type=Path, default=ROOT, help="the kforge checkout to time with")
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args()


def problems(tree: Path) -> dict[str, Path]:
    found = {p.stem: p for p in sorted((ROOT / "problems" / "starter").glob("*.py"))}
    found["refs_bias_relu"] = ROOT / "refs" / "cpu" / "problem.py"
    found["bias_relu_16x64"] = ROOT / "tests" / "verifier" / "fixtures" / "bias_relu_small.py"
    return found


def candidate(name: str, path: Path, folder: Path) -> str | None:
    saved = folder / f"{name}.py"
    if saved.is_file():
        return saved.read_text()
    if name in ("refs_bias_relu", "bias_relu_16x64"):
        source = (ROOT / "refs" / "cpu" / "solution.py").read_text()
    else:
        from kforge.agents.expert import ExpertAgent
        from kforge.config import AgentConfig
        from kforge.platforms.base import load_example
        from kforge.schema import GenerationRequest

        req = GenerationRequest(problem_name=name, problem_source=path.read_text(), platform="cpu",
                                example=load_example("cpu"), policy="strict", round=0)
        source = ExpertAgent(AgentConfig(kind="expert")).generate(req).source
        if source is None:
            return None
    saved.write_text(source)
    return source


def main() -> int:
    args = _args()
    sys.path.insert(0, str(args.tree.resolve()))
    from kforge.platforms.cpu import PLATFORM
    from kforge.verifier.profiling import profile_candidate

    batches = "batch_ns" in inspect.signature(profile_candidate).parameters
    modes: dict[str, dict[str, Any]] = {"inproc": {"parent_clock": False}, "parent": {"parent_clock": True}}
    if batches:
        modes["inproc"]["batch_ns"] = 0
        modes["parent"]["batch_ns"] = 0
        modes["inproc-batch"] = {"parent_clock": False}
        modes["parent-batch"] = {"parent_clock": True}
    folder = args.candidates or Path(tempfile.mkdtemp(prefix="kforge-clock-cands-"))
    folder.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix="kforge-clock-build-"))
    results: dict[str, dict[str, list[float]]] = {}
    ks: dict[str, Any] = {}
    for name, path in problems(args.tree).items():
        if not any(part in name for part in args.only.split(",")):
            continue
        source = candidate(name, path, folder)
        if source is None or not PLATFORM.build(source, build).ok:
            print(f"{name}: no candidate / build failed", file=sys.stderr)
            continue
        results[name] = {m: [] for m in modes}
        for _ in range(args.rounds):
            for mode, kw in modes.items():
                prof = profile_candidate(source, path, platform="cpu", preset="ci", reps=args.reps,
                                         threads=args.threads, build_dir=build, **kw)
                if not prof.ok or prof.candidate is None:
                    print(f"{name} {mode}: {prof.reason} {prof.detail[:200]}", file=sys.stderr)
                    continue
                results[name][mode].append(prof.candidate.median_ms)
                if mode == "parent-batch":
                    ks[name] = (prof.extra.get("batch") or {}).get("candidate")
        print(name, {m: [round(v, 4) for v in vs] for m, vs in results[name].items()}, flush=True)
    commit = subprocess.run(["git", "-C", str(args.tree), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    lines = [
        f"host {platform.node()}, {args.threads} thread(s), {args.rounds} rounds x {args.reps} reps, tree "
        f"{args.tree} at {commit}, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; median over rounds of each "
        "round's median ms (candidate only)", "",
        "| problem | " + " | ".join(f"{m} ms" for m in modes) + " | parent / inproc |"
        + (" parent-batch / inproc-batch | k |" if batches else ""),
        "|---" * (len(modes) + 2 + (2 if batches else 0)) + "|",
    ]
    for name, by_mode in results.items():
        med = {m: statistics.median(v) if v else None for m, v in by_mode.items()}
        cells = ["-" if med[m] is None else f"{med[m]:.4f}" for m in modes]

        def ratio(m: str, over: str = "inproc", med: dict[str, float | None] = med) -> str:
            return "-" if not med.get(over) or med.get(m) is None else f"{med[m] / med[over]:.2f}"  # type: ignore[operator]

        row = f"| {name} | " + " | ".join(cells) + f" | {ratio('parent')} |"
        if batches:
            row += f" {ratio('parent-batch', 'inproc-batch')} | {ks.get(name, '-')} |"
        lines.append(row)
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
