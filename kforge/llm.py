"""The one seam between KForge and language models: ``complete(request, store=, config=)``.

Every LLM call in KForge goes through :func:`complete`, which adds what litellm does not::

    LLMRequest ──cache_key──> store action cache ──hit (a complete answer)──> LLMResult
                                   │ miss (or only an empty / truncated reply on record)
                                   v
              spend cap (kforge.llm_budget) ──reached──> LLMBudgetError, no call
                                   │
              concurrency slot (file locks under <store>/locks/llm/<agent>/, across processes)
                                   │
              parameters built for this model from litellm's tables (kforge.llm_request)
                                   │
              litellm.completion, retried on 408/429/5xx/connection errors with backoff,
              and without a parameter the server refused with a 400 (kforge.llm_transport)
                                   │
              raw response stored as a blob, cache entry written ──> parsed ──> LLMResult
                                                                    (Transcript stored too)

The cache key is the canonical request (model, kind of api_base, messages, temperature, seed,
max_tokens, response schema, reasoning settings, sample index, prompt digest), never the API
key, so the same request is never paid twice, even when the previous run crashed while
parsing the reply. A reply with no content, or cut off at max_tokens, is stored and recorded
(``LLMResult.incomplete``) but never replayed as an answer: the next run asks again.

Errors are typed and say what to do next::

    LLMError                      (base; .model, .api_base)
    ├── LLMConfigError            a setting is wrong; fix the config, retrying will not help
    │   ├── LLMAuthError          401/403, or the API-key variable is unset
    │   ├── LLMNotFoundError      404: model name or api_base
    │   └── LLMBadRequestError    400 and other 4xx the server refused
    ├── LLMContextWindowError     the prompt does not fit the model (deterministic per request)
    ├── LLMUnavailableError       408/429/5xx/connection errors left after every retry
    │   └── LLMTimeoutError       every attempt timed out
    ├── LLMResponseError          the server answered, but with no message to read
    └── LLMBudgetError            the agent's budget_usd is spent: no new calls

litellm costs ~4-8 s and 200 MB to import: it is imported only inside a call.
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from kforge.config import AgentConfig
from kforge.llm_budget import call_cost, check_budget, record_spend
from kforge.llm_errors import (  # re-exported: callers catch them from kforge.llm
    LLMAuthError,
    LLMBadRequestError,
    LLMBudgetError,
    LLMConfigError,
    LLMContextWindowError,
    LLMError,
    LLMNotFoundError,
    LLMResponseError,
    LLMTimeoutError,
    LLMUnavailableError,
)
from kforge.llm_transport import (  # re-exported
    BACKOFF_BASE_S,
    BACKOFF_CAP_S,
    LOCAL_DUMMY_KEY,
    call,
    concurrency_slot,
    import_litellm,
    litellm_version,
    where,
)
from kforge.schema import Role, Transcript, Usage
from kforge.store import Store, canonical_json, digest_of

__all__ = [
    "BACKOFF_BASE_S", "BACKOFF_CAP_S", "LOCAL_DUMMY_KEY", "LLMAuthError", "LLMBadRequestError",
    "LLMBudgetError", "LLMConfigError", "LLMContextWindowError", "LLMError", "LLMNotFoundError",
    "LLMRequest", "LLMResponseError", "LLMResult", "LLMTimeoutError", "LLMUnavailableError",
    "api_base_kind", "cache_key", "complete", "concurrency_slot", "import_litellm",
]

CACHE_VERSION = 1
LEGACY_MAX_TOKENS = 8192  # the key of an unset max_tokens: the old default, so old keys hold


# --------------------------------------------------------------------------- records


class LLMRequest(BaseModel):
    """One chat-completion request, as KForge means it (no key, no transport settings).

    These are intents: :mod:`kforge.llm_request` sends each only where the model takes it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agent: str
    role: Role
    model: str
    api_base: str | None = None
    messages: list[dict[str, Any]]
    temperature: float = 0.0
    seed: int | None = 0
    max_tokens: int | None = None  # None: sized for the model (kforge.llm_request)
    response_schema: dict[str, Any] | None = None  # an OpenAI ``json_schema`` response format
    prompt_digest: str = ""  # sha256 of the prompt files the messages were rendered from
    reasoning_effort: str | None = None
    thinking_budget_tokens: int | None = None
    sample: int = 0  # best-of-n: the index of this sample (0: the plain request)

    @classmethod
    def for_agent(
        cls,
        config: AgentConfig,
        *,
        agent: str,
        role: Role,
        messages: list[dict[str, Any]],
        prompt_digest: str,
        response_schema: dict[str, Any] | None = None,
        sample: int = 0,
    ) -> LLMRequest:
        """The request an agent makes; sample ``i > 0`` of best-of-n asks at
        ``sample_temperature`` (where the model takes a temperature) with its own cache key."""
        temperature = config.temperature
        if sample > 0:
            temperature = max(config.temperature, config.sample_temperature)
        return cls(
            agent=agent,
            role=role,
            model=config.model,
            api_base=config.api_base,
            messages=messages,
            temperature=temperature,
            seed=config.seed if sample == 0 or config.seed is None else config.seed + sample,
            max_tokens=config.max_tokens,
            response_schema=response_schema,
            prompt_digest=prompt_digest,
            reasoning_effort=config.reasoning_effort,
            thinking_budget_tokens=config.thinking_budget_tokens,
            sample=sample,
        )


class LLMResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    content: str
    finish_reason: str | None = None
    transcript: Transcript
    transcript_digest: str
    response_digest: str  # the raw response blob, stored before it was parsed
    cache_key: str
    cached: bool  # True when no HTTP request was made
    attempts: int = Field(0, description="HTTP attempts made by the call that paid for it")
    cost_known: bool = True
    incomplete: str | None = None  # "truncated" (hit max_tokens): recorded, never replayed
    sent: dict[str, Any] = Field(default_factory=dict)  # optional parameters actually sent
    notes: list[str] = Field(default_factory=list)  # parameters left out, and why


# --------------------------------------------------------------------------- cache key


def api_base_kind(api_base: str | None) -> str:
    """What an api_base *is*, for the cache key: ``default`` (the provider's own endpoint),
    ``local`` (a server on this machine or a private network, whatever its port), or the
    hosted endpoint's ``host/path``."""
    if not api_base:
        return "default"
    parts = urlsplit(api_base if "://" in api_base else f"http://{api_base}")
    host = (parts.hostname or "").lower()
    if host in ("localhost", "") or host.endswith(".local"):
        return "local"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return f"{host}{parts.path.rstrip('/')}"
    return "local" if (ip.is_loopback or ip.is_private or ip.is_link_local) else str(ip)


def cache_key(request: LLMRequest) -> str:
    parts: dict[str, Any] = {
        "v": CACHE_VERSION,
        "model": request.model,
        "api_base": api_base_kind(request.api_base),
        "messages": request.messages,
        "temperature": request.temperature,
        "seed": request.seed,
        "max_tokens": request.max_tokens if request.max_tokens is not None else LEGACY_MAX_TOKENS,
        "response_schema": request.response_schema,
        "prompt_digest": request.prompt_digest,
    }
    # Settings added later enter the key only when set, so earlier keys (and paid calls) hold.
    for name in ("reasoning_effort", "thinking_budget_tokens"):
        if getattr(request, name) is not None:
            parts[name] = getattr(request, name)
    if request.sample:
        parts["sample"] = request.sample
    return digest_of(parts)


# --------------------------------------------------------------------------- complete


def _content(raw: dict[str, Any]) -> tuple[str | None, str | None]:
    choices = raw.get("choices") or []
    first = (choices[0] or {}) if choices else {}
    content = (first.get("message") or {}).get("content")
    return (content if isinstance(content, str) else None), first.get("finish_reason")


