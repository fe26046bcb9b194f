"""What the embedded expert agent covers: for every problem file of the given folders, whether
it is traced, planned, generated and (with ``--verify``) verified, per platform, and why not.

    python benchmarks/coverage.py problems/level2 ../shared/kernelbench/level1 --verify
    python benchmarks/coverage.py problems --platforms cpu,triton --out benchmarks/results/coverage.md

Verification runs the real verifier (sandboxed worker) at the ``ci`` preset; Triton candidates
run under ``TRITON_INTERPRET=1`` on a host without a GPU (correct, never timed). Prints one row
per (file, platform) and the totals; ``--out`` writes the same as a markdown file with the
host, date and commit.
"""

from __future__ import annotations

import argparse
import os
import platform as host_platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kforge.agents.expert.errors import UnsupportedError  # noqa: E402


def stage_of(problem: Path, target: str, policy: str, verify: bool) -> tuple[str, str, float]:
    """(furthest stage reached, reason, seconds) for one file on one platform."""
    from kforge.agents.expert.capture.trace import capture_problem
    from kforge.agents.expert.ir.build import build_graph
    from kforge.agents.expert.plan.planner import plan_graph

    start = time.monotonic()
    source = problem.read_text()
    try:
        captured = capture_problem(source)
    except UnsupportedError as err:
        return "failed", str(err), time.monotonic() - start
    try:
        program = plan_graph(build_graph(captured))
    except UnsupportedError as err:
        return "traced", str(err), time.monotonic() - start
    try:
        candidate = generate(program, source, target, policy)
    except UnsupportedError as err:
        return "planned", str(err), time.monotonic() - start
    if not verify:
        return "generated", program.summary(), time.monotonic() - start
    from kforge.verifier.preflight import build_candidate, resolve_platform
    from kforge.verifier.runner import build_folder
    from kforge.verifier.verify import verify_candidate

    folder = build_folder(target, None).resolve()
    try:  # the platform's build first, as the pipeline's compile stage does
        build_candidate(resolve_platform(target), candidate, folder)
    except Exception as err:  # noqa: BLE001 - a build failure is this file's row
        return "generated", f"build: {str(err)[:160]}", time.monotonic() - start
    verdict = verify_candidate(candidate, problem, platform=target, policy=policy, preset="ci",
                               trials=2, timeout_s=600, build_dir=folder)
    if verdict.ok:
        return "verified", program.summary(), time.monotonic() - start
    return "generated", f"{verdict.reason}: {verdict.detail[:160]}", time.monotonic() - start


def generate(program: object, source: str, target: str, policy: str) -> str:
    from kforge.agents.expert.codegen.backend import render_default

    return render_default(program, target, policy, source)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="folders or single problem files")
    parser.add_argument("--platforms", default="cpu,triton")
    parser.add_argument("--policy", default="strict")
    parser.add_argument("--verify", action="store_true")
    parser.add_argument("--limit", type=int, default=0, help="at most this many files per folder")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    os.environ.setdefault("TRITON_INTERPRET", "1")
    rows: list[tuple[str, str, str, str, float]] = []
    for folder in args.folders:  # a folder, or one file (labelled by its folder too)
        files = [folder] if folder.is_file() else sorted(p for p in folder.rglob("*.py") if not p.name.startswith("_"))
        if args.limit:
            files = files[: args.limit]
        for path in files:
            for target in args.platforms.split(","):
                stage, reason, seconds = stage_of(path, target, args.policy, args.verify)
                label = f"{path.parent.name}/{path.name}" if folder.is_file() else f"{folder.name}/{path.relative_to(folder)}"
                rows.append((label, target, stage, reason, seconds))
                print(f"{label:70s} {target:7s} {stage:10s} {seconds:6.1f}s  {reason[:110]}", flush=True)
    order = ("failed", "traced", "planned", "generated", "verified")
    lines = ["", "totals (a file counts at the furthest stage it reached):"]
    for target in args.platforms.split(","):
        mine = [r for r in rows if r[1] == target]
        reached = {s: sum(1 for r in mine if order.index(r[2]) >= order.index(s)) for s in order[1:]}
        random = sum(1 for r in mine if r[3].startswith("nondeterministic_reference"))
        lines.append(f"  {target}: {len(mine)} files; traced {reached['traced']}, planned {reached['planned']}, "
                     f"generated {reached['generated']}" + (f", verified {reached['verified']}" if args.verify else "")
                     + f" (references that draw random numbers, refused by design: {random})")
    print("\n".join(lines))
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        head = [f"# Expert agent coverage ({args.policy})", "",
                f"host {host_platform.node()} ({host_platform.machine()}, no GPU: Triton interpreted), "
                f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit}", "",
                f"`python benchmarks/coverage.py {' '.join(map(str, args.folders))} --platforms {args.platforms}"
                f"{' --verify' if args.verify else ''}`", "",
                "| file | platform | stage | seconds | reason / plan |", "|---|---|---|---|---|"]
        body = [f"| {f} | {t} | {s} | {sec:.1f} | {' '.join(r.split())[:140].replace('|', '/')} |" for f, t, s, r, sec in rows]
        args.out.write_text("\n".join(head + body + ["", "```", *lines[1:], "```", ""]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
