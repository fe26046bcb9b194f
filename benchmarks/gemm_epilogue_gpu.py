"""The precision ladder and the GEMM core on a CUDA GPU: every precision step and tile plan of
the expert's Triton GEMM + epilogue kernels against eager and torch.compile, in one process.

    python benchmarks/gemm_epilogue_gpu.py run --out OUT/gemm.jsonl [--problems 001,016] [--deadline 500]
    python benchmarks/gemm_epilogue_gpu.py table OUT/gemm.jsonl > benchmarks/results/gemm_ladder_h200.md
    python benchmarks/gemm_epilogue_gpu.py smoke       # CPU: the same code path, interpreter, ci sizes

Per problem (problems/level2 GEMM + epilogue files, ``full`` sizes), in a process of its own:
the reference with TF32 off gives the fp32 ground truth; eager and torch.compile are timed with
PyTorch's defaults; then for each plan (precision step, precast, tiles) the compiler's candidate
is rendered with those knobs, built with the reference's weights, its output compared with the
ground truth (margin = max |err| / (tol + tol |ref|) and the relative error norm, for both
policies: strict 1e-4, relaxed 1e-2), and timed (``triton.testing.do_bench``: L2 flushed,
median). TFLOP/s counts the problem's FLOPs (torch's flop counter on the reference);
``% peak`` is the tensor-core work the step really issues (1, 2 or 3 products per MAC) over the
dense peak of its unit (bf16 989, tf32 494 TFLOP/s; ieee: fp32 FMA 67). ``run`` is resumable.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOL = {"strict": 1e-4, "relaxed": 1e-2}
PEAK_TFLOPS = {"bf16": 989.0, "tf32": 494.0, "ieee": 67.0}
# (precision, precast, BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages); precast 0: both
# operands converted in the K loop, 1: both precast, 2: A precast, B (the weight) rounded in
# registers with the tile computed transposed (the ``b_regs`` knob)
PLANS: list[tuple[str, int, int, int, int, int, int]] = [
    ("bf16", 1, 128, 256, 64, 8, 4),
    ("bf16", 1, 128, 256, 64, 8, 3),
    ("bf16", 1, 256, 128, 64, 8, 3),
    ("bf16", 1, 128, 128, 64, 4, 4),
    ("bf16", 0, 128, 256, 64, 8, 3),
    ("bf16", 2, 128, 128, 64, 8, 3),
    ("bf16", 2, 256, 128, 64, 8, 3),
    ("bf16", 2, 128, 256, 64, 8, 3),
    ("bf16", 2, 128, 128, 64, 4, 4),
    ("bf16x2", 2, 128, 256, 64, 8, 3),
    ("bf16x3", 2, 128, 128, 32, 8, 3),
    ("bf16x2", 1, 128, 256, 64, 8, 3),
    ("bf16x2", 1, 128, 256, 32, 8, 4),
    ("bf16x3", 1, 128, 256, 32, 8, 3),
    ("bf16x3", 1, 128, 128, 64, 8, 3),
    ("bf16x3", 1, 128, 128, 32, 4, 4),
    ("bf16x3", 0, 128, 128, 32, 8, 4),
    ("fp16", 2, 256, 128, 64, 8, 3),  # the fp16 steps on their bf16 counterparts' tiles
    ("fp16", 1, 128, 256, 64, 8, 3),
    ("fp16x2", 1, 128, 128, 64, 8, 3),  # split fp16 steps: two accumulators, so 128 x 128 at 8 warps
    ("fp16x3", 1, 128, 128, 64, 8, 3),
    ("fp16x3", 1, 128, 128, 32, 8, 4),
    ("fp16x3", 2, 128, 128, 64, 8, 3),
    ("tf32", 0, 128, 256, 32, 8, 3),
    ("tf32x3", 0, 128, 64, 32, 4, 4),
    ("tf32x3", 0, 128, 128, 32, 8, 4),
    ("ieee", 0, 128, 128, 32, 8, 3),
]
PRODUCTS = {"bf16": ("bf16", 1), "bf16x2": ("bf16", 2), "bf16x3": ("bf16", 3), "tf32": ("tf32", 1),
            "fp16": ("bf16", 1), "fp16x2": ("bf16", 2), "fp16x3": ("bf16", 3),  # fp16: bf16's tensor rate
            "tf32x3": ("tf32", 3), "ieee": ("ieee", 1)}
# GEMM + epilogue problems of problems/level2 without a reduction after the GEMM, and a bmm
DEFAULT = ("001", "002", "003", "004", "005", "016", "017", "018", "045", "046", "048", "020")


def problem_paths(folder: Path, ids: list[str]) -> list[Path]:
    out = []
    for i in ids:
        hits = sorted(folder.glob(f"{i}_*.py")) or sorted(folder.glob(f"{i}.py"))
        if not hits:
            raise SystemExit(f"no problem {i!r} in {folder}")
        out.append(hits[0])
    return out


def render(path: Path, plan: tuple[str, int, int, int, int, int, int], policy: str) -> str:
    from kforge.agents.expert.codegen.backend import get_backend
    from kforge.agents.expert.plan.knobs import TritonGemm
    from kforge.agents.expert.plan.planner import plan_problem

    source = path.read_text()
    program = plan_problem(source)
    precision, precast, bm, bn, bk, warps, stages = plan
    triton = get_backend("triton")
    knobs = triton.default_knobs(program, policy).with_params(TritonGemm, {
        "precision": precision, "precast": min(precast, 1), "b_regs": int(precast == 2), "BLOCK_M": bm,
        "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps, "num_stages": stages})
    return triton.render(program, triton.fit(program, knobs, policy), policy, source)


def _load(code: str, name: str) -> Any:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False, dir=os.environ.get("KF_TMP")) as f:
        f.write(code)
    spec = importlib.util.spec_from_file_location(name, f.name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _flat(value: Any) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    return [t for v in value for t in _flat(v)]


def judge(got: list, want: list) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {}
    for policy, tol in TOL.items():
        margin, rel, ok = 0.0, 0.0, len(got) == len(want)
        for g, w in zip(got, want, strict=False):
            if g.shape != w.shape:
                ok = False
                continue
            d = (g.double() - w.double()).abs()
            margin = max(margin, float((d / (tol + tol * w.double().abs())).max()))
            rel = max(rel, float(torch.linalg.vector_norm(d) / max(float(torch.linalg.vector_norm(w.double())), 1e-30)))
            ok = ok and bool(torch.isfinite(g).all())
        out[policy] = {"margin": margin, "rel": rel, "pass": bool(ok and margin <= 1.0 and rel < tol)}
    out["max_abs"] = max(float((g.double() - w.double()).abs().max()) for g, w in zip(got, want, strict=False))
    return out


def run_one(path: Path, device: str, preset: str, rounds: int, steps: tuple[str, ...] = (),
            compile_baseline: bool = True, scale: float = 1.0) -> dict[str, Any]:
    """One problem's plans (only those of ``steps`` when given); ``compile_baseline`` False
    skips torch.compile (its x best is then over eager alone)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from kforge.problems import load_problem, reference_case

    gpu = device == "cuda"
    if gpu:
        from triton.testing import do_bench
    else:
        def do_bench(fn: Any, return_mode: str = "median") -> float:  # smoke: host clock, not a measurement
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
    row: dict[str, Any] = {"problem": path.stem, "plans": []}
    problem = load_problem(path, preset=preset)
    ref, inputs = reference_case(problem, 0, device=device)
    if scale != 1.0:  # the verifier's "scaled" case: floating inputs times 64 (kforge.verifier.inputs)
        inputs = [v * scale if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in inputs]
        row["input_scale"] = scale
    with torch.no_grad():
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        with FlopCounterMode(display=False) as counter:
            want = [t.detach().clone() for t in _flat(ref(*inputs))]
        row["gflop"] = counter.get_total_flops() / 1e9
        torch.backends.cudnn.allow_tf32 = True  # PyTorch's defaults for the baselines
        row["eager_ms"] = do_bench(lambda: ref(*inputs), return_mode="median")
        if gpu and compile_baseline:
            compiled = torch.compile(ref)
            compiled(*inputs)
            row["compile_ms"] = do_bench(lambda: compiled(*inputs), return_mode="median")
        else:  # the CPU smoke has no compiler to time; a skipped one is no figure
            row["compile_ms"] = row["eager_ms"] if not gpu else None
    best = min(x for x in (row["eager_ms"], row["compile_ms"]) if x is not None)
    for i, plan in enumerate(PLANS):
        if steps and plan[0] not in steps:
            continue
        entry: dict[str, Any] = {"precision": plan[0], "precast": plan[1], "tiles": "x".join(map(str, plan[2:5])),
                                 "warps": plan[5], "stages": plan[6]}
        row["plans"].append(entry)
        try:
            module = _load(render(path, plan, "relaxed"), f"cand_{path.stem}_{i}")
            torch.manual_seed(0)
            new = module.ModelNew(*problem.get_init_inputs()).to(device)
            new.load_state_dict(ref.state_dict())
            with torch.no_grad():
                entry.update(judge(_flat(new(*inputs)), want))
                ms = min(do_bench(lambda: new(*inputs), return_mode="median")  # noqa: B023 (run at once)
                         for _ in range(rounds))
            unit, products = PRODUCTS[plan[0]]
            tflops = row["gflop"] / ms  # GFLOP / ms = TFLOP/s
            entry.update(ms=ms, speedup=best / ms, tflops=tflops, frac_peak=tflops * products / PEAK_TFLOPS[unit])
        except Exception as err:  # noqa: BLE001 - one plan's failure is a row
            entry.update(error=f"{type(err).__name__}: {str(err)[:300]}")
            traceback.print_exc()
    return row