def _incomplete(content: str | None, finish: str | None) -> str | None:
    """Why a stored reply is not an answer to replay: ``empty`` or ``truncated``."""
    if content is None or not content.strip():
        return "empty"
    return "truncated" if finish == "length" else None


def complete(request: LLMRequest, *, store: Store, config: AgentConfig) -> LLMResult:
    """Answer ``request`` from the store if a complete answer was ever paid for, else call the
    model once. An empty reply raises :class:`LLMResponseError`; a truncated one is returned
    with ``incomplete="truncated"``; neither is replayed by a later call.

    Raises an :class:`LLMError` subclass; never returns a partial result silently.
    """
    key = cache_key(request)
    entry = _answer(store, key)
    cached = entry is not None
    if entry is None:
        with concurrency_slot(store.root, request.agent, config.concurrency):
            entry = _answer(store, key)  # another process may have paid while we waited
            cached = entry is not None
            if entry is None:
                entry = _pay(request, store=store, config=config, key=key)
    raw = store.get_json(entry["response"])
    content, finish = _content(raw)
    usage = Usage.model_validate(entry["usage"])
    transcript = Transcript(
        agent=request.agent,
        model=request.model,
        role=request.role,
        messages=request.messages,
        response=content or "",
        usage=usage,
        latency_s=entry["latency_s"],
        litellm_version=entry["litellm_version"],
        request_digest=key,
    )
    if content is None or not content.strip():
        raise LLMResponseError(
            f"{where(config)}: the response holds no message content (choices: "
            f"{len(raw.get('choices') or [])}, finish_reason: {finish}); recorded, and asked "
            f"again on the next run" + (" (raise max_tokens: a reasoning model may have spent "
                                        "them all thinking)" if finish == "length" else ""),
            model=config.model,
            api_base=config.api_base,
        )
    return LLMResult(
        content=content,
        finish_reason=finish,
        transcript=transcript,
        transcript_digest=store.put_json(transcript),
        response_digest=entry["response"],
        cache_key=key,
        cached=cached,
        attempts=entry["attempts"],
        cost_known=entry["cost_known"],
        incomplete=entry.get("incomplete"),
        sent=entry.get("sent", {}),
        notes=entry.get("notes", []),
    )


def _answer(store: Store, key: str) -> dict[str, Any] | None:
    entry = store.action_get(key)
    return None if entry is None or entry.get("incomplete") else entry


def _pay(request: LLMRequest, *, store: Store, config: AgentConfig, key: str) -> dict[str, Any]:
    from kforge.llm_request import default_max_tokens, default_timeout_s, model_caps

    litellm = import_litellm()
    check_budget(store.root, request.agent, config, litellm)
    caps = model_caps(request.model)
    if request.max_tokens is None:
        request = request.model_copy(update={"max_tokens": default_max_tokens(config, caps)})
    paid = call(litellm, request, config, caps, default_timeout_s(config, caps))
    raw = paid.response.model_dump(mode="json")
    response_digest = store.put_bytes(canonical_json(raw))  # stored before anything parses it
    tokens = raw.get("usage") or {}
    usage = Usage(
        prompt_tokens=int(tokens.get("prompt_tokens") or 0),
        completion_tokens=int(tokens.get("completion_tokens") or 0),
    )
    cost = call_cost(litellm, paid.response, config, usage)
    record_spend(store.root, request.agent, model=request.model, cost=cost, key=key)
    usage = usage.model_copy(update={"cost_usd": cost})
    content, finish = _content(raw)
    entry = {
        "response": response_digest,
        "usage": usage.model_dump(mode="json"),
        "cost_known": cost is not None,
        "latency_s": round(paid.seconds, 6),
        "attempts": paid.attempts,
        "litellm_version": litellm_version(),
        "model": request.model,
        "api_base_kind": api_base_kind(request.api_base),
        "sent": paid.sent,
        "notes": paid.notes,
        "incomplete": _incomplete(content, finish),
    }
    store.action_put(key, entry, blobs=[response_digest])
    return entry
