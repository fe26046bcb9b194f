"""Where select's timed call of a candidate differs from the same call timed in-process, on a GPU.

    python benchmarks/select_gap_gpu.py --problems 001 [--policy relaxed] [--reps 30] > OUT/gap.jsonl

On the H100 (2026-12-06) select timed 001's relaxed candidate at 0.370 ms a call while its
kernels took 0.250 ms and ``call_overhead_gpu.py`` timed the same candidate at 0.281 ms. Per
problem, the expert's default candidate is timed four ways on this machine, in this order:

    protocol      in this process: sync, L2 flush, sync, CUDA events around model(x)
                  (``call_overhead_gpu._protocol``)
    checked       in this process: ``timing.time_alternating`` with the checked-timing input plan
                  and observer (two buffer sets rescaled in place, sampled outputs compared)
    sandbox       ``profiling.profile_candidate`` with the worker's own clock: the sandboxed
                  worker process, no parent handshake
    select        ``profiling.profile_candidate`` as the pipeline's select runs it (the parent's
                  handshake clock bounding the events)

One JSON line per problem: median ms of each, and the sandboxed runs' ``extra`` (clock, gaps).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def one(path: Path, policy: str, reps: int) -> dict[str, Any]:
    import torch
    from call_overhead_gpu import _protocol
    from gemm_epilogue_gpu import _load

    from kforge.agents.expert.planner import plan_problem
    from kforge.agents.expert.triton_render import default_knobs, render_triton
    from kforge.verifier.candidate_run import prepare_reference
    from kforge.verifier.profiling import MODEL_SEED, profile_candidate
    from kforge.verifier.timing import host_clock, time_alternating
    from kforge.verifier.worker import build_models

    source = path.read_text()
    program = plan_problem(source)
    cand = render_triton(program, default_knobs(program, policy), policy, source)
    row: dict[str, Any] = {"problem": path.stem, "policy": policy, "gpu": torch.cuda.get_device_name(), "ms": {}}
    job = {"device": "cuda", "model_seed": MODEL_SEED, "problem_path": str(path), "preset": "full", "sizes": None,
           "reps": reps, "tol": 1e-2}
    with torch.no_grad():
        problem, checked = prepare_reference(job)
        module = _load(cand, f"gap_{path.stem}")
        _, new = build_models(problem, module.ModelNew, MODEL_SEED, "cuda")
        values = checked.plan.load(0, 0)
        for _ in range(3):
            new(*values)
        row["ms"]["protocol"] = _protocol(lambda: new(*values), reps, "cuda")
        samples = time_alternating({"candidate": new}, device="cuda", warmup=5, reps=reps, plan=checked.plan,
                                   clock=host_clock, observe=checked.observe)
        row["ms"]["checked"] = samples["candidate"].timing().median_ms
        row["checked_host_ms"] = sorted(samples["candidate"].host_ms)[len(samples["candidate"].host_ms) // 2]
    for label, parent in (("sandbox", False), ("select", True)):
        prof = profile_candidate(cand, path, platform="triton", preset="full", warmup=5, reps=reps,
                                 policy=policy, parent_clock=parent)  # type: ignore[arg-type]
        row["ms"][label] = prof.candidate.median_ms if prof.candidate else None
        row[f"{label}_extra"] = {k: v for k, v in prof.extra.items()
                                 if k in ("clock", "clock_gap_us", "clock_hop_us", "sandbox", "phase_s", "input_sets")}
        row[f"{label}_reason"] = prof.reason
    return row


def main(argv: list[str] | None = None) -> int:
    from gemm_epilogue_gpu import problem_paths

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", default="001")
    ap.add_argument("--policy", default="relaxed")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args(argv)
    for path in problem_paths(ROOT / "problems" / "level2", args.problems.split(",")):
        print(json.dumps(one(path, args.policy, args.reps)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
