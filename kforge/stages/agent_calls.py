"""Agent calls shared by the generate, refine and analyze stages: request-keyed and cached in
the store, so the same request is never made twice, whatever the agent.

An LLM agent's failed round (no usable candidate, no usable analysis: an empty or truncated
reply, a reached spend cap) is recorded but not remembered here, so the next run asks again;
paid calls are cached underneath (``kforge.llm``) and are not paid twice.

:func:`agent_context` gathers what an LLM agent is told beyond the problem (the embedded agent
gets None, so its requests stay as they were): the device sheet (the verifier's measured peaks
and the device's properties), the timed sizes, and in later rounds the timings and the attempt
ledger of every earlier round, read from the run's round folders.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from kforge.agents.prompting import prompt_digest
from kforge.schema import (
    TOLERANCES,
    AgentContext,
    AnalysisRequest,
    AnalysisResult,
    Attempt,
    GenerationRequest,
    GenerationResult,
    OneShotExample,
    ProblemMeta,
    Transcript,
)
from kforge.stages.context import StageContext, write_record
from kforge.stages.records import (
    NO_CANDIDATE_MARK,
    AnalysisRecord,
    CandidateRecord,
    Mode,
    ProfileRecord,
    VerifyRecord,
)
from kforge.store import atomic_write


def _agent_settings(ctx: StageContext, agent: str) -> dict[str, Any]:
    settings = ctx.config.agents[agent].model_dump(mode="json")
    settings.pop("concurrency", None)  # how many at once never changes an answer
    settings.pop("budget_usd", None)  # nor does the spend cap (a stopped call is not kept)
    return settings


def _is_llm(ctx: StageContext, agent: str) -> bool:
    return ctx.config.agents[agent].kind == "litellm"


def generate_cached(
    ctx: StageContext, agent: str, request: GenerationRequest, *, suite: str | None = None
) -> GenerationResult:
    """The agent's candidate for ``request``; with best-of-n samples and ``suite`` given, the
    fastest verified sample (:func:`pick_fastest_sample`)."""
    key = ctx.action_key(
        "generate", agent=_agent_settings(ctx, agent), request=request.model_dump(mode="json"),
        prompts=prompt_digest("system", "generate"),
    )
    hit = ctx.cached(key, GenerationResult)
    if hit is not None:
        return hit
    from kforge.agents.registry import make_agent

    start = time.perf_counter()
    try:
        result = make_agent(agent, ctx.config.agents[agent], ctx.store).generate(request)
    except Exception as err:  # an agent's crash is this round's failed generation, not the stage's
        result = agent_crashed(ctx, agent, err)
    if not result.transcript.latency_s:  # the embedded agent does not time itself
        result.transcript.latency_s = round(time.perf_counter() - start, 3)
    ctx.ledger("agent_call", role="generate", agent=agent, problem=request.problem_name, round=request.round)
    if suite is not None and len(result.plan.get("samples", [])) > 1:
        result = pick_fastest_sample(ctx, result, platform=request.platform, suite=suite,
                                     problem=request.problem_name)
    transcript = ctx.store.put_json(result.transcript)
    if result.source is not None or not _is_llm(ctx, agent):
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
    if result.transcript.error is None or not _is_llm(ctx, agent):
        ctx.remember(key, result, [transcript])
    return result


def pick_fastest_sample(
    ctx: StageContext, result: GenerationResult, *, platform: str, suite: str, problem: str
) -> GenerationResult:
    """Best-of-n: build, verify and time every usable sample with the pipeline's own
    (action-cached) stage functions, so the winner's compile/verify/profile jobs downstream
    are cache hits and the DAG stays static; the fastest verified sample becomes the round's
    candidate (else the agent's choice stands). Verdicts and ms go into ``plan["samples"]``."""
    import tempfile

    from kforge.stages.compile import run_compile
    from kforge.stages.profile import run_profile
    from kforge.stages.verify import run_verify

    samples = [dict(s) for s in result.plan["samples"]]
    best: tuple[tuple[int, float], dict[str, Any]] | None = None
    with tempfile.TemporaryDirectory(prefix="kforge-samples-") as tmp:
        for sample in samples:  # one after another: Snakemake counted this job as one core
            if sample["source"] is None:
                continue
            folder = Path(tmp) / f"s{sample['sample']}"
            folder.mkdir()
            kernel = folder / "kernel.py"
            kernel.write_text(ctx.store.get_text(sample["source"]))
            run_compile(ctx, platform=platform, kernel=kernel, out=folder / "compile.json")
            verified = run_verify(ctx, platform=platform, suite=suite, problem=problem, kernel=kernel,
                                  compile_record=folder / "compile.json", out=folder / "verify.json")
            sample["verdict"] = verified.verdict.reason
            if not verified.verdict.ok:
                continue
            profiled = run_profile(ctx, platform=platform, suite=suite, problem=problem, kernel=kernel,
                                   verify_record=folder / "verify.json", out=folder / "profile.json")
            prof = profiled.profile
            ms = prof.candidate.median_ms if prof is not None and prof.ok and prof.candidate else None
            sample["ms"] = ms
            rank = (0, ms) if ms is not None else (1, 0.0)  # timed beats verified-but-untimed
            if best is None or rank < best[0]:
                best = (rank, sample)
    plan = {**result.plan, "samples": samples}
    if best is None:
        return result.model_copy(update={"plan": plan})
    chosen = best[1]
    plan["chosen_sample"], plan["chosen_by"] = chosen["sample"], "fastest verified sample"
    if isinstance(plan.get("llm"), dict):
        plan["llm"] = {k: v for k, v in plan["llm"].items() if k not in ("response", "finish_reason")}
        plan["llm"]["request"] = chosen["request"]
    transcript = Transcript.model_validate(ctx.store.get_json(chosen["transcript"])).model_copy(
        update={"usage": result.transcript.usage, "latency_s": result.transcript.latency_s}
    )
    return GenerationResult(source=ctx.store.get_text(chosen["source"]), extraction=chosen["extraction"],
                            plan=plan, transcript=transcript)


def agent_crashed(ctx: StageContext, agent: str, err: Exception) -> GenerationResult:
    """The round's result when the agent itself raised: no candidate, extraction
    ``agent_error``, the exception on one line in the transcript (the cell goes on: a later
    round or another problem is not lost to one agent bug)."""
    line = f"{type(err).__name__}: {err}".splitlines()[0][:500]
    transcript = Transcript(agent=agent, model=ctx.config.agents[agent].model, role="generate", messages=[],
                            response=f"agent error: {line}", error=line)
    return GenerationResult(source=None, extraction=f"agent_error: {line}", transcript=transcript)


def not_asked(ctx: StageContext, agent: str, why: str) -> GenerationResult:
    """The round's result for a problem that does not load: no candidate, no agent call (an
    LLM's would cost money and could only fail), extraction ``problem_error``."""
    from kforge.stages.problem import PROBLEM_ERROR

    transcript = Transcript(agent=agent, model=ctx.config.agents[agent].model, role="generate", messages=[],
                            response=f"not asked: the problem does not load: {why}")
    return GenerationResult(source=None, extraction=PROBLEM_ERROR, transcript=transcript)


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
        # an unknown price (None) stays None in the transcript; the record's column is a float
        cost_usd=(usage.cost_usd or 0.0) if mode != "carry" else 0.0,
        seconds=seconds,
    )
    kernel = result.source if result.source is not None else f"{NO_CANDIDATE_MARK}: {result.extraction}\n"
    atomic_write(out_dir / "kernel.py", kernel.encode())
    write_record(out_dir / "candidate.json", record, store)
    return record


