"""Error margins on record (issue 12, item 3): every verification keeps, per case, its max error
over the allowed error; the worst (``max_margin``) and the plan's precision step reach the
report table, the summary and ``kforge report``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from kforge.summary import summarize
from kforge.verifier.correctness import max_margin, measure
from tests.report_fixtures import Cell, build_run

CELLS = [
    Cell("softmax_rows", margin=0.93, precision="tf32x3"),  # shipped, but by a hair
    Cell("gemm_gelu_scale", eager_ms=4.0, compile_ms=3.0, margin=0.01, precision="bf16x3"),
    Cell("layernorm_rows", ok=False, margin=2.5),  # failed: its margin is no verified row's
    Cell("reduce_max_rows"),  # an older record without margins, a plan without a precision
]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_run(tmp_path_factory.mktemp("margins"), CELLS).root


def test_margin_is_the_worst_error_over_what_the_rule_allows() -> None:
    ref = np.concatenate([[1.0, 100.0, -3.0, 0.0], np.full(96, 50.0)])
    # native: elementwise, allowed = atol + rtol |r| = 1e-4 (1 + |r|)
    c = ref.copy()
    c[1] += 0.0101 * 0.9  # 0.9 of 101e-4 on the second element
    m = measure(c, ref, 1e-4, "native")
    assert m.kind is None and m.rule == "elementwise" and m.margin == pytest.approx(0.9, rel=1e-9)
    # the same error on a stress case is held to the relative error norm only
    s = measure(c, ref, 1e-4, "heavy")
    assert s.rule == "norm" and s.margin == pytest.approx(s.rel_err_norm / 1e-4)
    # a failure keeps its margin too (> 1), and a non-finite output has none
    bad = measure(ref * (1 + 3e-4), ref, 1e-4, "native")
    assert bad.kind == "mismatch" and bad.margin is not None and bad.margin > 1
    nan = c.copy()
    nan[0] = np.nan
    nan = measure(nan, ref, 1e-4, "native")
    assert nan.kind == "nonfinite" and nan.margin is None
    assert max_margin([{"margin": 0.2}, {"margin": 0.7}]) == 0.7
    assert max_margin([{"margin": 0.2}, {"margin": None}]) is None and max_margin([]) is None


def test_report_rows_carry_margin_precision_and_verified_size(root: Path) -> None:
    rows = {r["problem"]: r for r in pq.read_table(root / "report.parquet").to_pylist()}
    assert rows["softmax_rows"]["max_margin"] == pytest.approx(0.93)
    assert rows["softmax_rows"]["precision"] == "tf32x3"
    assert rows["gemm_gelu_scale"]["precision"] == "bf16x3"
    assert rows["softmax_rows"]["verify_preset"] == "ci"
    assert rows["reduce_max_rows"]["max_margin"] is None and rows["reduce_max_rows"]["precision"] is None
    verifications = pq.read_table(root / "tables" / "verifications.parquet").to_pylist()
    softmax = [v for v in verifications if v["problem"] == "softmax_rows"]
    assert softmax and all(v["verdict_max_margin"] == pytest.approx(0.93) for v in softmax)
    assert '"margin": 0.93' in softmax[0]["verdict_margins"]  # per case, as JSON text


def test_summary_counts_rows_that_pass_by_a_hair(root: Path) -> None:
    (s,) = summarize(pq.read_table(root / "report.parquet").to_pylist())
    assert s["worst_margin"] == pytest.approx(0.93)  # the failed row's 2.5 is no verified row's
    assert s["near_tolerance"] == 1
    out = subprocess.run([sys.executable, "-m", "kforge.cli", "report", str(root / "report.parquet")],
                         capture_output=True, text=True, check=True).stdout
    assert "err margin" in out and "precision" in out and "tf32x3" in out and "0.93" in out
    assert "worst 0.93, 1 at >= 0.5 of the tolerance" in out
