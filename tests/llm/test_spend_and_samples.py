"""Spend: the per-agent cap stops new calls and says so; unknown prices are None, never $0.
Search: best-of-n samples, each extracted and recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from kforge.agents.llm_agent import LLMAgent
from kforge.config import parse_config
from kforge.llm import LLMBudgetError, LLMRequest, complete
from kforge.llm_budget import spend_summary, spent
from kforge.stages.agent_calls import generate_cached
from kforge.stages.context import StageContext
from kforge.store import Store

from .helpers import GOOD_KERNEL, agent_config, fenced, generation_request
from .server import Received, Reply, ScriptedServer, ok

PRICED = {"input_cost_per_token": 1e-3, "output_cost_per_token": 1e-3}  # 160 tokens: $0.16


def ask(srv: ScriptedServer, store: Store, text: str, **overrides: object) -> object:
    config = agent_config(srv, **overrides)
    request = LLMRequest.for_agent(config, agent="llm", role="generate",
                                   messages=[{"role": "user", "content": text}], prompt_digest="p")
    return complete(request, store=store, config=config)


def test_the_spend_cap_stops_new_calls_and_says_so(server: ScriptedServer, store: Store) -> None:
    server.script(ok("one"), ok("two"), ok("never"))
    ask(server, store, "a", budget_usd=0.2, **PRICED)
    ask(server, store, "b", budget_usd=0.2, **PRICED)  # $0.16 spent: under the cap, paid
    assert spent(store.root, "llm") == pytest.approx(0.32)
    with pytest.raises(LLMBudgetError, match=r"spend cap reached \(\$0.3200 of budget_usd \$0.2000\)"):
        ask(server, store, "c", budget_usd=0.2, **PRICED)
    assert len(server.received) == 2
    assert ask(server, store, "a", budget_usd=0.2, **PRICED).cached  # paid calls still replay
    [row] = spend_summary(store.root)
    assert row["stopped_by_budget"] and row["calls"] == 2 and row["spent_usd"] == pytest.approx(0.32)
    assert "stopped by budget_usd $0.2 (cap reached)" in row["line"]


def test_a_stopped_round_is_a_recorded_failure_and_asked_again_later(
    server: ScriptedServer, tmp_path: Path
) -> None:
    def ctx(budget: float) -> StageContext:
        config = parse_config({
            "store": str(tmp_path / "artifacts"),
            "agents": {"llm": {"kind": "litellm", "model": "openai/kforge-test", "num_retries": 0,
                               "api_base": server.api_base, "budget_usd": budget, **PRICED}},
            "suites": {"s": {"path": str(tmp_path)}},
            "run": {"agents": ["llm"], "platforms": ["cpu"], "suites": ["s"]},
        })
        return StageContext(config=config, store=Store(config.store))

    server.script(ok("prose, no code", completion_tokens=400), ok(fenced(GOOD_KERNEL)))
    first = generate_cached(ctx(0.1), "llm", generation_request())  # $0.52: over the cap
    assert first.source is None and first.extraction == "budget_exhausted"  # its re-ask stopped
    assert first.transcript.error and "spend cap reached" in first.transcript.error
    second = generate_cached(ctx(5.0), "llm", generation_request())  # cap raised: asked again
    assert second.source == GOOD_KERNEL and len(server.received) == 2


def test_a_cap_on_an_unpriced_model_refuses_before_any_call(
    server: ScriptedServer, store: Store
) -> None:
    with pytest.raises(LLMBudgetError, match="price of 'openai/kforge-test' is unknown"):
        ask(server, store, "a", budget_usd=1.0, input_cost_per_token=None, output_cost_per_token=None)
    assert server.received == []
    assert "price unknown" in spend_summary(store.root)[0]["line"]


def test_an_unknown_price_is_none_not_zero(server: ScriptedServer, store: Store) -> None:
    server.script(ok("x"))
    result = ask(server, store, "a", input_cost_per_token=None, output_cost_per_token=None)
    assert result.transcript.usage.cost_usd is None and not result.cost_known  # type: ignore[attr-defined]
    assert spend_summary(store.root)[0]["unknown_cost_calls"] == 1


def test_best_of_n_requests_n_samples_and_records_each(server: ScriptedServer, store: Store) -> None:
    other = GOOD_KERNEL.replace("relu_kernel", "relu_fast")
    by_seed = {0: ok("Sorry, no code."), 1: ok(fenced(GOOD_KERNEL)), 2: ok(fenced(other))}

    def responder(received: Received) -> Reply:
        return by_seed[received.body["seed"]]

    server.responder = responder
    llm = LLMAgent("llm", agent_config(server, samples=3, reasks=0), store)
    result = llm.generate(generation_request())
    bodies = sorted((r.body for r in server.received), key=lambda b: b["seed"])
    assert [b["temperature"] for b in bodies] == [0.0, 0.8, 0.8]  # samples after the first: T
    assert result.source == GOOD_KERNEL and result.plan["chosen_sample"] == 1
    samples = result.plan["samples"]
    assert [s["extraction"] for s in samples] == ["no_code_block", "ok", "ok"]
    assert store.get_text(samples[2]["source"]) == other and samples[0]["source"] is None
    assert result.transcript.usage.prompt_tokens == 3 * 120  # every sample counted
    again = LLMAgent("llm", agent_config(server, samples=3, reasks=0), store).generate(generation_request())
    assert again == result and len(server.received) == 3  # each sample cached on its own key


def test_a_known_model_is_priced_from_litellms_table(server: ScriptedServer, store: Store) -> None:
    server.script(ok("x", prompt_tokens=1000, completion_tokens=1000))
    result = ask(server, store, "a", model="openai/gpt-4o-mini",
                 input_cost_per_token=None, output_cost_per_token=None)
    cost = result.transcript.usage.cost_usd  # type: ignore[attr-defined]
    assert cost is not None and 0 < cost < 0.01


def test_best_of_n_carries_the_fastest_verified_sample(
    server: ScriptedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stage builds, verifies and times each sample with the pipeline's own stage
    functions (faked here: a real build + sandboxed verification per sample is minutes)."""
    from kforge.schema import Profile, Verdict
    from kforge.stages import compile as compile_stage
    from kforge.stages import profile as profile_stage
    from kforge.stages import verify as verify_stage
    from kforge.stages.records import CompileRecord, ProfileRecord, VerifyRecord

    from .helpers import timing

    kernels = {seed: GOOD_KERNEL.replace("relu_kernel", f"relu_v{seed}") for seed in range(3)}
    speed = {"relu_v0": 0.5, "relu_v1": 2.0, "relu_v2": 1.0}  # v0 is fastest but wrong
    server.responder = lambda received: ok(fenced(kernels[received.body["seed"]]))

    def name(kernel: Path) -> str:
        return next(k for k in speed if k in kernel.read_text())

    def fake_compile(ctx: StageContext, *, platform: str, kernel: Path, out: Path) -> CompileRecord:
        return CompileRecord(platform=platform, source=name(kernel), ok=True, reason="ok", log=None, seconds=0.0)

    def fake_verify(ctx: StageContext, *, kernel: Path, **_: object) -> VerifyRecord:
        ok_ = name(kernel) != "relu_v0"
        verdict = Verdict(ok=ok_, reason="ok" if ok_ else "output_mismatch", policy="strict",
                          atol=1e-4, rtol=1e-4)
        return VerifyRecord(platform="cpu", problem_source="p", source=name(kernel), verdict=verdict)

    def fake_profile(ctx: StageContext, *, kernel: Path, **_: object) -> ProfileRecord:
        profile = Profile(ok=True, candidate=timing(speed[name(kernel)]))
        return ProfileRecord(platform="cpu", problem_source="p", source=name(kernel), profile=profile)

    monkeypatch.setattr(compile_stage, "run_compile", fake_compile)
    monkeypatch.setattr(verify_stage, "run_verify", fake_verify)
    monkeypatch.setattr(profile_stage, "run_profile", fake_profile)
    config = parse_config({
        "store": str(tmp_path / "artifacts"),
        "agents": {"llm": {"kind": "litellm", "model": "openai/kforge-test", "num_retries": 0,
                           "api_base": server.api_base, "samples": 3, **PRICED}},
        "suites": {"s": {"path": str(tmp_path)}},
        "run": {"agents": ["llm"], "platforms": ["cpu"], "suites": ["s"]},
    })
    ctx = StageContext(config=config, store=Store(config.store))
    result = generate_cached(ctx, "llm", generation_request(), suite="s")
    assert result.source == kernels[2] and result.plan["chosen_sample"] == 2
    assert [s.get("verdict") for s in result.plan["samples"]] == ["output_mismatch", "ok", "ok"]
    assert [s.get("ms") for s in result.plan["samples"]] == [None, 2.0, 1.0]
    assert result.transcript.usage.prompt_tokens == 3 * 120
