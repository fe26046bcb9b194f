"""The ship rule in `select`: only a verified kernel whose paired ratio over the faster of eager
and torch.compile has a 95% lower bound above 1.02 ships; every other row says why and answers 1.0."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kforge.schema import RatioBound
from kforge.stages.select import SHIP_FLOOR, ship_status
from tests.report_fixtures import Cell, build_run

EXPECTED = {
    ("cpu", "softmax_rows"): "shipped",
    ("cpu", "gemm_gelu_scale"): "shipped",
    ("cpu", "logsoftmax_rows"): "no_gain",  # 1.01x: inside the 2% floor
    ("cpu", "gemm_bias_relu"): "no_gain",  # 0.63x: slower than eager
    ("cpu", "reduce_max_rows"): "no_gain",  # 1.2x, but CV 30%: the paired 95% lower bound is 0.91x
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
            assert r["speedup_high"] >= r["speedup_vs_best"] >= r["speedup_low"] > r["ship_floor"] == SHIP_FLOOR
            assert r["shipped_speedup"] == r["speedup_vs_best"]
            assert r["candidate_ms"] < min(r["eager_ms"], r["compile_ms"])
        else:
            assert r["shipped_speedup"] == 1.0, r  # the PyTorch reference is the answer


def test_no_gain_keeps_the_ratio_and_the_candidate(run: tuple[Path, list[dict]]) -> None:
    root, rows = run
    slow = next(r for r in rows if r["problem"] == "gemm_bias_relu")
    assert slow["speedup_vs_best"] == pytest.approx(0.63, abs=1e-3)
    assert "0.63x" in slow["detail"] and "lower bound" in slow["detail"]
    assert slow["speedup_low"] == pytest.approx(0.63 * (1 - 0.8 * 0.01), abs=1e-4)  # the 6th of 20 pairs
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


def test_noisy_gain_is_judged_on_the_paired_bound(run: tuple[Path, list[dict]]) -> None:
    _, rows = run
    noisy = next(r for r in rows if r["problem"] == "reduce_max_rows")
    assert noisy["speedup_vs_best"] == pytest.approx(1.2, abs=1e-3)  # the paired median
    assert noisy["speedup_low"] == pytest.approx(1.2 * (1 - 0.8 * 0.3), abs=1e-3)
    assert noisy["speedup_low"] < noisy["ship_floor"]
    assert "does not clear 1.02x" in noisy["detail"]


def _bound(low: float, median: float = 1.5) -> RatioBound:
    return RatioBound(baseline="eager", n=20, median=median, low=low, high=median + 0.5, confidence=0.95)


def test_the_rule_is_the_lower_bound_over_the_floor() -> None:
    assert SHIP_FLOOR == 1.02
    assert ship_status(_bound(1.0201), False)[0] == "shipped"
    assert ship_status(_bound(1.02), False)[0] == "no_gain"
    assert ship_status(_bound(0.9, median=3.0), False)[0] == "no_gain"  # a big median, an unsure gain
    assert ship_status(_bound(5.0), True)[0] == "roofline_flagged"
    assert ship_status(None, False)[0] == "failed"  # no baseline timed at all
    status, detail = ship_status(None, False, no_bound="only 3 paired reps")
    assert status == "no_gain" and "only 3 paired reps" in detail
    assert "lower bound 1.02x" in ship_status(_bound(1.0201), False)[1]


def test_a_profile_without_samples_has_no_bound_and_does_not_ship(tmp_path: Path) -> None:
    """A selection timing written before per-rep samples were recorded: no bound, no_gain, and
    the detail says why; the ratio of the medians is still on record."""
    ctx = build_run(tmp_path, cells=[Cell("softmax_rows", samples=False)])
    (row,) = pq.read_table(ctx.root / "report.parquet").to_pylist()
    assert row["status"] == "no_gain" and not row["shipped"] and row["shipped_speedup"] == 1.0
    assert row["speedup_low"] is None and row["speedup_high"] is None
    assert row["speedup_vs_best"] == pytest.approx(2.0)
    assert "no per-rep samples" in row["detail"]