# --------------------------------------------------------------------------- agent context


def _read(path: Path, model: type[Any]) -> Any:
    try:
        return model.model_validate_json(path.read_bytes())
    except (OSError, ValueError):
        return None


def _round3(value: float) -> float:
    return float(f"{value:.3g}")


def cpu_properties() -> dict[str, Any]:
    """Cores, vector ISA and cache sizes of this CPU (Linux ``/proc`` and ``/sys``)."""
    props: dict[str, Any] = {"cores": len(os.sched_getaffinity(0))}
    try:
        flags = next(
            (line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
             if line.startswith("flags")), [],
        )
        isa = [f for f in ("avx512f", "avx512bw", "avx512_bf16", "avx2", "fma", "neon") if f in flags]
        if isa:
            props["isa"] = ", ".join(isa)
    except OSError:
        pass
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = (index / "level").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        kib = int(size[:-1]) * (1024 if size.endswith("M") else 1) if size[:-1].isdigit() else 0
        if level == "2" and kib:
            props["l2_cache_kib"] = kib
        elif level == "3" and kib:
            props["l3_cache_mib"] = round(kib / 1024, 1)
    return props


def cuda_properties() -> dict[str, Any]:
    """SMs, shared memory and registers per SM, L2, memory of CUDA device 0."""
    import torch

    p = torch.cuda.get_device_properties(0)
    props = {
        "device_name": p.name,
        "compute_capability": f"{p.major}.{p.minor}",
        "sms": p.multi_processor_count,
        "memory_gib": round(p.total_memory / 2**30, 1),
    }
    for attr, key, scale in (
        ("shared_memory_per_multiprocessor", "shared_memory_per_sm_kib", 1024),
        ("shared_memory_per_block_optin", "shared_memory_per_block_kib", 1024),
        ("regs_per_multiprocessor", "registers_per_sm", 1),
        ("L2_cache_size", "l2_cache_mib", 2**20),
    ):
        value = getattr(p, attr, None)
        if value:
            props[key] = round(value / scale, 1) if scale > 1 else value
    return props


