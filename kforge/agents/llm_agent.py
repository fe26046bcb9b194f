"""An agent backed by any model litellm reaches: hosted APIs or a local OpenAI-compatible server.

``LLMAgent(name, config, store)`` implements :class:`kforge.agents.base.Agent`::

    GenerationRequest ──prompting──> messages ──kforge.llm.complete──> reply ──extract──> source
    AnalysisRequest ──prompting (+ timeline PNG)──> messages ──complete──> JSON ──> Recommendation

A reply that cannot be used is a *recorded failure*, never an exception: a ``GenerationResult``
with ``source=None`` and the reason in ``extraction``, or a ``Recommendation`` with bottleneck
``unknown``; in both the transcript's ``error`` says what went wrong. A prompt too long for the
model is recorded the same way. Errors that no reply can fix propagate as typed
:class:`kforge.llm.LLMError` subclasses, so the job fails with a message saying what to do:
:class:`~kforge.llm.LLMConfigError` (wrong key, model name or api_base) and
:class:`~kforge.llm.LLMUnavailableError` (rate limits or outages outlasting every retry;
rerunning later resumes, since paid calls are cached).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from kforge.agents.extract import extract, fenced_blocks
from kforge.agents.prompting import (
    attach_image,
    prompt_digest,
    render_analysis_messages,
    render_generation_messages,
)
from kforge.config import AgentConfig
from kforge.llm import (
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
    Role,
    Transcript,
)
from kforge.store import Store

IMAGE_CAPTION = (
    "The picture below renders this profile: the candidate's kernels per forward call in "
    "launch order, and its median time against eager, torch.compile and the roofline floor."
)


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
    """The validated recommendation in ``reply`` (bare JSON, or JSON in a fence), or why not."""
    body = reply.strip()
    blocks = [b for b in fenced_blocks(body) if "{" in b.text]
    if blocks:
        body = blocks[0].text
    start, end = body.find("{"), body.rfind("}")
    if start < 0 or end <= start:
        return None, "no JSON object in the reply"
    try:
        return Recommendation.model_validate_json(body[start : end + 1]), None
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
            for e in err.errors()[:5]
        )
        return None, f"the reply is not a valid Recommendation ({problems})"


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
        llm_request = LLMRequest.for_agent(
            self.config,
            agent=self.name,
            role="generate",
            messages=render_generation_messages(request),
            prompt_digest=prompt_digest("system", "generate"),
        )
        try:
            result = complete(llm_request, store=self.store, config=self.config)
        except (LLMContextWindowError, LLMResponseError) as err:
            reason = "context_window" if isinstance(err, LLMContextWindowError) else "no_response"
            transcript = self._failure(llm_request, str(err))
            return GenerationResult(source=None, extraction=reason, plan={}, transcript=transcript)
        found = extract(result.content)
        reason = found.reason
        if found.source is None and result.finish_reason == "length":
            reason = "truncated"
        transcript = result.transcript
        if found.source is None:
            hint = " (the reply hit max_tokens: raise it)" if reason == "truncated" else ""
            transcript = transcript.model_copy(
                update={"error": f"extraction failed: {reason}{hint}"}
            )
            self.store.put_json(transcript)
        plan = {"llm": self._plan(result), "extraction": found.record()}
        return GenerationResult(
            source=found.source, extraction=reason, plan=plan, transcript=transcript
        )

    # ------------------------------------------------------------------ analysis
    def analyze(self, request: AnalysisRequest) -> AnalysisResult:
        messages: list[dict[str, Any]] = [dict(m) for m in render_analysis_messages(request)]
        if self.config.supports_images:
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
        try:
            result = complete(llm_request, store=self.store, config=self.config)
        except (LLMContextWindowError, LLMResponseError) as err:
            return AnalysisResult(
                recommendation=Recommendation(
                    bottleneck="unknown", summary=f"analysis failed: {err}"
                ),
                transcript=self._failure(llm_request, str(err)),
            )
        recommendation, problem = parse_recommendation(result.content)
        if recommendation is None:
            transcript = result.transcript.model_copy(update={"error": problem})
            self.store.put_json(transcript)
            recommendation = Recommendation(
                bottleneck="unknown", summary=f"analysis failed: {problem}"
            )
            return AnalysisResult(recommendation=recommendation, transcript=transcript)
        return AnalysisResult(recommendation=recommendation, transcript=result.transcript)

    def structured_output(self) -> bool:
        """Ask for a ``json_schema`` response format? Only when the config allows it
        (``response_format: true``) and the model can honour it: served from an api_base
        (vLLM, llama.cpp and ollama's OpenAI-compatible servers do), or known to litellm's
        model map as supporting response schemas. Otherwise the prompt asks for JSON and the
        reply is validated all the same."""
        if not self.config.response_format:
            return False
        if self.config.api_base:
            return True
        from kforge.llm import import_litellm

        return bool(import_litellm().supports_response_schema(model=self.config.model))

    # ------------------------------------------------------------------ helpers
    def _plan(self, result: LLMResult) -> dict[str, Any]:
        # Only what is the same on a cache hit, so a replayed call writes identical records.
        return {
            "model": self.config.model,
            "request": result.cache_key,
            "response": result.response_digest,
            "finish_reason": result.finish_reason,
        }

    def _failure(self, request: LLMRequest, error: str) -> Transcript:
        role: Role = request.role
        transcript = Transcript(
            agent=self.name,
            model=request.model,
            role=role,
            messages=request.messages,
            response="",
            request_digest=cache_key(request),
            error=error,
        )
        self.store.put_json(transcript)
        return transcript
