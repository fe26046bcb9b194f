"""What an LLM agent is told beyond the problem: the device sheet, the contract (timed sizes,
tolerance, reason codes), timings against eager and torch.compile, the attempt ledger and the
best kernel so far; the analyst sees the reference Model. Read from the recorded request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kforge.agents.llm_agent import LLMAgent
from kforge.config import parse_config
from kforge.schema import KernelStat, ProblemMeta, Profile, Recommendation, Verdict
from kforge.stages import agent_calls
from kforge.stages.agent_calls import agent_context
from kforge.stages.context import StageContext
from kforge.stages.records import AnalysisRecord, CandidateRecord, ProfileRecord, VerifyRecord
from kforge.store import Store, canonical_json
from kforge.verifier.reasons import Reason

from .helpers import GOOD_KERNEL, PROBLEM, analysis_request, fenced, generation_request, timing
from .server import ScriptedServer, ok

DEVICE = {"device_name": "Test CPU", "copy_gbps": 21.5, "policy_matmul_gflops": 150.0,
          "cores": 2, "isa": "avx2, fma"}


@pytest.fixture
def ctx(tmp_path: Path, server: ScriptedServer, monkeypatch: pytest.MonkeyPatch) -> StageContext:
    config = parse_config({
        "store": str(tmp_path / "artifacts"),
        "agents": {
            "llm": {"kind": "litellm", "model": "openai/kforge-test", "api_base": server.api_base,
                    "input_cost_per_token": 0.0, "output_cost_per_token": 0.0, "num_retries": 0},
            "expert": {"kind": "expert"},
        },
        "suites": {"s": {"path": str(tmp_path / "problems"), "preset": "ci"}},
        "run": {"agents": ["llm"], "platforms": ["cpu"], "suites": ["s"]},
    })
    monkeypatch.setattr(agent_calls, "device_sheet", lambda ctx, platform: dict(DEVICE))
    context = StageContext(config=config, store=Store(config.store))
    meta = ProblemMeta(name="relu", suite="s", path="relu.py", source_digest="x", preset="ci",
                       sizes={"N": 64, "M": 32})
    (context.root / "problems" / "s").mkdir(parents=True)
    (context.root / "problems" / "s" / "relu.json").write_bytes(canonical_json(meta))
    return context


def _write(folder: Path, name: str, record: Any) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(canonical_json(record))


def _round(ctx: StageContext, run: Path, r: int, mode: str, ms: float | None, reason: str = "ok",
           rec: Recommendation | None = None) -> None:
    folder, store = run / f"r{r}", ctx.store
    source = store.put_text(GOOD_KERNEL.replace("relu", f"relu_r{r}"))
    base = {"platform": "cpu", "problem_source": "p", "source": source}
    _write(folder, "candidate.json", CandidateRecord(
        agent="llm", model="m", platform="cpu", suite="s", problem="relu", round=r, mode=mode,
        source=source, extraction="ok", plan=store.put_json({}), transcript=None, parent=None))
    _write(folder, "verify.json", VerifyRecord(**base, verdict=Verdict(
        ok=reason == "ok", reason=reason, policy="strict", atol=1e-4, rtol=1e-4, max_abs_err=3e-6)))
    profile = None if ms is None else Profile(
        ok=True, candidate=timing(ms), eager=timing(1.0), compiled=timing(0.8), roofline_ms=0.1,
        kernels=[KernelStat(name="relu_kernel", calls=20, total_us=1500.0)],
        extra={"achieved_occupancy": 0.41, "sandbox": "bwrap", "seconds": 12.5})
    _write(folder, "profile.json", ProfileRecord(**base, profile=profile))
    _write(folder, "analysis.json", AnalysisRecord(agent="llm", platform="cpu", source=source,
                                                   recommendation=rec))


def test_optimisation_prompts_carry_timings_ledger_device_and_contract(
    ctx: StageContext, server: ScriptedServer
) -> None:
    run = ctx.root / "runs" / "llm" / "cpu" / "s" / "relu"
    fuse = Recommendation.model_validate({"bottleneck": "memory", "actions": [{"kind": "fuse"}]})
    _round(ctx, run, 0, "initial", 2.0, rec=fuse)
    _round(ctx, run, 1, "optimize", 0.5)
    _round(ctx, run, 2, "optimize", 0.9)
    context = agent_context(ctx, "llm", platform="cpu", suite="s", problem="relu", run_dir=run, rounds=3)
    assert context is not None and [a.mode for a in context.ledger] == ["initial", "optimize", "optimize"]
    assert [a.best for a in context.ledger] == [False, True, False]
    assert "relu_r1" in (context.best_source or "")  # the best is not the previous round
    assert context.timings["candidate_ms"] == 0.9 and context.timings["eager_ms"] == 1.0
    assert agent_context(ctx, "expert", platform="cpu", suite="s", problem="relu", run_dir=run,
                         rounds=3) is None  # the embedded agent's requests stay as they were

    server.script(ok(fenced(GOOD_KERNEL)))
    LLMAgent("llm", ctx.config.agents["llm"], ctx.store).generate(
        generation_request(round=3, previous_source=GOOD_KERNEL, context=context))
    prompt = server.received[0].user_text
    assert "- the previous candidate: 0.9 ms" in prompt
    assert "- PyTorch eager: 1 ms (candidate speedup 1.11x)" in prompt
    assert "- torch.compile: 0.8 ms (candidate speedup 0.89x)" in prompt
    assert "- kernels (name: calls, total us): relu_kernel: 20, 1500" in prompt
    assert "- achieved_occupancy: 0.41" in prompt and "bwrap" not in prompt  # signals, no noise
    assert "roofline floor: 0.1 ms; the candidate runs at 11.1% of that speed" in prompt and "largest error: 3e-06" in prompt
    assert "| 0 | initial | first candidate | ok | 2 |" in prompt
    assert "| 1 (best) | optimize | fuse (memory-bound) | ok | 0.5 |" in prompt
    assert "relu_r1" in prompt  # the best kernel so far, shown in full
    assert "measured copy bandwidth (DRAM-sized buffers): 21.5 GB/s" in prompt
    assert "CPU cores available: 2" in prompt and "vector ISA: avx2, fma" in prompt
    assert "`ci` sizes: M = 32, N = 64" in prompt and "atol = rtol = 0.0001" in prompt
    for reason in Reason:  # every verdict code the verifier can give is explained
        if reason != Reason.OK:
            assert f"`{reason.value}`" in prompt, reason


def test_round_zero_has_device_and_contract_but_no_ledger(ctx: StageContext, server: ScriptedServer) -> None:
    run = ctx.root / "runs" / "llm" / "cpu" / "s" / "relu"
    context = agent_context(ctx, "llm", platform="cpu", suite="s", problem="relu", run_dir=run, rounds=0)
    server.script(ok(fenced(GOOD_KERNEL)))
    LLMAgent("llm", ctx.config.agents["llm"], ctx.store).generate(generation_request(context=context))
    prompt = server.received[0].user_text
    assert "The target device" in prompt and "Attempt ledger" not in prompt
    assert "The contract the verifier enforces" in prompt


def test_the_analyst_sees_the_reference_and_the_ledger(ctx: StageContext, server: ScriptedServer) -> None:
    run = ctx.root / "runs" / "llm" / "cpu" / "s" / "relu"
    _round(ctx, run, 0, "initial", None, reason="output_mismatch")
    _round(ctx, run, 1, "repair", 0.7)
    context = agent_context(ctx, "llm", platform="cpu", suite="s", problem="relu", run_dir=run, rounds=2)
    server.script(ok('{"bottleneck": "memory", "summary": "s"}'))
    LLMAgent("llm", ctx.config.agents["llm"], ctx.store).analyze(
        analysis_request(problem_source=PROBLEM, context=context))
    prompt = server.received[0].user_text
    assert "## Reference (`Model`)" in prompt and "class Model(nn.Module)" in prompt
    assert "| 1 (best) | repair | repair of output_mismatch | ok | 0.7 |" in prompt
    assert "| 0 | initial | first candidate | output_mismatch | - |" in prompt


def test_cpu_properties_are_read_from_this_host() -> None:
    props = agent_calls.cpu_properties()
    assert props["cores"] >= 1 and set(props) <= {"cores", "isa", "l2_cache_kib", "l3_cache_mib"}
