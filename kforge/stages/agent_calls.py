"""Agent calls shared by the generate, refine and analyze stages: request-keyed and cached in
the store, so the same request is never made twice, whatever the agent."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from kforge.agents.prompting import prompt_digest
from kforge.schema import (
    AnalysisRequest,
    AnalysisResult,
    GenerationRequest,
    GenerationResult,
    OneShotExample,
)
from kforge.stages.context import StageContext, write_record
from kforge.stages.records import NO_CANDIDATE_MARK, CandidateRecord, Mode
from kforge.store import atomic_write


def _agent_settings(ctx: StageContext, agent: str) -> dict[str, Any]:
    settings = ctx.config.agents[agent].model_dump(mode="json")
    settings.pop("concurrency", None)  # how many at once never changes an answer
    return settings


def generate_cached(ctx: StageContext, agent: str, request: GenerationRequest) -> GenerationResult:
    key = ctx.action_key(
        "generate", agent=_agent_settings(ctx, agent), request=request.model_dump(mode="json"),
        prompts=prompt_digest("system", "generate"),
    )
    hit = ctx.cached(key, GenerationResult)
    if hit is not None:
        return hit
    from kforge.agents.registry import make_agent

    start = time.perf_counter()
    result = make_agent(agent, ctx.config.agents[agent], ctx.store).generate(request)
    if not result.transcript.latency_s:  # the embedded agent does not time itself
        result.transcript.latency_s = round(time.perf_counter() - start, 3)
    ctx.ledger("agent_call", role="generate", agent=agent, problem=request.problem_name, round=request.round)
    transcript = ctx.store.put_json(result.transcript)
    ctx.remember(key, result, [transcript])
    return result


def analyze_cached(ctx: StageContext, agent: str, request: AnalysisRequest) -> AnalysisResult:
    key = ctx.action_key(
        "analyze", agent=_agent_settings(ctx, agent), request=request.model_dump(mode="json"),
        prompts=prompt_digest("system", "analyze"),
    )
    hit = ctx.cached(key, AnalysisResult)
    if hit is not None:
        return hit
    from kforge.agents.registry import make_agent

    start = time.perf_counter()
    result = make_agent(agent, ctx.config.agents[agent], ctx.store).analyze(request)
    if not result.transcript.latency_s:
        result.transcript.latency_s = round(time.perf_counter() - start, 3)
    ctx.ledger("agent_call", role="analyze", agent=agent, problem=request.problem_name)
    transcript = ctx.store.put_json(result.transcript)
    ctx.remember(key, result, [transcript])
    return result


def load_example_blob(ctx: StageContext, example_record: Path) -> OneShotExample:
    data = json.loads(example_record.read_text())
    if data.get("example") is None:
        raise FileNotFoundError(data.get("error") or f"no one-shot example in {example_record}")
    return OneShotExample.model_validate(ctx.store.get_json(data["example"]))


def write_candidate(
    ctx: StageContext,
    *,
    agent: str,
    platform: str,
    suite: str,
    problem: str,
    round: int,
    mode: Mode,
    result: GenerationResult,
    parent: str | None,
    used: dict[str, str],
    functional_used: int,
    optimization_used: int,
    seconds: float,
    out_dir: Path,
) -> CandidateRecord:
    """Store a generation result and write ``kernel.py`` + ``candidate.json`` for the round."""
    store = ctx.store
    source_digest = store.put_text(result.source) if result.source is not None else None
    usage = result.transcript.usage
    record = CandidateRecord(
        agent=agent,
        model=ctx.config.agents[agent].model,
        platform=platform,
        suite=suite,
        problem=problem,
        round=round,
        mode=mode,
        source=source_digest,
        extraction=result.extraction,
        plan=store.put_json(result.plan),
        transcript=store.put_json(result.transcript),
        parent=parent,
        used=used,
        functional_used=functional_used,
        optimization_used=optimization_used,
        prompt_tokens=usage.prompt_tokens if mode != "carry" else 0,
        completion_tokens=usage.completion_tokens if mode != "carry" else 0,
        cost_usd=usage.cost_usd if mode != "carry" else 0.0,
        seconds=seconds,
    )
    kernel = result.source if result.source is not None else f"{NO_CANDIDATE_MARK}: {result.extraction}\n"
    atomic_write(out_dir / "kernel.py", kernel.encode())
    write_record(out_dir / "candidate.json", record, store)
    return record
