"""An agent backed by any model litellm reaches: hosted APIs or a local OpenAI-compatible server.

``LLMAgent(name, config, store)`` implements :class:`kforge.agents.base.Agent`::

    GenerationRequest ──prompting──> messages ──complete (x samples)──> reply ──extract──> source
                                                    └─ no code: one re-ask with the reason
    AnalysisRequest ──prompting (+ timeline PNG)──> messages ──complete──> JSON ──> Recommendation
                                                    └─ unusable JSON: one re-ask with the error

A reply that cannot be used is a *recorded failure*, never an exception: a ``GenerationResult``
with ``source=None`` and the reason in ``extraction``, or a ``Recommendation`` with bottleneck
``unknown``; in both the transcript's ``error`` says what went wrong. A prompt too long for the
model, an empty reply and a reached spend cap (``budget_exhausted``) are recorded the same way.
Errors that no reply can fix propagate as typed :class:`kforge.llm.LLMError` subclasses, so
the job fails with a message saying what to do: :class:`~kforge.llm.LLMConfigError` (wrong key,
model name or api_base) and :class:`~kforge.llm.LLMUnavailableError` (rate limits or outages
outlasting every retry; rerunning later resumes, since paid calls are cached).

Best-of-n (``samples: n``): n requests, sample 0 the plain one, the others at
``sample_temperature`` (where the model takes one), each extracted and recorded in
``plan["samples"]``; the first usable sample is the round's candidate. Usage (tokens, cost) of
a round covers every call it made: samples and re-asks.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from kforge.agents.extract import Extraction, extract, json_object, normalise_recommendation
from kforge.agents.prompting import (
    attach_image,
    prompt_digest,
    render_analysis_messages,
    render_generation_messages,
)
from kforge.config import AgentConfig
from kforge.llm import (
    LLMBudgetError,
    LLMContextWindowError,
    LLMRequest,
    LLMResponseError,
    LLMResult,
    cache_key,
    complete,
)
from kforge.schema import (
    AnalysisRequest,
    AnalysisResult,
    GenerationRequest,
    GenerationResult,
    Recommendation,
    Transcript,
    Usage,
)
from kforge.store import Store

IMAGE_CAPTION = (
    "The picture below renders this profile: the candidate's kernels per forward call in "
    "launch order, and its median time against eager, torch.compile and the roofline floor."
)
REASK_EXTRACTION = frozenset({"no_code_block", "no_model_new"})  # not "truncated": same again
RECORDED = (LLMContextWindowError, LLMResponseError, LLMBudgetError)


def recommendation_response_format() -> dict[str, Any]:
    """The OpenAI ``json_schema`` response format for a :class:`Recommendation`."""
    return {
        "type": "json_schema",
        "json_schema": {
            "name": "Recommendation",
            "schema": Recommendation.model_json_schema(),
            "strict": False,  # strict mode forbids the free-form evidence/params maps
        },
    }


def parse_recommendation(reply: str) -> tuple[Recommendation | None, str | None]:
    """The recommendation in ``reply`` (bare JSON, or JSON in a fence), read leniently (extra
    keys ignored, "85%" read as 85, unknown bottleneck names as ``other``), or why not."""
    data, problem = json_object(reply)
    if data is None:
        return None, problem
    try:
        return Recommendation.model_validate(normalise_recommendation(data)), None
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
            for e in err.errors()[:5]
        )
        return None, f"the reply is not a valid Recommendation ({problems})"


def failure_reason(err: Exception) -> str:
    if isinstance(err, LLMContextWindowError):
        return "context_window"
    return "budget_exhausted" if isinstance(err, LLMBudgetError) else "no_response"


def total_usage(usages: list[Usage]) -> Usage:
    """Tokens and cost of several calls; the cost is unknown (None) if any call's is."""
    costs = [u.cost_usd for u in usages]
    return Usage(
        prompt_tokens=sum(u.prompt_tokens for u in usages),
        completion_tokens=sum(u.completion_tokens for u in usages),
        cost_usd=None if any(c is None for c in costs) else sum(c or 0.0 for c in costs),
    )