def run(ids: list[str], out: Path, deadline: float, extra: tuple[str, ...] = ()) -> None:
    run_each(__file__, ids, out, deadline, extra, reserve=40)


def run_each(script: str, ids: list[str], out: Path, deadline: float, extra: tuple[str, ...] = (),
             reserve: float = 40) -> None:
    """``script one PATH *extra`` for each problem of ``ids`` in a fresh process (a CUDA fault
    poisons its process, not the run), its last JSON line appended to ``out``; problems already
    there are skipped, and none starts with less than ``reserve`` of ``deadline``'s seconds left."""
    import subprocess

    start = time.monotonic()
    done = {json.loads(x)["problem"] for x in out.read_text().splitlines() if x.strip()} if out.is_file() else set()
    for path in problem_paths(ROOT / "problems" / "level2", ids):
        left = deadline - (time.monotonic() - start)
        if path.stem in done:
            continue
        if left < reserve:
            print("deadline: stopping, resumable")
            return
        try:
            proc = subprocess.run([sys.executable, script, "one", str(path), *extra], capture_output=True,
                                  text=True, timeout=left)
        except subprocess.TimeoutExpired:
            print(f"{path.stem}: cut by the deadline, resumable")
            return
        lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
        row = json.loads(lines[-1]) if lines else {"problem": path.stem, "error": proc.stderr[-600:]}
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(path.stem, "done", flush=True)


