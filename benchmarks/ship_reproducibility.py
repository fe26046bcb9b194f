"""Do ship decisions reproduce? The README's main job (kforge.yaml: the starter suite on the CPU,
the expert agent) run twice in fresh stores, and once more through Snakemake's Slurm executor on
a one-node localhost cluster (the Slurm test's path), decisions side by side with the bounds
they were made on.

    python benchmarks/ship_reproducibility.py [--runs 2] [--slurm] [--out FILE]

A kernel ships when the one-sided 95% lower bound of the paired median ratio (faster baseline /
candidate, rep by rep) clears 1.02 (kforge/verifier/paired.py). Runs must agree on every kernel
whose ratio (the median over the runs) lies outside 0.9-1.1; inside that band a disagreement is
a close call and is listed as such. Prints a table; ``--out`` also writes it with the host, the
date and the commit.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
BAND = (0.9, 1.1)
KEY = ("agent", "platform", "suite", "problem")


def _config(workdir: Path) -> Path:
    """kforge.yaml as the README's main job reads it, suite paths made absolute."""
    config = yaml.safe_load((ROOT / "kforge.yaml").read_text())
    for suite in config["suites"].values():
        suite["path"] = str(ROOT / suite["path"])
    path = workdir / "kforge.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _snakemake(workdir: Path, *extra: str, env: dict[str, str] | None = None) -> float:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(workdir / "kforge.yaml"), *extra, "artifacts/report.parquet"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env={**os.environ, **(env or {})},
                          timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"snakemake failed in {workdir}:\n{(proc.stdout + proc.stderr)[-4000:]}")
    return time.perf_counter() - start


def _rows(workdir: Path) -> dict[tuple[str, ...], dict[str, Any]]:
    import duckdb

    rel = duckdb.sql(f"select * from '{workdir / 'artifacts' / 'report.parquet'}'")
    cols = [c[0] for c in rel.description]
    return {tuple(r[k] for k in KEY): r for r in (dict(zip(cols, t, strict=True)) for t in rel.fetchall())}


def _slurm_run(workdir: Path) -> float:
    path = ROOT / "scripts" / "cluster" / "localslurm.py"
    spec = importlib.util.spec_from_file_location("localslurm", path)
    assert spec is not None and spec.loader is not None
    localslurm = importlib.util.module_from_spec(spec)
    sys.modules["localslurm"] = localslurm
    spec.loader.exec_module(localslurm)
    why = localslurm.missing_requirements()
    if why:
        raise SystemExit(f"no Slurm here: {why} (bash scripts/cluster/install.sh as root)")
    state = Path(tempfile.mkdtemp(prefix="kforge-slurm-", dir="/var/tmp"))
    cluster = localslurm.LocalSlurm(state)
    cluster.start()
    try:
        return _snakemake(workdir, "--profile", str(ROOT / "profiles" / "slurm"), "--cores", str(os.cpu_count() or 1),
                          "--slurm-init-seconds-before-status-checks", "1", "--seconds-between-status-checks", "2",
                          env=cluster.env())
    finally:
        cluster.stop()
        shutil.rmtree(state, ignore_errors=True)


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    ratio = row.get("speedup_vs_best")
    low, high = row.get("speedup_low"), row.get("speedup_high")
    bounds = f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else ""
    return f"{row['status']} {ratio:.2f}x{bounds}" if ratio else row["status"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="local runs (fresh stores)")
    parser.add_argument("--slurm", action="store_true", help="one more run through the Slurm executor")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run folders here")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="kforge-repro-")) if args.keep is None else args.keep
    names = [f"local {i + 1}" for i in range(args.runs)] + (["slurm"] if args.slurm else [])
    runs: dict[str, dict[tuple[str, ...], dict[str, Any]]] = {}
    seconds: dict[str, float] = {}
    for name in names:
        workdir = base / name.replace(" ", "_")
        workdir.mkdir(parents=True, exist_ok=True)
        _config(workdir)
        seconds[name] = _slurm_run(workdir) if name == "slurm" else _snakemake(workdir, "--cores", "4")
        runs[name] = _rows(workdir)
        print(f"{name}: {seconds[name]:.0f} s", file=sys.stderr, flush=True)
    keys = sorted(set().union(*(r.keys() for r in runs.values())))
    lines = ["| problem | " + " | ".join(names) + " | ratio (median over runs) | decisions |",
             "|---|" + "---|" * len(names) + "---|---|"]
    must_agree = agreed = close = 0
    for key in keys:
        rows = [runs[n].get(key) for n in names]
        ratios = [r["speedup_vs_best"] for r in rows if r is not None and r.get("speedup_vs_best")]
        ratio = statistics.median(ratios) if ratios else None
        shipped = {bool(r["shipped"]) for r in rows if r is not None}
        inside = ratio is not None and BAND[0] <= ratio <= BAND[1]
        if len(shipped) == 1:
            verdict = "agree"
        else:
            verdict = "differ (a close call: inside 0.9-1.1)" if inside else "DIFFER"
        if not inside:
            must_agree += 1
            agreed += len(shipped) == 1
        close += inside
        lines.append(f"| {key[3]} | " + " | ".join(_cell(r) for r in rows) +
                     f" | {'-' if ratio is None else f'{ratio:.2f}x'} | {verdict} |")
    summary = (f"{agreed} of {must_agree} cells outside {BAND[0]}-{BAND[1]}x agree across {len(names)} runs; "
               f"{close} cells inside the band. Wall: " + ", ".join(f"{n} {s:.0f} s" for n, s in seconds.items()))
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = "unknown"
    head = (f"host {platform.node()} ({os.cpu_count()} cores, {platform.processor() or platform.machine()}), "
            f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {commit}; kforge.yaml (starter suite, ci sizes, "
            "expert agent, strict); cells: status, paired median ratio vs the faster baseline [95% bounds]")
    text = "\n".join([head, "", *lines, "", summary])
    print(text)
    if args.out:
        args.out.write_text("# Ship decisions across runs\n\n" + text + "\n")
    return 0 if agreed == must_agree else 1


if __name__ == "__main__":
    sys.exit(main())