@dataclass
class Sample:
    """One generation sample: what was extracted, from which call, and what it all cost."""

    index: int
    found: Extraction | None
    reason: str
    transcript: Transcript
    result: LLMResult | None = None
    usages: list[Usage] = field(default_factory=list)
    latency_s: float = 0.0
    reasked: bool = False


class LLMAgent:
    """Generation and performance analysis through :func:`kforge.llm.complete`."""

    def __init__(self, name: str, config: AgentConfig, store: Store) -> None:
        if config.kind != "litellm":
            raise ValueError(
                f"agent {name!r} has kind {config.kind!r}; LLMAgent needs kind: litellm"
            )
        self.name = name
        self.config = config
        self.store = store

    # ------------------------------------------------------------------ generation
    def generate(self, request: GenerationRequest) -> GenerationResult:
        messages = render_generation_messages(request)
        digest = prompt_digest("system", "generate")
        n = self.config.samples
        if n == 1:
            samples = [self._sample(messages, digest, 0)]
        else:
            with ThreadPoolExecutor(max_workers=min(n, self.config.concurrency)) as pool:
                samples = list(pool.map(lambda i: self._sample(messages, digest, i), range(n)))
        chosen = next((s for s in samples if s.found and s.found.source), samples[0])
        usages = [u for s in samples for u in s.usages]
        transcript = chosen.transcript.model_copy(
            update={
                "usage": total_usage(usages) if usages else chosen.transcript.usage,
                "latency_s": round(sum(s.latency_s for s in samples), 6),
            }
        )
        if transcript != chosen.transcript:
            self.store.put_json(transcript)
        plan: dict[str, Any] = {}
        if chosen.result is not None:
            plan["llm"] = self._plan(chosen.result)
        if chosen.found is not None:
            plan["extraction"] = chosen.found.record()
        if n > 1:
            plan["samples"] = [self._sample_record(s) for s in samples]
            plan["chosen_sample"] = chosen.index
        source = chosen.found.source if chosen.found else None
        return GenerationResult(
            source=source, extraction=chosen.reason, plan=plan, transcript=transcript
        )

    def _sample(self, messages: list[dict[str, Any]], digest: str, index: int) -> Sample:
        request = LLMRequest.for_agent(
            self.config, agent=self.name, role="generate", messages=messages,
            prompt_digest=digest, sample=index,
        )
        sample = self._ask_code(request, index)
        if sample.found is None or sample.reason not in REASK_EXTRACTION or not self.config.reasks:
            return sample
        for _ in range(self.config.reasks):  # one bounded re-ask with what was wrong
            hint = (
                f"Your reply could not be used ({sample.reason}: "
                + ("no ```python code block" if sample.reason == "no_code_block"
                   else "no code block defines `class ModelNew`")
                + "). Reply with exactly one ```python code block holding the complete module "
                "that defines `class ModelNew(nn.Module)`."
            )
            follow = request.model_copy(update={"messages": [
                *request.messages,
                {"role": "assistant", "content": sample.transcript.response},
                {"role": "user", "content": hint},
            ]})
            again = self._ask_code(follow, index)
            again.usages = sample.usages + again.usages
            again.latency_s += sample.latency_s
            again.reasked = True
            sample = again
            if sample.found is None or sample.reason not in REASK_EXTRACTION:
                break
        return sample

    def _ask_code(self, request: LLMRequest, index: int) -> Sample:
        try:
            result = complete(request, store=self.store, config=self.config)
        except RECORDED as err:
            return Sample(index, None, failure_reason(err), self._failure(request, str(err)))
        found = extract(result.content)
        reason = found.reason
        if found.source is None and (result.finish_reason == "length" or result.incomplete):
            reason = "truncated"
        transcript = result.transcript
        if found.source is None:
            hint = " (the reply hit max_tokens: raise it)" if reason == "truncated" else ""
            transcript = transcript.model_copy(
                update={"error": f"extraction failed: {reason}{hint}"}
            )
            self.store.put_json(transcript)
        return Sample(index, found, reason, transcript, result, [result.transcript.usage],
                      result.transcript.latency_s)

    # ------------------------------------------------------------------ analysis
    def analyze(self, request: AnalysisRequest) -> AnalysisResult:
        messages: list[dict[str, Any]] = [dict(m) for m in render_analysis_messages(request)]
        if self.sees_images():
            png = request.timeline_png
            if png is None:
                from kforge.agents.timeline import timeline_png_b64

                png = timeline_png_b64(request.profile)
            messages = attach_image(messages, png, IMAGE_CAPTION)
        llm_request = LLMRequest.for_agent(
            self.config,
            agent=self.name,
            role="analyze",
            messages=messages,
            prompt_digest=prompt_digest("system", "analyze"),
            response_schema=recommendation_response_format() if self.structured_output() else None,
        )
        usages: list[Usage] = []
        for attempt in range(self.config.reasks + 1):
            try:
                result = complete(llm_request, store=self.store, config=self.config)
            except RECORDED as err:
                failed = self._failure(llm_request, str(err))
                if usages:
                    failed = failed.model_copy(update={"usage": total_usage(usages)})
                return AnalysisResult(
                    recommendation=Recommendation(bottleneck="unknown",
                                                  summary=f"analysis failed: {err}"),
                    transcript=failed,
                )
            usages.append(result.transcript.usage)
            recommendation, problem = parse_recommendation(result.content)
            transcript = result.transcript
            if len(usages) > 1:
                transcript = transcript.model_copy(update={"usage": total_usage(usages)})
            if recommendation is not None:
                if transcript != result.transcript:
                    self.store.put_json(transcript)
                return AnalysisResult(recommendation=recommendation, transcript=transcript)
            if attempt == self.config.reasks:
                transcript = transcript.model_copy(update={"error": problem})
                self.store.put_json(transcript)
                return AnalysisResult(
                    recommendation=Recommendation(bottleneck="unknown",
                                                  summary=f"analysis failed: {problem}"),
                    transcript=transcript,
                )
            llm_request = llm_request.model_copy(update={"messages": [
                *llm_request.messages,
                {"role": "assistant", "content": result.content},
                {"role": "user", "content": f"That reply could not be used: {problem}. Reply "
                 "with only the JSON object described above, no prose and no code fence."},
            ]})
        raise AssertionError("unreachable")

    def structured_output(self) -> bool:
        """Ask for a ``json_schema`` response format? Where ``response_format: true`` and the
        model honours it: served from an api_base (vLLM, llama.cpp and ollama's
        OpenAI-compatible servers do; a server that refuses it gets the prompt alone), or
        litellm's tables say so. Otherwise the prompt asks for JSON; either way the reply is
        validated."""
        if not self.config.response_format:
            return False
        if self.config.api_base:
            return True
        from kforge.llm_request import model_caps, wants_json_schema

        return wants_json_schema(self.config, model_caps(self.config.model))

    def sees_images(self) -> bool:
        """Send the timeline picture? ``supports_images`` decides when set; otherwise litellm's
        ``supports_vision`` for hosted models, and no for a model behind an api_base (set
        ``supports_images: true`` for a local vision model)."""
        if self.config.supports_images is not None:
            return self.config.supports_images
        if self.config.api_base:
            return False
        from kforge.llm_request import model_caps, sees_images

        return sees_images(self.config, model_caps(self.config.model))

    # ------------------------------------------------------------------ helpers
    def _plan(self, result: LLMResult) -> dict[str, Any]:
        # Only what is the same on a cache hit, so a replayed call writes identical records.
        return {
            "model": self.config.model,
            "request": result.cache_key,
            "response": result.response_digest,
            "finish_reason": result.finish_reason,
            "sent": result.sent,
            "left_out": result.notes,
        }

    def _sample_record(self, sample: Sample) -> dict[str, Any]:
        source = sample.found.source if sample.found else None
        return {
            "sample": sample.index,
            "extraction": sample.reason,
            "source": self.store.put_text(source) if source is not None else None,
            "request": sample.transcript.request_digest,
            "transcript": self.store.put_json(sample.transcript),
            "reasked": sample.reasked,
        }

    def _failure(self, request: LLMRequest, error: str) -> Transcript:
        transcript = Transcript(
            agent=self.name,
            model=request.model,
            role=request.role,
            messages=request.messages,
            response="",
            usage=Usage(),
            request_digest=cache_key(request),
            error=error,
        )
        self.store.put_json(transcript)
        return transcript
