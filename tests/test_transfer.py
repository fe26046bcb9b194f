"""Cross-platform transfer: round 0 on platform B is given platform A's best verified kernel,
and the candidate's provenance records which selection it came from."""

from __future__ import annotations

from pathlib import Path

from kforge.config import parse_config
from kforge.stages.context import StageContext, record_digest, write_record
from kforge.stages.example import run_example
from kforge.stages.generate import run_generate
from kforge.stages.problem import run_problem
from kforge.stages.records import SelectionRecord
from kforge.store import Store

REPO = Path(__file__).resolve().parents[1]
PROBLEM = "softmax_rows"


def context(tmp_path: Path) -> StageContext:
    config = parse_config({
        "store": str(tmp_path / "artifacts"),
        "agents": {"expert": {"kind": "expert"}},
        "suites": {"s": {"path": str(REPO / "problems" / "starter"), "include": [PROBLEM]}},
        "run": {"agents": ["expert"], "platforms": ["cpu", "triton"], "suites": ["s"]},
        "transfer": {"enabled": True, "source_platform": "cpu"},
    })
    return StageContext(config=config, store=Store(config.store))


def generate_with(ctx: StageContext, tmp_path: Path, best: Path):  # type: ignore[no-untyped-def]
    problem_record = tmp_path / "problem.json"
    run_problem(ctx, "s", PROBLEM, problem_record)
    example = tmp_path / "example.json"
    run_example(ctx, "triton", example)
    return run_generate(ctx, agent="expert", platform="triton", suite="s", problem=PROBLEM,
                        problem_record=problem_record, example_record=example,
                        out_dir=tmp_path / "r0", transfer_record=best)


def test_round_zero_prompt_carries_the_other_platforms_kernel(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    cpu_kernel = (REPO / "refs" / "cpu" / "solution.py").read_text()
    best = tmp_path / "best.json"
    write_record(best, SelectionRecord(
        agent="expert", platform="cpu", suite="s", problem=PROBLEM, policy="strict", status="no_gain",
        verified=True, rounds_used=1, best_round=0, best_source=ctx.store.put_text(cpu_kernel),
    ), ctx.store)
    record = generate_with(ctx, tmp_path, best)
    assert record.used["transfer"] == record_digest(best)
    transcript = ctx.store.get_json(record.transcript)
    user = transcript["messages"][-1]["content"]
    assert "A verified kernel for the same problem on `cpu`" in user
    assert "CPP_SOURCE" in user  # the cpu kernel itself, not just a mention


def test_a_failed_source_selection_transfers_nothing(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    best = tmp_path / "best.json"
    write_record(best, SelectionRecord(agent="expert", platform="cpu", suite="s", problem=PROBLEM,
                                       policy="strict", status="failed", rounds_used=1), ctx.store)
    record = generate_with(ctx, tmp_path, best)
    assert "transfer" not in record.used
