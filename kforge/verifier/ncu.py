"""Nsight Compute metrics for a GPU candidate, when ``ncu`` is on the PATH.

The candidate runs in the same sandboxed worker as for profiling (a few repetitions, no
baselines), under ``ncu --clock-control none``; the CSV is written into the run's private
scratch folder and parsed by the parent. Kernels launched by PyTorch itself (input
generation, copies) are left out, so the numbers describe the candidate's own kernels. On a
host without ``ncu`` or without a GPU the result says so instead of failing.
"""

from __future__ import annotations

import csv
import io
import json
import secrets
import shutil
import tempfile
from pathlib import Path

from kforge.verifier.device_lease import held
from kforge.verifier.runner import import_paths, worker_env
from kforge.verifier.sandbox import Limits, python_argv, run_sandboxed

METRICS = {
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "ncu_dram_pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "ncu_sm_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "ncu_occupancy_pct",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "ncu_tensor_pct",
}
TORCH_KERNELS = ("at::", "cub::", "c10::", "pytorch", "cublas", "cutlass", "sm90_xmma", "gemv")


def parse_ncu_csv(text: str) -> dict[str, float | str]:
    """Mean of each metric over the candidate's own kernels (PyTorch's left out)."""
    start = text.find('"ID"')
    if start < 0:
        return {"ncu": "no metrics in ncu output"}
    values: dict[str, list[float]] = {}
    kernels: set[str] = set()
    for row in csv.DictReader(io.StringIO(text[start:])):
        name = row.get("Kernel Name", "")
        if any(t in name for t in TORCH_KERNELS):
            continue
        key = METRICS.get(row.get("Metric Name", ""))
        try:
            value = float(str(row.get("Metric Value", "")).replace(",", ""))
        except ValueError:
            continue
        if key:
            kernels.add(name.split("(")[0][:80])
            values.setdefault(key, []).append(value)
    if not values:
        return {"ncu": "no candidate kernel was profiled"}
    out: dict[str, float | str] = {k: round(sum(v) / len(v), 2) for k, v in values.items()}
    out["ncu"] = "ok"
    out["ncu_kernels"] = ", ".join(sorted(kernels))[:300]
    return out


def ncu_metrics(source: str, problem_path: Path, *, platform: str, preset: str, sizes: dict[str, int] | None,
                build_dir: Path, timeout_s: float = 240) -> dict[str, float | str]:
    from kforge.platforms import get_platform

    ncu = shutil.which("ncu")
    plat = get_platform(platform)
    if ncu is None or plat.device() != "cuda" or not plat.describe().runnable:
        return {"ncu": "unavailable (needs ncu and a CUDA device)"}
    problem_path = Path(problem_path).resolve()
    scratch = Path(tempfile.mkdtemp(prefix="kforge-ncu-"))
    try:
        (scratch / "candidate.py").write_text(source)
        job = {"mode": "profile", "problem_path": str(problem_path), "preset": preset, "sizes": sizes,
               "device": "cuda", "model_seed": 42, "baselines": False, "warmup": 1, "reps": 3, "threads": None,
               "candidate_path": str(scratch / "candidate.py"), "nonce": secrets.token_hex(16)}
        log = scratch / "ncu.csv"
        argv = [ncu, "--target-processes", "all", "--clock-control", "none", "--csv", "--log-file", str(log),
                "--launch-count", "40", "--metrics", ",".join(METRICS), *python_argv("kforge.verifier.worker_main")]
        visible = [build_dir, problem_path.parent, *(Path(p) for p in import_paths()[1:] if Path(p).is_dir())]
        with held(True, exclusive=True):  # ncu replays kernels: nothing else on the device meanwhile
            result = run_sandboxed(argv, env=worker_env(plat.worker_env(build_dir), scratch, None), scratch=scratch,
                                   stdin=json.dumps(job).encode(), limits=Limits(timeout_s=timeout_s, memory_mb=None),
                                   ro_paths=visible, gpu=True)
        if not log.is_file():
            return {"ncu": f"ncu wrote no metrics (exit {getattr(result, 'returncode', '?')})"}
        return parse_ncu_csv(log.read_text(errors="replace"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
