"""Timing-only rejections reach the generation agent like functional ones (issue 15): a
verified round whose checked timing failed (``stale_output``, ``timing_inconsistent``) is
repaired with the profiler's reason code as feedback, and every reason code the verifier can
give is explained in the contract agents read."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kforge.agents.prompting import PROMPTS_DIR
from kforge.config import parse_config
from kforge.schema import ProblemMeta, Profile, Transcript, Verdict
from kforge.stages.agent_calls import round_outcome
from kforge.stages.context import StageContext, write_record
from kforge.stages.example import run_example
from kforge.stages.records import (
    AnalysisRecord,
    CandidateRecord,
    CompileRecord,
    ProfileRecord,
    VerifyRecord,
)
from kforge.stages.refine import run_refine
from kforge.store import Store
from kforge.verifier.reasons import Reason

REPO = Path(__file__).resolve().parents[1]
STARTER = REPO / "problems" / "starter"
PROBLEM = "reduce_max_rows"


def _context(root: Path, functional: int = 1) -> StageContext:
    cfg = parse_config({
        "store": str(root / "artifacts"), "policy": "strict", "agents": {"expert": {"kind": "expert"}},
        "suites": {"starter": {"path": str(STARTER), "preset": "ci"}},
        "run": {"agents": ["expert"], "platforms": ["cpu"], "suites": ["starter"]},
        "rounds": {"functional": functional, "optimization": 1},
    })
    return StageContext(config=cfg, store=Store(cfg.store))


def _round0(ctx: StageContext, profile: Profile) -> tuple[Path, Path, Path]:
    store, root = ctx.store, ctx.root
    problem_record = root / "problems" / "starter" / f"{PROBLEM}.json"
    write_record(problem_record, ProblemMeta(name=PROBLEM, suite="starter", path=str(STARTER / f"{PROBLEM}.py"),
                                             source_digest="0" * 64, preset="ci"), store)
    example_record = root / "examples" / "cpu.json"
    run_example(ctx, "cpu", example_record)
    r0 = root / "runs" / "expert" / "cpu" / "starter" / PROBLEM / "r0"
    r0.mkdir(parents=True)
    kernel = "import torch\nclass ModelNew(torch.nn.Module):\n    pass\n"
    (r0 / "kernel.py").write_text(kernel)
    src = store.put_text(kernel)
    transcript = Transcript(agent="expert", model="kforge/expert-v1", role="generate", messages=[], response=kernel)
    write_record(r0 / "candidate.json", CandidateRecord(
        agent="expert", model="kforge/expert-v1", platform="cpu", suite="starter", problem=PROBLEM, round=0,
        mode="initial", source=src, extraction="ok", plan=store.put_json({}),
        transcript=store.put_json(transcript), parent=None), store)
    write_record(r0 / "compile.json", CompileRecord(platform="cpu", source=src, ok=True, reason="ok", log=None,
                                                    seconds=1.0), store)
    verdict = Verdict(ok=True, reason="ok", policy="strict", atol=1e-4, rtol=1e-4, max_margin=0.01)
    write_record(r0 / "verify.json", VerifyRecord(platform="cpu", problem_source="0" * 64, source=src,
                                                  verdict=verdict), store)
    write_record(r0 / "profile.json", ProfileRecord(platform="cpu", problem_source="0" * 64, source=src,
                                                    profile=profile), store)
    write_record(r0 / "analysis.json", AnalysisRecord(agent="expert", platform="cpu", source=src,
                                                      skipped=profile.reason), store)
    return r0, problem_record, example_record


def _refine(ctx: StageContext, profile: Profile) -> tuple[CandidateRecord, str]:
    r0, problem_record, example_record = _round0(ctx, profile)
    rec = run_refine(ctx, round=1, prev_dir=r0, problem_record=problem_record, example_record=example_record,
                     out_dir=r0.parent / "r1")
    transcript = ctx.store.get_json(rec.transcript) if rec.transcript else {}
    return rec, json.dumps(transcript.get("messages", []))


@pytest.mark.parametrize("reason,detail", [
    ("stale_output", "timed call 7 (input set 1, contents 0) returned a wrong answer"),
    ("timing_inconsistent", "candidate: claims 0.7 ms a call; the parent's clock saw at least 14 ms"),
])
def test_a_timing_rejection_is_repaired_with_its_reason(tmp_path: Path, reason: str, detail: str) -> None:
    ctx = _context(tmp_path)
    rec, messages = _refine(ctx, Profile(ok=False, reason=reason, detail=detail))
    assert rec.mode == "repair" and rec.functional_used == 1, rec
    assert f"profile: `{reason}`" in messages and detail[:40] in messages  # what the agent was shown
    assert "passed verification, but its timed run was rejected" in messages
    assert "profile" in rec.used  # the repair names the profile it answered


def test_a_host_failure_during_timing_is_not_the_candidates_to_repair(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    rec, _ = _refine(ctx, Profile(ok=False, reason="harness_error", detail="the reference failed"))
    assert rec.mode != "repair" and rec.functional_used == 0


def test_a_spent_repair_budget_carries_with_the_reason(tmp_path: Path) -> None:
    ctx = _context(tmp_path, functional=0)
    rec, _ = _refine(ctx, Profile(ok=False, reason="stale_output", detail="x"))
    assert rec.mode == "carry"
    transcript = ctx.store.get_json(rec.transcript)
    assert "timing rejected: stale_output" in transcript["response"]


def test_the_ledger_shows_the_timing_reason_of_a_verified_round() -> None:
    ok = VerifyRecord(platform="cpu", problem_source="0", source="s",
                      verdict=Verdict(ok=True, reason="ok", policy="strict", atol=1e-4, rtol=1e-4))
    stale = ProfileRecord(platform="cpu", problem_source="0", source="s",
                          profile=Profile(ok=False, reason="timing_inconsistent"))
    assert round_outcome(ok, stale) == "timing_inconsistent"
    assert round_outcome(ok, ProfileRecord(platform="cpu", problem_source="0", source="s", skipped="x")) == "ok"
    assert round_outcome(None, stale) is None


def test_the_contract_explains_every_reason_code() -> None:
    contract = (PROMPTS_DIR / "contract.md").read_text()
    listed = set(re.findall(r"`([a-z_]+)`", contract))
    missing = [r.value for r in Reason if r is not Reason.OK and r.value not in listed]
    assert missing == [], f"reason codes the agents are never told about: {missing}"
    for code in ("stale_output", "timing_inconsistent"):  # explained, not only named
        assert re.search(rf"`{code}` \(", contract), code


def test_select_says_why_a_verified_cell_has_no_timed_winner() -> None:
    from kforge.stages.select import _status_without_winner

    ok = VerifyRecord(platform="cpu", problem_source="0", source="s",
                      verdict=Verdict(ok=True, reason="ok", policy="strict", atol=1e-4, rtol=1e-4))
    stale = ProfileRecord(platform="cpu", problem_source="0", source="s",
                          profile=Profile(ok=False, reason="stale_output", detail="timed call 3 was wrong"))
    status, detail = _status_without_winner([ok], [stale])
    assert status == "failed" and detail.startswith("verified, but the checked timing rejected it: stale_output")
