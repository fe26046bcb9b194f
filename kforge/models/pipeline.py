"""The existing pipeline over a model's regions: one suite of region problems, one Snakemake run.

Each distinct region (by digest) is one problem file of the suite, so a stack of identical
layers is one cell: generate, compile, verify, profile, analyze, refine and select with the
ship rule, as for any problem. What comes back per region is the selection row: shipped or not,
why, the speedup and its bound, and the shipped kernel's source.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]


class PipelineError(RuntimeError):
    pass


@dataclass
class RegionResult:
    problem: str  # the region problem's file stem
    status: str
    detail: str
    shipped: bool
    speedup: float | None
    low: float | None
    candidate_ms: float | None
    baseline_ms: float | None
    source: str | None  # the best verified round's candidate module (shipped or not), else None


def write_config(workdir: Path, suite: Path, *, platform: str, policy: str, rounds: dict[str, int],
                 profile: dict[str, Any], verify: dict[str, Any] | None = None) -> Path:
    config = {
        "store": "artifacts", "policy": policy,
        "agents": {"expert": {"kind": "expert"}},
        "suites": {"regions": {"path": str(suite.resolve()), "preset": "full"}},
        "run": {"agents": ["expert"], "platforms": [platform], "suites": ["regions"]},
        "rounds": rounds, "profile": profile, "verify": verify or {"trials": 3, "timeout_s": 300},
    }
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "kforge.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run_pipeline(workdir: Path, *, cores: int, timeout_s: float = 6 * 3600) -> None:
    workdir = workdir.resolve()  # snakemake runs inside it: its own paths must not be relative to ours
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(workdir / "kforge.yaml"), "--cores", str(cores), "--keep-going",
           "artifacts/report.parquet"]
    # the Snakefile imports this kforge, installed or not, from whatever folder the pipeline runs in
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout_s, env=env)
    if proc.returncode != 0 and not (workdir / "artifacts" / "report.parquet").is_file():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-12:]
        raise PipelineError("the regions' pipeline failed:\n" + "\n".join(tail))


def region_results(workdir: Path) -> dict[str, RegionResult]:
    """The report's row of every region problem, the shipped kernels' sources from the store."""
    import pyarrow.parquet as pq  # not duckdb: a GPU host may have only what the pipeline needs

    from kforge.store import Store

    report = workdir / "artifacts" / "report.parquet"
    store = Store(workdir / "artifacts")
    out = {}
    for row in pq.read_table(report).to_pylist():
        source = None
        if row.get("verified") and row.get("best_source"):
            source = store.get_bytes(row["best_source"]).decode()
        baseline = min((v for v in (row.get("eager_ms"), row.get("compile_ms")) if v), default=None)
        out[row["problem"]] = RegionResult(row["problem"], row["status"], str(row.get("detail") or ""),
                                           bool(row.get("shipped")), row.get("speedup_vs_best"), row.get("speedup_low"),
                                           row.get("candidate_ms"), baseline, source)
    return out
