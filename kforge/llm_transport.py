"""One paid model call over litellm: key, concurrency slot, retries, typed errors, streaming.

:func:`call` POSTs the parameters :mod:`kforge.llm_request` built::

    litellm.completion (timeout, num_retries=0: retries are ours)
        408/409/429/5xx/timeout/connection error: back off (Retry-After honoured), retry
        400 naming an optional parameter ("Unsupported parameter: 'seed'"): retry without it
        400/401/403/404, context window: typed error at once (kforge.llm_errors)

litellm costs ~4-8 s and 200 MB to import: it is imported only inside a call (:mod:`kforge.llm_litellm`).
"""

from __future__ import annotations

import fcntl
import os
import random
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kforge.config import AgentConfig
from kforge.llm_errors import (
    LLMAuthError,
    LLMBadRequestError,
    LLMContextWindowError,
    LLMError,
    LLMNotFoundError,
    LLMTimeoutError,
    LLMUnavailableError,
)

# re-exported: callers (kforge.llm, tests) import them from here
from kforge.llm_litellm import import_litellm as import_litellm
from kforge.llm_litellm import litellm_version as litellm_version
from kforge.llm_request import OPTIONAL, ModelCaps, build_params, refused_param

BACKOFF_BASE_S = 1.0  # first retry waits about this long, doubling each time
BACKOFF_CAP_S = 30.0  # and never longer than this, whatever a Retry-After header asks
SLOT_POLL_S = 0.05
# How servers litellm does not map say "too long": vLLM, llama.cpp, OpenAI's error code.
_CONTEXT = re.compile(
    r"context.length|context.window|context.size|maximum context|exceed_context|prompt is too long",
    re.IGNORECASE,
)
LOCAL_DUMMY_KEY = "sk-kforge-local"  # OpenAI clients insist on a key; local servers ignore it

# Parameters a server refused with a 400, per (model, api_base), remembered for the process.
_refused: dict[tuple[str, str | None], set[str]] = {}
_refused_lock = threading.Lock()


def where(config: AgentConfig) -> str:
    return f"model {config.model!r} at {config.api_base or 'the provider default endpoint'}"


def api_key(config: AgentConfig) -> str | None:
    if config.api_key_env:
        key = os.environ.get(config.api_key_env)
        if not key:
            raise LLMAuthError(
                f"{where(config)}: the environment variable {config.api_key_env} named by "
                f"api_key_env is not set; export it with the API key, or remove api_key_env",
                model=config.model,
                api_base=config.api_base,
            )
        return key
    return LOCAL_DUMMY_KEY if config.api_base else None  # None: litellm reads provider vars


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


# --------------------------------------------------------------------------- retries


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


def backoff(attempt: int, exc: BaseException) -> float:
    asked = _retry_after(exc)
    if asked is not None:
        return min(asked, BACKOFF_CAP_S)
    return min(BACKOFF_BASE_S * float(2**attempt), BACKOFF_CAP_S) * random.uniform(0.75, 1.0)


def classify(litellm: Any, exc: BaseException, config: AgentConfig) -> LLMError | None:
    """A typed error for a litellm/OpenAI exception, or None when it is worth retrying."""
    status = getattr(exc, "status_code", None)
    detail = " ".join(str(exc).split())[:600]
    kw: dict[str, Any] = {"model": config.model, "api_base": config.api_base}
    if isinstance(exc, litellm.ContextWindowExceededError) or (
        status in (400, 413, 422) and _CONTEXT.search(f"{detail} {getattr(exc, 'code', '')}")
    ):
        return LLMContextWindowError(
            f"{where(config)}: the prompt exceeds the model's context window ({detail}); shorten "
            f"the problem or the feedback, raise the server's context length, or pick a larger "
            f"model",
            **kw,
        )
    if isinstance(exc, litellm.Timeout | litellm.APIConnectionError) or status is None:
        return None
    if status in (408, 409, 429) or status >= 500:
        return None
    if status in (401, 403):
        key = f"${config.api_key_env}" if config.api_key_env else "the provider's key variable"
        return LLMAuthError(f"{where(config)}: refused ({status}): {detail}; check the key in {key}", **kw)
    if status == 404:
        return LLMNotFoundError(
            f"{where(config)}: not found (404): {detail}; check the model name and api_base (an "
            f"OpenAI-compatible server wants model 'openai/<served name>' and an api_base "
            f"ending in /v1)",
            **kw,
        )
    return LLMBadRequestError(f"{where(config)}: request refused ({status}): {detail}", **kw)


# --------------------------------------------------------------------------- the call


@dataclass
class Paid:
    """What one paid call returned: the response, and how it went."""

    response: Any
    attempts: int
    seconds: float
    sent: dict[str, Any]  # the optional parameters actually sent
    notes: list[str] = field(default_factory=list)  # parameters left out, and why


def _completion(litellm: Any, kwargs: dict[str, Any]) -> Any:
    response = litellm.completion(**kwargs)
    if not kwargs.get("stream"):
        return response
    chunks = list(response)  # a read timeout applies between chunks, not to the whole answer
    return litellm.stream_chunk_builder(chunks, messages=kwargs["messages"])


def call(litellm: Any, request: Any, config: AgentConfig, caps: ModelCaps, timeout_s: float) -> Paid:
    """POST ``request`` (a :class:`kforge.llm.LLMRequest`), retrying transient failures and
    leaving out a parameter the server refused; raises a typed :class:`LLMError`."""
    memo = (request.model, request.api_base)
    with _refused_lock:
        refused = set(_refused.get(memo, set()))
    attempts = config.num_retries + 1
    start = time.monotonic()
    attempt = 0
    notes: list[str] = []
    while True:
        params, notes = build_params(request, config, caps, refused=frozenset(refused))
        kwargs = {
            **params,
            "timeout": timeout_s,
            "num_retries": 0,  # retries are ours: bounded, typed, counted
            "max_retries": 0,  # and the OpenAI client's own retries are off
            "api_key": api_key(config),
        }
        try:
            response = _completion(litellm, kwargs)
            sent = {k: params[k] for k in (*OPTIONAL, "max_tokens", "stream") if k in params}
            return Paid(response, attempt + 1, time.monotonic() - start, sent, notes)
        except Exception as exc:
            if not isinstance(exc, _openai_error()):
                raise
            typed = classify(litellm, exc, config)
            if isinstance(typed, LLMBadRequestError):
                culprit = refused_param(str(exc), params)
                if culprit is not None and culprit not in refused:
                    refused.add(culprit)  # a 400 costs nothing: retry at once, without it
                    with _refused_lock:
                        _refused.setdefault(memo, set()).add(culprit)
                    continue
            if typed is not None:
                raise typed from exc
            attempt += 1
            if attempt == attempts:
                elapsed = time.monotonic() - start
                detail = " ".join(str(exc).split())[:600]
                cls = LLMTimeoutError if isinstance(exc, litellm.Timeout) else LLMUnavailableError
                raise cls(
                    f"{where(config)}: gave up after {attempts} attempts in {elapsed:.1f} s "
                    f"(last: {detail}); the service is down, slow or rate-limiting: rerun "
                    f"later, raise timeout_s/num_retries, or lower concurrency",
                    model=config.model,
                    api_base=config.api_base,
                ) from exc
            time.sleep(backoff(attempt - 1, exc))


def _openai_error() -> type[BaseException]:
    import openai  # litellm's own dependency: every litellm API exception derives from this

    return openai.OpenAIError
