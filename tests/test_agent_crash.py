"""An agent that raises costs its round, not the stage: the generate job writes a candidate
record with no source and the error on one line, and the cell goes on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kforge.config import parse_config
from kforge.stages.context import StageContext
from kforge.stages.example import run_example
from kforge.stages.generate import run_generate
from kforge.stages.problem import run_problem
from kforge.store import Store

REPO = Path(__file__).resolve().parents[1]


class _Crashing:
    def generate(self, request: object) -> object:
        raise ValueError("'a0' is not in list\nsecond line the record does not keep")


def test_an_agent_exception_is_a_failed_generation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kforge.agents.registry as registry

    monkeypatch.setattr(registry, "make_agent", lambda *a, **k: _Crashing())
    config = parse_config({
        "store": str(tmp_path / "artifacts"),
        "agents": {"expert": {"kind": "expert"}},
        "suites": {"s": {"path": str(REPO / "problems" / "starter"), "include": ["softmax_rows"]}},
        "run": {"agents": ["expert"], "platforms": ["cpu"], "suites": ["s"]},
    })
    ctx = StageContext(config=config, store=Store(config.store))
    problem_record = tmp_path / "problem.json"
    run_problem(ctx, "s", "softmax_rows", problem_record)
    example = tmp_path / "example.json"
    run_example(ctx, "cpu", example)
    record = run_generate(ctx, agent="expert", platform="cpu", suite="s", problem="softmax_rows",
                          problem_record=problem_record, example_record=example, out_dir=tmp_path / "r0")
    assert record.source is None
    assert record.extraction == "agent_error: ValueError: 'a0' is not in list"
    transcript = ctx.store.get_json(record.transcript)
    assert transcript["error"] == "ValueError: 'a0' is not in list"
    assert json.loads((tmp_path / "r0" / "candidate.json").read_text())["extraction"].startswith("agent_error")
