"""The ship rule in `select`: only a verified kernel faster than the faster of eager and
torch.compile beyond the noise band ships; every other row says why and answers 1.0."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kforge.stages.select import ship_status, ship_threshold
from tests.report_fixtures import build_run

EXPECTED = {
    ("cpu", "softmax_rows"): "shipped",
    ("cpu", "gemm_gelu_scale"): "shipped",
    ("cpu", "logsoftmax_rows"): "no_gain",  # 1.01x: inside the 2% floor
    ("cpu", "gemm_bias_relu"): "no_gain",  # 0.63x: slower than eager
    ("cpu", "reduce_max_rows"): "no_gain",  # 1.2x, but CV 15% on both sides: threshold 1.42x
    ("cpu", "layernorm_rows"): "failed",
    ("cpu", "reduce_mean_rows"): "roofline_flagged",
    ("cpu", "elementwise_swish_bias"): "nondeterministic_reference",  # 2x, flagged reference
    ("triton", "softmax_rows"): "verified_interpreted",
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    root = tmp_path_factory.mktemp("ship_rule")
    ctx = build_run(root)
    return ctx.root, pq.read_table(ctx.root / "report.parquet").to_pylist()


def test_every_row_says_why_it_shipped_or_not(run: tuple[Path, list[dict]]) -> None:
    _, rows = run
    assert {(r["platform"], r["problem"]): r["status"] for r in rows} == EXPECTED


def test_no_row_at_or_below_its_faster_baseline_ships(run: tuple[Path, list[dict]]) -> None:
    _, rows = run
    for r in rows:
        if r["shipped"]:
            assert r["status"] == "shipped" and r["verified"]
            assert r["speedup_vs_best"] > r["ship_threshold"] > 1.0
            assert r["shipped_speedup"] == r["speedup_vs_best"]
            assert r["candidate_ms"] < min(r["eager_ms"], r["compile_ms"])
        else:
            assert r["shipped_speedup"] == 1.0, r  # the PyTorch reference is the answer


def test_no_gain_keeps_the_ratio_and_the_candidate(run: tuple[Path, list[dict]]) -> None:
    root, rows = run
    slow = next(r for r in rows if r["problem"] == "gemm_bias_relu")
    assert slow["speedup_vs_best"] == pytest.approx(0.63, abs=1e-3)
    assert "0.63x" in slow["detail"] and "threshold" in slow["detail"]
    blob = root / "cas" / "sha256" / slow["best_source"][:2] / slow["best_source"][2:]
    assert blob.is_file()  # the candidate stays in the store
    assert (Path(slow["kernel_path"])).is_file()


def test_nondeterministic_reference_is_never_a_pass(run: tuple[Path, list[dict]]) -> None:
    root, rows = run
    row = next(r for r in rows if r["problem"] == "elementwise_swish_bias")
    assert not row["verified"] and not row["shipped"] and row["shipped_speedup"] == 1.0
    assert row["candidate_ms"] is None  # never timed against the baselines
    assert row["best_source"]  # but kept on record
    assert not (root / "ledger.jsonl").exists()  # no timing run anywhere: all came from the cache


def test_interpreted_and_compiled_only_rows_do_not_ship(run: tuple[Path, list[dict]]) -> None:
    _, rows = run
    row = next(r for r in rows if r["platform"] == "triton")
    assert row["verified"] and not row["shipped"] and row["shipped_speedup"] == 1.0


def test_threshold_is_the_noise_band() -> None:
    assert ship_threshold(0.0, 0.0) == 1.02  # the 2% floor
    assert ship_threshold(0.03, 0.04) == pytest.approx(1.10)  # 1 + 2 * hypot(0.03, 0.04)
    assert ship_status(1.021, 1.02, False)[0] == "shipped"
    assert ship_status(1.02, 1.02, False)[0] == "no_gain"
    assert ship_status(5.0, 1.02, True)[0] == "roofline_flagged"
    assert ship_status(None, None, False)[0] == "failed"
