"""Run the real Snakemake pipeline in a scratch folder (shared by the end-to-end tests)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]


def write_config(workdir: Path, *, eager_only: bool = False, **overrides: Any) -> Path:
    """kforge.yaml for a CI-sized run. ``eager_only``: select times eager alone
    (``profile.compile_baseline: false``), for tests of something other than the baselines:
    inductor's compile is ~20 s of every select on 2 cores."""
    config: dict[str, Any] = {
        "store": "artifacts",
        "policy": "strict",
        "agents": {"expert": {"kind": "expert"}},
        "suites": {"tiny": {"path": str(REPO / "problems" / "starter"), "preset": "ci",
                            "include": ["elementwise_gelu_scale", "softmax_rows", "gemm_bias_relu"]}},
        "run": {"agents": ["expert"], "platforms": ["cpu"], "suites": ["tiny"]},
        "rounds": {"functional": 1, "optimization": 2},
        "verify": {"trials": 2, "timeout_s": 120},
        "profile": {"warmup": 2, "reps": 8},
    }
    for key, value in overrides.items():
        config[key] = value
    if eager_only:
        config["profile"] = {**config["profile"], "compile_baseline": False}
    path = workdir / "kforge.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def snakemake(workdir: Path, *extra: str, env: dict[str, str] | None = None, timeout: float = 900) -> tuple[str, float]:
    """Run the README's main command (with --configfile) in ``workdir``; return output, seconds."""
    cmd = [
        sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
        "--directory", str(workdir), "--configfile", str(workdir / "kforge.yaml"),
        "--cores", "4", "artifacts/report.parquet", *extra,
    ]
    start = time.perf_counter()
    proc = subprocess.run(
        cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    took = time.perf_counter() - start
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        logs = "\n".join(f"--- {p}\n{p.read_text()[-3000:]}" for p in sorted((workdir / "artifacts").rglob("*.log"))[-6:])
        raise AssertionError(f"snakemake failed ({proc.returncode}):\n{out[-6000:]}\n{logs}")
    return out, took


def ledger(workdir: Path) -> list[dict[str, Any]]:
    path = workdir / "artifacts" / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def work_counts(entries: list[dict[str, Any]]) -> Counter[str]:
    """Real work by kind: agent calls per role, builds, verifier and profiler runs."""
    counts: Counter[str] = Counter()
    for e in entries:
        counts[f"agent_call:{e['role']}" if e["stage"] == "agent_call" else e["stage"]] += 1
    return counts


def copy_prompts(workdir: Path) -> Path:
    target = workdir / "prompts"
    shutil.copytree(REPO / "kforge" / "prompts", target)
    return target