def device_sheet(ctx: StageContext, platform: str) -> dict[str, Any]:
    """The device a platform's candidates run on: the verifier's measured peaks (cached per
    host) and the device's properties. Noise (clocks, host, time, sandbox) stays out."""
    from kforge.platforms import get_platform
    from kforge.stages.profile import host_peaks

    device = get_platform(platform).device()
    sheet: dict[str, Any] = {}
    try:
        peaks = host_peaks(ctx, device)
        sheet["device_name"] = peaks.device_name
        for key in ("copy_gbps", "read_gbps", "cache_copy_gbps", "rated_gbps", "tf32_gflops",
                    "bf16_gflops"):
            if getattr(peaks, key):
                sheet[key] = _round3(getattr(peaks, key))
        sheet["policy_matmul_gflops"] = _round3(peaks.matmul_gflops)  # host_peaks: the policy's
    except Exception as err:  # no device here (a CUDA platform on a CPU host): say so
        sheet["device_name"] = f"{device} (not measurable on this host: {type(err).__name__})"
    try:
        sheet.update(cuda_properties() if device == "cuda" else cpu_properties())
    except Exception:
        pass
    return sheet


def round_outcome(verified: VerifyRecord | None, profiled: ProfileRecord | None) -> str | None:
    """A round's reason code as the agent should see it: the verifier's, or, for a verified
    candidate whose checked timing was rejected (``stale_output``, ``timing_inconsistent``,
    ``beats_roofline``, ...), the timing's."""
    if verified is None:
        return None
    prof = profiled.profile if profiled is not None else None
    if verified.verdict.ok and prof is not None and not prof.ok:
        return prof.reason
    return verified.verdict.reason


