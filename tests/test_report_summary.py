"""Suite metrics: every problem counts (not shipped = 1.0), fast_p per KernelBench, cost per
shipped kernel; in summary.parquet and in `kforge report`."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kforge.summary import fast_p, geomean, summarize
from tests.report_fixtures import build_run


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_run(tmp_path_factory.mktemp("summary")).root


def test_summary_table_counts_the_whole_suite(root: Path) -> None:
    rows = {r["platform"]: r for r in pq.read_table(root / "summary.parquet").to_pylist()}
    cpu = rows["cpu"]
    assert (cpu["problems"], cpu["verified"], cpu["shipped"], cpu["no_gain"]) == (8, 5, 2, 3)
    # shipped 2.0x and 3.0x; six other problems answer 1.0
    assert cpu["geomean_all"] == pytest.approx(6 ** (1 / 8), abs=1e-4)
    assert cpu["geomean_shipped_only"] == pytest.approx(math.sqrt(6), abs=1e-4)
    # correct: 2.0, 3.0, 1.01, 0.63, 1.2 (interpreted, flagged, failed, nondeterministic: not)
    assert (cpu["fast_0"], cpu["fast_1"], cpu["fast_1_5"], cpu["fast_2"], cpu["fast_5"]) == (
        5 / 8, 4 / 8, 2 / 8, 1 / 8, 0.0)
    assert cpu["cost_usd"] == pytest.approx(0.16) and cpu["cost_per_shipped_usd"] == pytest.approx(0.08)
    assert cpu["total_tokens"] == 8 * 2 * 150 and cpu["wall_s"] > 0
    triton = rows["triton"]
    assert triton["fast_0"] == 1.0 and triton["fast_1"] == 0.0 and triton["geomean_shipped_only"] is None
    assert triton["cost_per_shipped_usd"] is None


def test_failures_pull_the_suite_geomean_down() -> None:
    """The old defect: 8 verified of 37 at 1.55x read as 1.55x."""
    rows = [{"agent": "a", "platform": "p", "suite": "s", "policy": "strict", "verified": True, "shipped": True,
             "shipped_speedup": 1.55, "speedup_vs_best": 1.55}] * 8
    rows += [{"agent": "a", "platform": "p", "suite": "s", "policy": "strict", "status": "failed",
              "shipped_speedup": 1.0}] * 29
    (s,) = summarize(rows)
    assert s["geomean_all"] == pytest.approx(1.55 ** (8 / 37), abs=1e-4)
    assert s["geomean_shipped_only"] == pytest.approx(1.55)
    assert s["fast_0"] == pytest.approx(8 / 37, abs=1e-4)
    assert geomean([]) is None and fast_p([], 1.0) == 0.0


def test_kforge_report_prints_the_suite_summary(root: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "kforge.cli", "report", str(root / "report.parquet")],
                          capture_output=True, text=True, check=True)
    out = proc.stdout
    assert "8 problems, 5 verified, 2 shipped" in out
    assert "over ALL problems (not shipped = 1.0): 1.25x; over shipped only: 2.45x" in out
    assert "fast_0=0.62  fast_1=0.50  fast_1.5=0.25  fast_2=0.12  fast_5=0.00" in out
    assert "per shipped kernel $0.0800" in out
    assert "no_gain" in out and "answer x" in out


def test_report_on_a_run_in_progress_shows_the_cells_so_far(tmp_path: Path) -> None:
    from tests.report_fixtures import CELLS, config, write_cell

    ctx = config(tmp_path)
    for cell in CELLS[:2]:
        write_cell(ctx, cell)
    (ctx.root / "runs" / "expert" / "cpu" / "starter" / "gemm_bias_relu" / "r0").mkdir(parents=True)
    proc = subprocess.run([sys.executable, "-m", "kforge.cli", "report", str(ctx.root / "report.parquet")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "run in progress: 2 of 3 started cells selected so far" in proc.stderr
    assert "2 problems, 2 verified, 1 shipped" in proc.stdout
    progress = (ctx.root / "progress.log").read_text().splitlines()
    assert len(progress) == 2 and "select expert/cpu/starter/softmax_rows: shipped 2.00x" in progress[0]