def _f(v: Any, fmt: str = ".3f") -> str:
    return format(v, fmt) if isinstance(v, int | float) else "-"


def table(path: Path) -> str:
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    out = ["| problem | step | precast | tiles | warps/stages | ms | TFLOP/s | % peak | x best | max abs err | strict margin | strict | relaxed margin | relaxed |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    summary = ["| problem | eager ms | compile ms | best strict (step) | x best | best relaxed (step) | x best |",
               "|---|---|---|---|---|---|---|"]
    gm: dict[str, list[float]] = {"strict": [], "relaxed": []}
    for r in rows:
        if "plans" not in r:
            out.append(f"| {r['problem']} | error: {r.get('error', '')[:80]} |" + " |" * 12)
            continue
        for e in r["plans"]:
            if "error" in e:
                out.append(f"| {r['problem']} | {e['precision']} | {e['precast']} | {e['tiles']} | {e['warps']}/{e['stages']} | error: {e['error'][:60]} |" + " |" * 8)
                continue
            out.append(f"| {r['problem']} | {e['precision']} | {e['precast']} | {e['tiles']} | {e['warps']}/{e['stages']} | "
                       f"{_f(e.get('ms'))} | {_f(e.get('tflops'), '.0f')} | {_f(100 * e.get('frac_peak', 0), '.0f')} | "
                       f"{_f(e.get('speedup'), '.2f')} | {_f(e.get('max_abs'), '.2e')} | {_f(e['strict']['margin'], '.3g')} | "
                       f"{'pass' if e['strict']['pass'] else 'fail'} | {_f(e['relaxed']['margin'], '.3g')} | {'pass' if e['relaxed']['pass'] else 'fail'} |")
        cells = []
        for policy in ("strict", "relaxed"):
            ok = [e for e in r["plans"] if "ms" in e and e[policy]["pass"]]
            b = min(ok, key=lambda e: e["ms"]) if ok else None
            x = b["speedup"] if b else None
            gm[policy].append(max(x or 1.0, 1.0))
            cells += [f"{_f(b['ms'])} ({b['precision']}{('', '+pre', '+regs')[b['precast']]} {b['tiles']})" if b else "none", _f(x, ".2f")]
        summary.append(f"| {r['problem']} | {_f(r['eager_ms'])} | {_f(r['compile_ms'])} | " + " | ".join(cells) + " |")
    import math

    geo = {p: math.exp(sum(map(math.log, v)) / len(v)) if v else 0.0 for p, v in gm.items()}
    head = [f"Geomean over the {len(gm['strict'])} problems of the best verified plan's speedup over the faster of eager "
            f"and torch.compile (a problem without a faster verified plan counts 1.0): strict {geo['strict']:.2f}x, "
            f"relaxed {geo['relaxed']:.2f}x.", ""]
    return "\n".join(head + summary + ["", "Every plan:", ""] + out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--problems", default=",".join(DEFAULT))
    r.add_argument("--deadline", type=float, default=540)
    o = sub.add_parser("one")
    o.add_argument("path", type=Path)
    o.add_argument("--rounds", type=int, default=2)
    for sp in (r, o):
        sp.add_argument("--steps", default="", help="only these precision steps' plans (comma-separated)")
        sp.add_argument("--no-compile", action="store_true", help="skip torch.compile (x best is over eager)")
        sp.add_argument("--scale", type=float, default=1.0, help="floating inputs times this (64: the verifier's scaled case)")
    t = sub.add_parser("table")
    t.add_argument("path", type=Path)
    s = sub.add_parser("smoke")
    s.add_argument("--problems", default="016")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        extra = ((["--steps", args.steps] if args.steps else []) + (["--no-compile"] if args.no_compile else [])
                 + ["--scale", str(args.scale)])
        run(args.problems.split(","), args.out, args.deadline, tuple(extra))
    elif args.cmd == "one":
        steps = tuple(x for x in args.steps.split(",") if x)
        print(json.dumps(run_one(args.path, "cuda", "full", args.rounds, steps, not args.no_compile, args.scale)),
              flush=True)
    elif args.cmd == "table":
        print(table(args.path), end="")
    else:
        os.environ["TRITON_INTERPRET"] = "1"
        rows = [run_one(p, "cpu", "ci", 1) for p in problem_paths(ROOT / "problems" / "level2", args.problems.split(","))]
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write("".join(json.dumps(x) + "\n" for x in rows))
        print(table(Path(f.name)), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