def _tried(mode: str, previous: str | None, analysis: AnalysisRecord | None) -> str:
    if mode == "initial":
        return "first candidate"
    if mode == "repair":
        return f"repair of {previous or 'a failure'}"
    if mode == "optimize" and analysis is not None and analysis.recommendation is not None:
        kinds = ", ".join(a.kind for a in analysis.recommendation.actions[:3])
        return f"{kinds or 'changes'} ({analysis.recommendation.bottleneck}-bound)"
    return "carried forward" if mode == "carry" else mode


def agent_context(
    ctx: StageContext, agent: str, *, platform: str, suite: str, problem: str,
    run_dir: Path, rounds: int,
) -> AgentContext | None:
    """The context of an LLM agent's request (None for the embedded agent): rounds
    ``r0 .. r{rounds-1}`` of ``run_dir`` make the ledger, the last of them the timings."""
    if not _is_llm(ctx, agent):
        return None
    meta = _read(ctx.root / "problems" / suite / f"{problem}.json", ProblemMeta)
    context = AgentContext(
        device=device_sheet(ctx, platform),
        preset=meta.preset if meta else ctx.config.suites[suite].preset,
        timed_sizes=dict(meta.sizes) if meta else {},
    )
    best: tuple[float, int, str | None] | None = None
    previous: str | None = None
    previous_analysis: AnalysisRecord | None = None
    for r in range(rounds):
        folder = run_dir / f"r{r}"
        cand = _read(folder / "candidate.json", CandidateRecord)
        if cand is None:
            break
        verified = _read(folder / "verify.json", VerifyRecord)
        profiled = _read(folder / "profile.json", ProfileRecord)
        timing = profiled.profile.candidate if profiled and profiled.profile else None
        ms = _round3(timing.median_ms) if timing else None
        verdict = round_outcome(verified, profiled) or cand.extraction
        if cand.source is None:
            verdict = cand.extraction
        context.ledger.append(Attempt(
            round=r, mode=cand.mode, tried=_tried(cand.mode, previous, previous_analysis),
            verdict=verdict, candidate_ms=ms,
        ))
        if ms is not None and verified is not None and verified.verdict.ok and verdict == "ok":
            if best is None or ms < best[0]:
                best = (ms, r, cand.source)
        if r == rounds - 1:
            _timings(context, profiled, verified, ctx.config.policy)
        previous, previous_analysis = verdict, _read(folder / "analysis.json", AnalysisRecord)
    if best is not None:
        context.ledger[best[1]].best = True
        if best[1] != rounds - 1 and best[2]:
            context.best_source = ctx.store.get_text(best[2])
    return context


def _timings(context: AgentContext, profiled: Any, verified: Any, policy: str) -> None:
    t = context.timings
    prof = profiled.profile if profiled is not None else None
    if prof is not None and prof.candidate is not None:
        t["candidate_ms"] = _round3(prof.candidate.median_ms)
        for key, timing in (("eager_ms", prof.eager), ("compile_ms", prof.compiled)):
            if timing is not None:
                t[key] = _round3(timing.median_ms)
        if prof.roofline_ms:
            t["roofline_ms"] = _round3(prof.roofline_ms)
            t["roofline_fraction"] = _round3(prof.roofline_ms / prof.candidate.median_ms)
        from kforge.agents.prompting import PROFILE_NOISE

        if prof.kernels:  # where the time goes, per kernel (top 5)
            context.signals["kernels (name: calls, total us)"] = "; ".join(
                f"{k.name}: {k.calls}, {k.total_us:.0f}" for k in prof.kernels[:5])
        for key, value in sorted(prof.extra.items()):  # ncu metrics and the like, not noise
            if key not in PROFILE_NOISE and isinstance(value, int | float | str | bool):
                context.signals[key] = _round3(value) if isinstance(value, float) else value
    if verified is not None and verified.verdict.max_abs_err is not None:
        t["max_abs_err"] = _round3(verified.verdict.max_abs_err)
        t["tolerance"] = TOLERANCES[policy]
        if verified.verdict.max_margin is not None:  # max error / allowed error, worst case
            t["max_margin"] = _round3(verified.verdict.max_margin)

