"""The expert agent's Triton kernels for a whole suite on a GPU: full-size correctness and
timing against eager and torch.compile in one process, per precision policy.

Two steps (candidates are shape-generic, so they are generated once, anywhere):

    python benchmarks/expert_suite_gpu.py generate problems/level2 --to .h200/cands
    python benchmarks/expert_suite_gpu.py run problems/level2 --cands .h200/cands --out OUT/suite.jsonl
    python benchmarks/expert_suite_gpu.py table OUT/suite.jsonl > benchmarks/results/level2_h200.md

``--suite conv`` takes a folder's convolution + tail problems instead of its GEMM ones (the
im2col ``unfold`` + GEMM path, e.g. ``../shared/kernelbench/level2``; pass it to every step).

``run`` is resumable (problems already in the JSONL are skipped) and stops cleanly before
``--deadline`` seconds. Per problem: the reference at ``full`` sizes on the GPU with TF32 off
gives the fp32 ground truth; eager and torch.compile are timed with PyTorch's defaults
(``triton.testing.do_bench``: L2 flushed, median); each policy's candidate is built with the
reference's weights, its full-size output compared with the ground truth (the policy's atol =
rtol, plus the relative error norm; the margin = max |err| / allowed is recorded), then timed.
A problem without a faster verified kernel counts 1.0 in the geomean (KernelBench's fast_p).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOL = {"strict": 1e-4, "relaxed": 1e-2}
POLICIES = ("strict", "relaxed")
# The precision ladder: each policy's GEMM steps, cheapest first; the first that passes is kept.
LADDER = {"strict": ("fp16x3", "tf32x3", "ieee"), "relaxed": ("fp16", "fp16x2", "tf32", "fp16x3", "tf32x3")}


ONLY: set[str] = set()  # --only: problem id prefixes (001,020) to restrict a run to
SUITE = ["gemm"]  # --suite: which problems of a folder ("gemm" or "conv")


def _is_conv(path: Path, text: str) -> bool:
    return "conv" in path.name.lower() or "Conv" in text


def gemm_problems(folder: Path) -> list[Path]:
    """The suite's problems, by id: GEMM / matmul / bmm + tail (``--suite gemm``: convolutions
    left out) or convolution + tail (``--suite conv``)."""
    out = []
    for path in sorted(folder.glob("*.py"), key=lambda p: (len(p.stem.split("_")[0]), p.stem)):
        if ONLY and path.stem.split("_")[0] not in ONLY:
            continue
        text = path.read_text()
        if SUITE[0] == "conv":
            if _is_conv(path, text):
                out.append(path)
            continue
        if _is_conv(path, text):
            continue
        if any(w in text for w in ("nn.Linear", "matmul", "torch.bmm", "@")):
            out.append(path)
    return out


def gemm_flops(program: object) -> float:
    """The program's GEMM work at the traced (the file's own) sizes: 2 * batch * M * N * K summed."""
    from kforge.agents.expert.plan.kernels import GemmKernel

    total = 0.0
    for k in program.kernels:  # type: ignore[attr-defined]
        if isinstance(k, GemmKernel):
            batch = program.hint(k.batch) if k.batch is not None else 1  # type: ignore[attr-defined]
            total += 2.0 * batch * program.hint(k.m) * program.hint(k.n) * program.hint(k.k)  # type: ignore[attr-defined]
    return total


def generate(folder: Path, to: Path) -> None:
    from kforge.agents.expert.codegen.backend import get_backend
    from kforge.agents.expert.errors import UnsupportedError
    from kforge.agents.expert.plan.planner import plan_problem
    from kforge.agents.expert.plan.rounds import set_precision

    triton = get_backend("triton")
    flops: dict[str, float] = {}
    for path in gemm_problems(folder):
        source = path.read_text()
        try:
            program = plan_problem(source)
        except UnsupportedError as err:
            for policy in POLICIES:
                (to / policy).mkdir(parents=True, exist_ok=True)
                (to / policy / f"{path.stem}.txt").write_text(str(err))
            print(f"{path.stem}: {err}")
            continue
        for policy in POLICIES:
            (to / policy).mkdir(parents=True, exist_ok=True)
            for step in LADDER[policy]:
                knobs = triton.default_knobs(program, policy)
                for name in knobs.precisions():
                    knobs = set_precision(triton, program, knobs, name, step)
                code = triton.render(program, triton.fit(program, knobs, policy), policy, source)
                (to / policy / f"{path.stem}.{step}.py").write_text(code)
        flops[path.stem] = gemm_flops(program)
        (to / "flops.json").write_text(json.dumps(flops, indent=1, sort_keys=True))
        print(f"{path.stem}: {program.summary()}")


def _load(path: Path, name: str) -> object:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _flat(value: object) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    return [t for v in value for t in _flat(v)]  # type: ignore[union-attr]


def run_one(path: Path, cands: Path) -> dict:
    import torch
    from triton.testing import do_bench

    from kforge.problems import load_problem, reference_case

    row: dict = {"problem": path.stem}
    problem = load_problem(path, preset="full")
    ref, inputs = reference_case(problem, 0, device="cuda")
    with torch.no_grad():
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        want = [t.detach().clone() for t in _flat(ref(*inputs))]
        torch.backends.cudnn.allow_tf32 = True  # PyTorch's defaults for the baselines
        row["eager_ms"] = do_bench(lambda: ref(*inputs), return_mode="median")
        compiled = torch.compile(ref)
        compiled(*inputs)
        row["compile_ms"] = do_bench(lambda: compiled(*inputs), return_mode="median")
    best = min(row["eager_ms"], row["compile_ms"])
    for policy in POLICIES:
        entry: dict = {}
        row[policy] = entry
        steps = [s for s in LADDER[policy] if (cands / policy / f"{path.stem}.{s}.py").is_file()]
        if not steps:
            note = cands / policy / f"{path.stem}.txt"
            entry.update(status="no_candidate", detail=note.read_text()[:200] if note.is_file() else "")
        for step in steps:
            entry.clear()
            entry["step"] = step
            if _try_candidate(cands / policy / f"{path.stem}.{step}.py", policy, problem, ref, inputs, want, best, entry):
                break
    return row


def _try_candidate(cand: Path, policy: str, problem: object, ref: object, inputs: list, want: list,
                   best: float, entry: dict) -> bool:
    """Build, check at full size, time; True when verified (``entry`` gets the numbers)."""
    import torch
    from triton.testing import do_bench

    if True:
        try:
            module = _load(cand, f"cand_{cand.stem.replace('.', '_')}_{policy}")
            torch.manual_seed(0)
            new = module.ModelNew(*problem.get_init_inputs()).cuda()  # type: ignore[attr-defined]
            new.load_state_dict(ref.state_dict())  # type: ignore[attr-defined]
            with torch.no_grad():
                got = _flat(new(*inputs))
                tol = TOL[policy]
                margin, ok = 0.0, len(got) == len(want)
                for g, w in zip(got, want, strict=False):
                    if g.shape != w.shape:
                        ok = False
                        continue
                    err = (g.double() - w.double()).abs()
                    allowed = tol + tol * w.double().abs()
                    margin = max(margin, float((err / allowed).max()))
                    rel = float(torch.linalg.vector_norm(g.double() - w.double()) / max(float(torch.linalg.vector_norm(w.double())), 1e-30))
                    ok = ok and bool(torch.isfinite(g).all() or not torch.isfinite(w).all()) and margin <= 1.0 and rel < tol
                entry["margin"] = margin
                if not ok:
                    entry.update(status="mismatch")
                    return False
                ms = do_bench(lambda: new(*inputs), return_mode="median")
            entry.update(status="verified", ms=ms, speedup=best / ms)
            return True
        except Exception as err:  # noqa: BLE001 - one candidate's failure is a row
            entry.update(status="error", detail=f"{type(err).__name__}: {str(err)[:300]}")
            traceback.print_exc()
            return False


def run(folder: Path, cands: Path, out: Path, deadline: float) -> None:
    """Each problem in a fresh process (a CUDA fault poisons its process, not the suite)."""
    import subprocess

    start = time.monotonic()
    done = set()
    if out.is_file():
        done = {json.loads(line)["problem"] for line in out.read_text().splitlines() if line.strip()}
    for path in gemm_problems(folder):
        left = deadline - (time.monotonic() - start)
        if path.stem in done:
            continue
        if left < 30:
            print("deadline: stopping, resumable")
            return
        t0 = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, __file__, "one", str(path), "--cands", str(cands),
                                   "--suite", SUITE[0]],
                                  capture_output=True, text=True, timeout=left)
            lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
            row = json.loads(lines[-1]) if lines else {"problem": path.stem, "error": proc.stderr[-400:]}
        except subprocess.TimeoutExpired:
            print(f"{path.stem}: cut by the deadline, resumable")
            return
        row["seconds"] = time.monotonic() - t0
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)


def table(path: Path, cands: Path | None = None) -> str:
    """The markdown table; with ``cands`` (its ``flops.json``, written by ``generate``) the GEMM
    work's achieved rate under each baseline and policy (TFLOP/s at the file's sizes)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    flops = json.loads((cands / "flops.json").read_text()) if cands and (cands / "flops.json").is_file() else {}
    rate = bool(flops)
    head = ("| problem | eager ms | compile ms | strict ms | x best | step | margin | relaxed ms | x best | step | margin |"
            + (" GFLOP | TFLOP/s best baseline, strict, relaxed |" if rate else "") + "\n"
            "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if rate else ""))
    lines = [head]
    logs = {p: [] for p in POLICIES}
    shipped = {p: [] for p in POLICIES}
    for r in rows:
        cells = [r["problem"], f"{r.get('eager_ms', float('nan')):.3f}", f"{r.get('compile_ms', float('nan')):.3f}"]
        for p in POLICIES:
            e = r.get(p, {"status": "error"})
            if e.get("status") == "verified":
                s = e["speedup"]
                cells += [f"{e['ms']:.3f}", f"{s:.2f}", e.get("step", "-"), f"{e.get('margin', 0):.2g}"]
                value = s if s > 1.0 else 1.0
                if s > 1.0:
                    shipped[p].append(s)
            else:
                cells += [e.get("status", "error"), "-", e.get("step", "-"), f"{e['margin']:.2g}" if "margin" in e else "-"]
                value = 1.0
            logs[p].append(math.log(value))
        if rate:
            f = flops.get(r["problem"], 0.0)
            times = [min(r.get("eager_ms", math.inf), r.get("compile_ms", math.inf))]
            times += [r.get(p, {}).get("ms", math.inf) if r.get(p, {}).get("status") == "verified" else math.inf
                      for p in POLICIES]
            cells += [f"{f / 1e9:.1f}", ", ".join(f"{f / t / 1e9:.0f}" if math.isfinite(t) and f else "-" for t in times)]
        lines.append("| " + " | ".join(cells) + " |")
    n = len(rows)
    summary = []
    for p in POLICIES:
        g_all = math.exp(sum(logs[p]) / n) if n else float("nan")
        g_ship = f"{math.exp(sum(map(math.log, shipped[p])) / len(shipped[p])):.2f}x" if shipped[p] else "none"
        fast = {q: sum(1 for r in rows if r.get(p, {}).get("status") == "verified" and r[p]["speedup"] > q) / n for q in (1.0, 1.5, 2.0)}
        summary.append(f"{p}: {n} problems, {len(shipped[p])} faster than the faster baseline; geomean over the whole suite "
                       f"(not faster = 1.0) {g_all:.2f}x; geomean over those faster only {g_ship}; "
                       f"fast_1 {fast[1.0]:.2f}, fast_1.5 {fast[1.5]:.2f}, fast_2 {fast[2.0]:.2f}")
    return "\n".join(lines) + "\n\n" + "\n".join(summary) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("step", choices=("generate", "run", "one", "table"))
    ap.add_argument("path", type=Path)
    ap.add_argument("--to", type=Path)
    ap.add_argument("--cands", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--deadline", type=float, default=540)
    ap.add_argument("--only", default="", help="comma-separated problem ids (001,020): only these")
    ap.add_argument("--suite", choices=("gemm", "conv"), default="gemm")
    a = ap.parse_args(argv)
    SUITE[0] = a.suite
    ONLY.update(x for x in a.only.split(",") if x)
    if a.step == "generate":
        generate(a.path, a.to)
    elif a.step == "run":
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "16")
        run(a.path, a.cands, a.out, a.deadline)
    elif a.step == "one":
        print(json.dumps(run_one(a.path, a.cands)), flush=True)
    else:
        print(table(a.path, a.cands))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
