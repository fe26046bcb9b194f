"""Benchmark the expert agent's CPU rounds against PyTorch eager on the starter suite.

For each problem (ci preset): round 0 is generated, built (fresh build dir, build time
recorded), checked against the reference, timed against eager in the same process (alternating,
median of reps, fixed thread count), profiled for its ``kforge::*`` kernel table, analysed; the
recommendation drives the next round. Prints a Markdown table (``--out`` also writes it).

    python benchmarks/expert_cpu.py [--rounds 3] [--reps 15] [--threads 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kforge.agents.expert import ExpertAgent  # noqa: E402
from kforge.config import AgentConfig  # noqa: E402
from kforge.platforms import cpu_runtime  # noqa: E402
from kforge.platforms.base import load_example  # noqa: E402
from kforge.problem_cost import flops_and_bytes  # noqa: E402
from kforge.problems import load_problem  # noqa: E402
from kforge.schema import (  # noqa: E402
    AnalysisRequest,
    GenerationRequest,
    KernelStat,
    Profile,
    Timing,
)
from kforge.verifier.peaks import measure_peaks  # noqa: E402

STARTER = ROOT / "problems" / "starter"


def timing(samples: list[float]) -> Timing:
    med = statistics.median(samples)
    mean = statistics.fmean(samples)
    cv = statistics.pstdev(samples) / mean if mean else 0.0
    return Timing(median_ms=med, mean_ms=mean, cv=cv, reps=len(samples), min_ms=min(samples))


def time_pair(cand: Any, eager: Any, inputs: list[Any], reps: int) -> tuple[Timing, Timing]:
    """Alternate candidate and eager calls; milliseconds per call."""
    c_ms: list[float] = []
    e_ms: list[float] = []
    with torch.no_grad():
        for _ in range(3):
            cand(*inputs)
            eager(*inputs)
        for _ in range(reps):
            for fn, acc in ((cand, c_ms), (eager, e_ms)):
                t0 = time.perf_counter()
                fn(*inputs)
                acc.append((time.perf_counter() - t0) * 1e3)
    return timing(c_ms), timing(e_ms)


def kernel_table(model: Any, inputs: list[Any]) -> list[KernelStat]:
    with torch.no_grad(), torch.profiler.profile() as prof:
        model(*inputs)
    return [KernelStat(name=e.key, calls=e.count, total_us=e.cpu_time_total)
            for e in prof.key_averages() if e.key.startswith("kforge::")]


def run_problem(name: str, agent: ExpertAgent, rounds: int, reps: int, peaks: Any) -> dict[str, Any]:
    problem = load_problem(STARTER / f"{name}.py", preset="ci")
    flops, nbytes = flops_and_bytes(problem)
    init = problem.get_init_inputs()
    torch.manual_seed(0)
    ref = problem.Model(*init)
    inputs = problem.get_inputs()
    with torch.no_grad():
        expected = ref(*inputs)
    req = GenerationRequest(problem_name=name, problem_source=problem.source, platform="cpu",
                            example=load_example("cpu"), policy="strict", round=0)
    row: dict[str, Any] = {"problem": name, "rounds": [], "builds": []}
    for rnd in range(rounds):
        gen = agent.generate(req)
        if gen.source is None:
            row["rounds"].append({"error": gen.extraction})
            break
        t0 = time.perf_counter()
        _, _, build_s = cpu_runtime.build_library(cpu_runtime.extract_cpp_source(gen.source))
        row["builds"].append(build_s or time.perf_counter() - t0)
        module = ModuleType(f"cand_{name}_{rnd}")
        exec(compile(gen.source, module.__name__, "exec"), module.__dict__)
        torch.manual_seed(0)
        new = module.ModelNew(*init)
        with torch.no_grad():
            ok = bool(torch.allclose(new(*inputs), expected, atol=1e-4, rtol=1e-4))
        cand_t, eager_t = time_pair(new, ref, inputs, reps)
        secs = cand_t.median_ms / 1e3
        prof = Profile(ok=True, candidate=cand_t, eager=eager_t, kernels=kernel_table(new, inputs),
                       flops=flops, min_bytes=nbytes, achieved_gflops=flops / secs / 1e9,
                       achieved_gbps=nbytes / secs / 1e9, peak_gflops=peaks.matmul_gflops,
                       peak_gbps=peaks.copy_gbps,
                       roofline_ms=max(flops / peaks.matmul_gflops / 1e6, nbytes / peaks.copy_gbps / 1e6),
                       extra={"threads": torch.get_num_threads()})
        rec = agent.analyze(AnalysisRequest(problem_name=name, platform="cpu", policy="strict",
                                            candidate_source=gen.source, plan=gen.plan, profile=prof))
        plan = gen.plan["cpu"]
        row["rounds"].append({"ok": ok, "ms": cand_t.median_ms, "eager_ms": eager_t.median_ms,
                              "cv": cand_t.cv, "bottleneck": rec.recommendation.bottleneck,
                              "plan": _short(plan), "actions": [a.kind for a in rec.recommendation.actions]})
        req = req.model_copy(update=dict(round=rnd + 1, previous_source=gen.source,
                                         previous_plan=gen.plan, recommendation=rec.recommendation))
    return row


def _short(plan: dict[str, Any]) -> str:
    bits = ["omp" if plan["threads"] else "1t", "simd" if plan["simd"] else "scalar"]
    if plan["unroll"] > 1:
        bits.append(f"u{plan['unroll']}")
    if plan["passes"] == 2:
        bits.append("2pass")
    bits.append("fused" if plan["fuse_epilogue"] else "unfused")
    bits.append(plan["gemm_kernel"])
    return "+".join(bits)


def render(rows: list[dict[str, Any]], rounds: int, header: str) -> str:
    cols = " | ".join(f"r{i} ms (plan)" for i in range(rounds))
    out = [header, "", f"| problem | eager ms | {cols} | best speedup | analysis after last round |",
           "|" + "---|" * (rounds + 4)]
    for row in rows:
        cells = []
        for r in row["rounds"]:
            if "error" in r:
                cells.append(r["error"])
            else:
                flag = "" if r["ok"] else " MISMATCH"
                cells.append(f"{r['ms']:.3f} ({r['plan']}){flag}")
        cells += [""] * (rounds - len(cells))
        good = [r for r in row["rounds"] if r.get("ok")]
        eager = statistics.median([r["eager_ms"] for r in good]) if good else float("nan")
        best = min((r["ms"] for r in good), default=float("nan"))
        last = row["rounds"][-1] if row["rounds"] else {}
        tail = f"{last.get('bottleneck', '')}: {', '.join(last.get('actions', [])) or 'nothing left'}"
        out.append(f"| {row['problem']} | {eager:.3f} | {' | '.join(cells)} | {eager / best:.2f}x | {tail} |")
    builds = [b for row in rows for b in row["builds"] if b > 0]
    if builds:
        out += ["", f"Build time per candidate (fresh g++ builds): median {statistics.median(builds):.2f} s, "
                f"max {max(builds):.2f} s over {len(builds)} builds."]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default="")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["KFORGE_BUILD_DIR"] = tempfile.mkdtemp(prefix="kforge-bench-")
    peaks = measure_peaks("cpu", Path(tempfile.gettempdir()) / "kforge-peaks")
    agent = ExpertAgent(AgentConfig(kind="expert"))
    names = sorted(p.stem for p in STARTER.glob("*.py") if args.only in p.stem)
    rows = [run_problem(n, agent, args.rounds, args.reps, peaks) for n in names]
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    header = (
        f"# Expert agent on the CPU vs PyTorch eager (starter suite, ci preset)\n\n"
        f"Host {platform.node()} ({peaks.device_name}), {args.threads} threads, torch {torch.__version__}, "
        f"{datetime.now(UTC).date()}, commit {commit}. Peaks measured here: "
        f"{peaks.copy_gbps:.1f} GB/s copy, {peaks.matmul_gflops:.1f} GFLOP/s fp32 matmul. Median of "
        f"{args.reps} alternating reps; CPU timings on a shared 2-core machine are noisy.\n"
        f"Policy strict (atol = rtol = 1e-4 against the fp32 reference; every round below matched)."
    )
    text = render(rows, args.rounds, header)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
