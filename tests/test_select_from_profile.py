"""A run without optimization rounds times each verified round with both baselines in its
profile job; `select` then takes that profile instead of timing the winner again, and only
then (a pick among several timed rounds is re-timed, as is every run with optimization rounds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kforge.stages.context import StageContext, read_record
from kforge.stages.profile import with_baselines
from kforge.stages.records import SelectionRecord
from tests.report_fixtures import Cell, config, write_cell


def _select(ctx: StageContext, cell: Cell) -> SelectionRecord:
    return read_record(write_cell(ctx, cell), SelectionRecord)


def test_the_round_profile_is_the_selection_timing_without_optimization_rounds(tmp_path: Path) -> None:
    ctx = config(tmp_path, optimization=0)
    assert with_baselines(ctx.config) and not with_baselines(config(tmp_path / 'o', 1).config)
    # nothing is cached for select: were it to time the winner, it would run the real CPU timing
    # (and the synthetic kernel's numbers below would not come out)
    record = _select(ctx, Cell("softmax_rows", rounds=1, round_baselines=True, cached_select=False))
    assert record.status == "shipped"
    assert record.candidate_ms == pytest.approx(1.5) and record.eager_ms == pytest.approx(2.0)
    assert record.speedup_vs_best == pytest.approx(2.0 / 1.5, rel=1e-3)
    assert "profile job" in record.detail
    assert record.selection_profile is not None


@pytest.mark.parametrize("optimization, rounds", [(1, 1), (0, 2)])
def test_select_times_the_winner_itself_otherwise(tmp_path: Path, optimization: int, rounds: int) -> None:
    """With optimization rounds (profiles time the candidate alone), or with two verified
    sources to choose between, select's own same-process timing (here pre-cached) is used."""
    ctx = config(tmp_path, optimization=optimization)
    record = _select(ctx, Cell("softmax_rows", rounds=rounds, round_baselines=optimization == 0))
    assert "profile job" not in record.detail
    assert record.candidate_ms == pytest.approx(1.0)  # the cached selection timing, not a round's
