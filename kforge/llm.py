"""The one seam between KForge and language models: ``complete(request, store=, config=)``.

Every LLM call in KForge goes through :func:`complete`, which adds what litellm does not::

    LLMRequest ──cache_key──> store action cache ──hit──> stored raw response ──> LLMResult
                                   │ miss
                                   v
              concurrency slot (file locks under <store>/locks/llm/<agent>/, across processes)
                                   │
              litellm.completion, retried on 408/429/5xx/connection errors with backoff
                                   │
              raw response stored as a blob, cache entry written ──> parsed ──> LLMResult
                                                                    (Transcript stored too)

The cache key is the canonical request (model, kind of api_base, messages, temperature, seed,
max_tokens, response schema, prompt digest), never the API key, so the same request is never
paid twice, even when the previous run crashed while parsing the reply.

Errors are typed and say what to do next::

    LLMError                      (base; .model, .api_base)
    ├── LLMConfigError            a setting is wrong; fix the config, retrying will not help
    │   ├── LLMAuthError          401/403, or the API-key variable is unset
    │   ├── LLMNotFoundError      404: model name or api_base
    │   └── LLMBadRequestError    400 and other 4xx the server refused
    ├── LLMContextWindowError     the prompt does not fit the model (deterministic per request)
    ├── LLMUnavailableError       408/429/5xx/connection errors left after every retry
    │   └── LLMTimeoutError       every attempt timed out
    └── LLMResponseError          the server answered, but with no message to read

litellm costs ~4-8 s and 200 MB to import: it is imported only inside a call.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import random
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from kforge.config import AgentConfig
from kforge.llm_errors import (  # re-exported: callers catch them from kforge.llm
    LLMAuthError,
    LLMBadRequestError,
    LLMContextWindowError,
    LLMError,
    LLMNotFoundError,
    LLMResponseError,
    LLMTimeoutError,
    LLMUnavailableError,
)
from kforge.schema import Role, Transcript, Usage
from kforge.store import Store, canonical_json, digest_of

CACHE_VERSION = 1
BACKOFF_BASE_S = 1.0  # first retry waits about this long, doubling each time
BACKOFF_CAP_S = 30.0  # and never longer than this, whatever a Retry-After header asks
SLOT_POLL_S = 0.05
# How servers litellm does not map say "too long": vLLM, llama.cpp, OpenAI's error code.
_CONTEXT = re.compile(
    r"context.length|context.window|context.size|maximum context|exceed_context|prompt is too long",
    re.IGNORECASE,
)
LOCAL_DUMMY_KEY = "sk-kforge-local"  # OpenAI clients insist on a key; local servers ignore it


# --------------------------------------------------------------------------- records


class LLMRequest(BaseModel):
    """One chat-completion request, as KForge means it (no key, no transport settings)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agent: str
    role: Role
    model: str
    api_base: str | None = None
    messages: list[dict[str, Any]]
    temperature: float = 0.0
    seed: int | None = 0
    max_tokens: int = 8192
    response_schema: dict[str, Any] | None = None  # an OpenAI ``json_schema`` response format
    prompt_digest: str = ""  # sha256 of the prompt files the messages were rendered from

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
    ) -> LLMRequest:
        return cls(
            agent=agent,
            role=role,
            model=config.model,
            api_base=config.api_base,
            messages=messages,
            temperature=config.temperature,
            seed=config.seed,
            max_tokens=config.max_tokens,
            response_schema=response_schema,
            prompt_digest=prompt_digest,
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
    return digest_of(
        {
            "v": CACHE_VERSION,
            "model": request.model,
            "api_base": api_base_kind(request.api_base),
            "messages": request.messages,
            "temperature": request.temperature,
            "seed": request.seed,
            "max_tokens": request.max_tokens,
            "response_schema": request.response_schema,
            "prompt_digest": request.prompt_digest,
        }
    )


# --------------------------------------------------------------------------- concurrency


def _slot_folder(root: Path, name: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "_"
    return root / "locks" / "llm" / safe


@contextmanager
def concurrency_slot(root: Path, name: str, slots: int) -> Iterator[int]:
    """Hold one of ``slots`` file locks under ``root``: at most ``slots`` holders at once across
    every process and thread using the same root and name. Yields the slot index."""
    folder = _slot_folder(root, name)
    folder.mkdir(parents=True, exist_ok=True)
    while True:
        for index in range(max(1, slots)):
            fd = os.open(folder / f"slot-{index}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield index
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            return
        time.sleep(SLOT_POLL_S)


# --------------------------------------------------------------------------- litellm


_registered: dict[str, tuple[float, float]] = {}
_register_lock = threading.Lock()


def import_litellm() -> Any:
    """litellm, imported on first use with the offline price table (never at module top)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    litellm.telemetry = False
    return litellm


def _openai_error() -> type[BaseException]:
    import openai  # litellm's own dependency: every litellm API exception derives from this

    return openai.OpenAIError


def litellm_version() -> str:
    from importlib.metadata import version

    return version("litellm")


def _where(config: AgentConfig) -> str:
    return f"model {config.model!r} at {config.api_base or 'the provider default endpoint'}"


def _api_key(config: AgentConfig) -> str | None:
    if config.api_key_env:
        key = os.environ.get(config.api_key_env)
        if not key:
            raise LLMAuthError(
                f"{_where(config)}: the environment variable {config.api_key_env} named by "
                f"api_key_env is not set; export it with the API key, or remove api_key_env",
                model=config.model,
                api_base=config.api_base,
            )
        return key
    return LOCAL_DUMMY_KEY if config.api_base else None  # None: litellm reads provider vars


def _register_price(litellm: Any, config: AgentConfig) -> None:
    """Make litellm price the model from the config override (0.0 for local models)."""
    if config.input_cost_per_token is None and config.output_cost_per_token is None:
        return
    price = (config.input_cost_per_token or 0.0, config.output_cost_per_token or 0.0)
    with _register_lock:
        if _registered.get(config.model) == price:
            return
        provider = config.model.split("/", 1)[0] if "/" in config.model else "openai"
        litellm.register_model(
            {
                config.model: {
                    "input_cost_per_token": price[0],
                    "output_cost_per_token": price[1],
                    "litellm_provider": provider,
                    "mode": "chat",
                }
            }
        )
        _registered[config.model] = price


def _cost(litellm: Any, response: Any, config: AgentConfig, usage: Usage) -> tuple[float, bool]:
    if config.input_cost_per_token is not None or config.output_cost_per_token is not None:
        return (
            usage.prompt_tokens * (config.input_cost_per_token or 0.0)
            + usage.completion_tokens * (config.output_cost_per_token or 0.0),
            True,
        )
    try:
        cost = litellm.completion_cost(completion_response=response, model=config.model)
    except Exception:  # litellm raises bare Exceptions for unmapped models
        return 0.0, False
    return (float(cost), True) if cost is not None else (0.0, False)


def _retry_after(exc: BaseException) -> float | None:
    headers = getattr(exc, "litellm_response_headers", None)
    if headers is None:
        headers = getattr(getattr(exc, "response", None), "headers", None)
    if not headers:
        return None
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(0.0, float(value) * scale)
        except ValueError:
            return None
    return None


def _backoff(attempt: int, exc: BaseException) -> float:
    asked = _retry_after(exc)
    if asked is not None:
        return min(asked, BACKOFF_CAP_S)
    return min(BACKOFF_BASE_S * float(2**attempt), BACKOFF_CAP_S) * random.uniform(0.75, 1.0)


def _classify(litellm: Any, exc: BaseException, config: AgentConfig) -> LLMError | None:
    """A typed error for a litellm/OpenAI exception, or None when it is worth retrying."""
    status = getattr(exc, "status_code", None)
    detail = " ".join(str(exc).split())[:600]
    where = _where(config)
    kw: dict[str, Any] = {"model": config.model, "api_base": config.api_base}
    if isinstance(exc, litellm.ContextWindowExceededError) or (
        status in (400, 413, 422) and _CONTEXT.search(f"{detail} {getattr(exc, 'code', '')}")
    ):
        return LLMContextWindowError(
            f"{where}: the prompt exceeds the model's context window ({detail}); shorten the "
            f"problem or the feedback, raise the server's context length, or pick a larger model",
            **kw,
        )
    if isinstance(exc, litellm.Timeout | litellm.APIConnectionError) or status is None:
        return None
    if status in (408, 409, 429) or status >= 500:
        return None
    if status in (401, 403):
        key = f"${config.api_key_env}" if config.api_key_env else "the provider's key variable"
        return LLMAuthError(f"{where}: refused ({status}): {detail}; check the key in {key}", **kw)
    if status == 404:
        return LLMNotFoundError(
            f"{where}: not found (404): {detail}; check the model name and api_base (an "
            f"OpenAI-compatible server wants model 'openai/<served name>' and an api_base "
            f"ending in /v1)",
            **kw,
        )
    return LLMBadRequestError(f"{where}: request refused ({status}): {detail}", **kw)


def _call(litellm: Any, request: LLMRequest, config: AgentConfig) -> tuple[Any, int, float]:
    """POST the request, retrying transient failures; returns (response, attempts, seconds)."""
    kwargs: dict[str, Any] = {
        "model": request.model,
        "messages": request.messages,
        "temperature": request.temperature,
        "max_tokens": request.max_tokens,
        "timeout": config.timeout_s,
        "num_retries": 0,  # retries are ours: bounded, typed, counted
        "max_retries": 0,  # and the OpenAI client's own retries are off
        "api_key": _api_key(config),
    }
    if request.api_base:
        kwargs["api_base"] = request.api_base
    if request.seed is not None:
        kwargs["seed"] = request.seed
    if request.response_schema is not None:
        kwargs["response_format"] = request.response_schema
    attempts = config.num_retries + 1
    start = time.monotonic()
    for attempt in range(attempts):
        try:
            response = litellm.completion(**kwargs)
            return response, attempt + 1, time.monotonic() - start
        except Exception as exc:
            if not isinstance(exc, _openai_error()):
                raise
            typed = _classify(litellm, exc, config)
            if typed is not None:
                raise typed from exc
            if attempt + 1 == attempts:
                elapsed = time.monotonic() - start
                detail = " ".join(str(exc).split())[:600]
                cls = LLMTimeoutError if isinstance(exc, litellm.Timeout) else LLMUnavailableError
                raise cls(
                    f"{_where(config)}: gave up after {attempts} attempts in {elapsed:.1f} s "
                    f"(last: {detail}); the service is down, slow or rate-limiting: rerun "
                    f"later, raise timeout_s/num_retries, or lower concurrency",
                    model=config.model,
                    api_base=config.api_base,
                ) from exc
            time.sleep(_backoff(attempt, exc))
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------- complete


def _content(raw: dict[str, Any], config: AgentConfig) -> tuple[str, str | None]:
    choices = raw.get("choices") or []
    message = (choices[0] or {}).get("message") or {} if choices else {}
    content = message.get("content")
    if not isinstance(content, str):
        raise LLMResponseError(
            f"{_where(config)}: the response holds no message content (choices: {len(choices)}, "
            f"finish_reason: {choices[0].get('finish_reason') if choices else None})",
            model=config.model,
            api_base=config.api_base,
        )
    return content, choices[0].get("finish_reason")


def complete(request: LLMRequest, *, store: Store, config: AgentConfig) -> LLMResult:
    """Answer ``request`` from the store if it was ever paid for, else call the model once.

    Raises an :class:`LLMError` subclass; never returns a partial result.
    """
    key = cache_key(request)
    entry = store.action_get(key)
    cached = entry is not None
    if entry is None:
        with concurrency_slot(store.root, request.agent, config.concurrency):
            entry = store.action_get(key)  # another process may have paid while we waited
            cached = entry is not None
            if entry is None:
                entry = _pay(request, store=store, config=config, key=key)
    raw = store.get_json(entry["response"])
    content, finish = _content(raw, config)
    usage = Usage.model_validate(entry["usage"])
    transcript = Transcript(
        agent=request.agent,
        model=request.model,
        role=request.role,
        messages=request.messages,
        response=content,
        usage=usage,
        latency_s=entry["latency_s"],
        litellm_version=entry["litellm_version"],
        request_digest=key,
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
    )


def _pay(request: LLMRequest, *, store: Store, config: AgentConfig, key: str) -> dict[str, Any]:
    litellm = import_litellm()
    _register_price(litellm, config)
    response, attempts, seconds = _call(litellm, request, config)
    raw = response.model_dump(mode="json")
    response_digest = store.put_bytes(canonical_json(raw))  # stored before anything parses it
    tokens = raw.get("usage") or {}
    usage = Usage(
        prompt_tokens=int(tokens.get("prompt_tokens") or 0),
        completion_tokens=int(tokens.get("completion_tokens") or 0),
    )
    cost, known = _cost(litellm, response, config, usage)
    usage = usage.model_copy(update={"cost_usd": cost})
    entry = {
        "response": response_digest,
        "usage": usage.model_dump(mode="json"),
        "cost_known": known,
        "latency_s": round(seconds, 6),
        "attempts": attempts,
        "litellm_version": litellm_version(),
        "model": request.model,
        "api_base_kind": api_base_kind(request.api_base),
    }
    store.action_put(key, entry, blobs=[response_digest])
    return entry
