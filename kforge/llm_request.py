"""Provider-correct request parameters: what to send a given model, from litellm's own tables.

An :class:`~kforge.llm.LLMRequest` holds KForge's *intent* (temperature 0, seed 0, a JSON
schema, a reasoning effort). Providers disagree on what they take: Claude refuses ``seed``,
o-series and gpt-5 refuse any temperature but 1 while reasoning, a model without vision
answers 400 to an image part. :func:`build_params` turns the intent into litellm keyword
arguments for one model::

    model_caps(model)  <- litellm.get_supported_openai_params / supports_vision /
                          supports_response_schema / supports_reasoning / get_model_info
    build_params(request, config, caps) -> (kwargs, notes)
        every optional parameter only if the model's table lists it;
        temperature left out while a reasoning model reasons (the provider's default, 1);
        reasoning_effort / thinking budget from the agent config, where supported;
        response_format only where a JSON schema is honoured (else JSON is asked in prompt);
        max_tokens and timeout sized for reasoning when the config leaves them unset;
        finally litellm's own check (get_optional_params): what it still refuses is dropped.

A server that answers 400 naming a parameter (a gateway, a local server) is handled by
:func:`refused_param`: the call is retried without it (``kforge.llm``). litellm is imported
lazily, inside these functions.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from kforge.config import AgentConfig
from kforge.llm_litellm import import_litellm

DEFAULT_MAX_TOKENS = 8192
REASONING_MAX_TOKENS = 32768  # a reasoning model's hidden tokens count against max_tokens
DEFAULT_TIMEOUT_S = 120.0
REASONING_TIMEOUT_S = 600.0  # minutes, not seconds: a reasoning model thinks before writing
# The optional parameters KForge may send, in the order they are given up when refused.
OPTIONAL = ("seed", "response_format", "temperature", "reasoning_effort", "thinking", "n")
# Providers whose reasoning models accept only the default temperature while they reason.
DEFAULT_TEMPERATURE_WHILE_REASONING = frozenset({"openai", "azure", "anthropic", "bedrock"})


@dataclass(frozen=True)
class ModelCaps:
    """What litellm's tables say about one model (``known``: it is in the model map)."""

    model: str
    name: str  # the model's name at its provider (``openai/gpt-4.1`` -> ``gpt-4.1``)
    provider: str
    supported: frozenset[str]
    vision: bool
    response_schema: bool
    reasoning: bool
    known: bool
    max_output_tokens: int | None = None


def _ask(fn: Any, model: str, provider: str | None) -> bool:
    try:
        return bool(fn(model=model, custom_llm_provider=provider))
    except Exception:  # litellm raises bare Exceptions for models it does not map
        return False


@functools.lru_cache(maxsize=256)
def model_caps(model: str) -> ModelCaps:
    """litellm's view of ``model`` (``provider/name``); imports litellm on first use."""
    litellm = import_litellm()
    try:
        name, provider, _, _ = litellm.get_llm_provider(model)
    except Exception:
        name, provider = model, "openai"
    supported = litellm.get_supported_openai_params(model=name, custom_llm_provider=provider)
    try:
        info = litellm.get_model_info(model=model)
        known, max_out = True, info.get("max_output_tokens") or info.get("max_tokens")
    except Exception:
        known, max_out = False, None
    return ModelCaps(
        model=model,
        name=name,
        provider=provider,
        supported=frozenset(supported or ()),
        vision=_ask(litellm.supports_vision, name, provider),
        response_schema=_ask(litellm.supports_response_schema, name, provider),
        reasoning=_ask(litellm.supports_reasoning, name, provider),
        known=known,
        max_output_tokens=int(max_out) if max_out else None,
    )


def reasoning_on(config: AgentConfig, caps: ModelCaps) -> bool:
    """Does the model reason on this request? OpenAI's, DeepSeek's and Gemini's reasoning
    models do by default (unless effort is "none"); Claude when the config asks for it."""
    if not caps.reasoning:
        return False
    if config.reasoning_effort == "none":
        return False
    if config.reasoning_effort is not None or config.thinking_budget_tokens is not None:
        return True
    return caps.provider in ("openai", "azure", "deepseek", "gemini", "vertex_ai")


def default_max_tokens(config: AgentConfig, caps: ModelCaps) -> int:
    if config.max_tokens is not None:
        return config.max_tokens
    wanted = REASONING_MAX_TOKENS if reasoning_on(config, caps) else DEFAULT_MAX_TOKENS
    if config.thinking_budget_tokens is not None:  # the answer needs room after the thinking
        wanted = max(wanted, config.thinking_budget_tokens + DEFAULT_MAX_TOKENS)
    if caps.max_output_tokens:
        wanted = min(wanted, caps.max_output_tokens)
    return wanted


def default_timeout_s(config: AgentConfig, caps: ModelCaps) -> float:
    if config.timeout_s is not None:
        return config.timeout_s
    return REASONING_TIMEOUT_S if reasoning_on(config, caps) else DEFAULT_TIMEOUT_S


def wants_json_schema(config: AgentConfig, caps: ModelCaps) -> bool:
    """Ask for a ``json_schema`` response format? Where the config allows it and the model
    honours it: served from an api_base (vLLM, llama.cpp and ollama's OpenAI-compatible
    servers do; a refusal falls back to JSON in the prompt) or litellm says it does."""
    if not config.response_format or "response_format" not in caps.supported:
        return False
    return bool(config.api_base) or caps.response_schema


def sees_images(config: AgentConfig, caps: ModelCaps) -> bool:
    """Send an image part? The config decides when set; otherwise litellm's supports_vision."""
    return caps.vision if config.supports_images is None else config.supports_images


def build_params(
    request: Any, config: AgentConfig, caps: ModelCaps, *, refused: frozenset[str] = frozenset()
) -> tuple[dict[str, Any], list[str]]:
    """litellm keyword arguments for ``request`` (a :class:`kforge.llm.LLMRequest`) on this
    model, without transport settings (key, timeout, retries), and a note per parameter
    left out and why. ``refused``: parameters a server has already answered 400 to."""
    notes: list[str] = []
    params: dict[str, Any] = {"model": request.model, "messages": request.messages}
    if request.api_base:
        params["api_base"] = request.api_base
    thinking = reasoning_on(config, caps)
    wanted: dict[str, Any] = {"max_tokens": request.max_tokens}
    if thinking and caps.provider in DEFAULT_TEMPERATURE_WHILE_REASONING:
        if request.temperature != 1.0:
            notes.append(f"temperature: left out, {caps.provider} reasoning takes only the default")
    else:
        wanted["temperature"] = request.temperature
    if request.seed is not None:
        wanted["seed"] = request.seed
    if request.response_schema is not None:
        wanted["response_format"] = request.response_schema
    if request.reasoning_effort is not None and request.reasoning_effort != "none":
        wanted["reasoning_effort"] = request.reasoning_effort
    elif request.reasoning_effort == "none" and caps.reasoning:
        wanted["reasoning_effort"] = "none"
    if request.thinking_budget_tokens is not None:
        wanted["thinking"] = {"type": "enabled", "budget_tokens": request.thinking_budget_tokens}
    for name, value in wanted.items():
        if name in refused:
            notes.append(f"{name}: left out, the server refused it")
        elif name != "max_tokens" and name not in caps.supported:
            notes.append(f"{name}: left out, not among {caps.provider}'s supported parameters")
        elif name in ("reasoning_effort", "thinking") and not caps.reasoning and not request.api_base:
            notes.append(f"{name}: left out, litellm does not list {request.model} as reasoning")
        else:
            params[name] = value
    if config.drop_params:
        params["drop_params"] = True
    if config.stream:
        params["stream"] = True
        params["stream_options"] = {"include_usage": True}
    return check_params(params, caps, notes), notes


def check_params(params: dict[str, Any], caps: ModelCaps, notes: list[str]) -> dict[str, Any]:
    """Run litellm's own parameter check (``get_optional_params``, what ``completion`` runs
    before sending) and leave out each parameter it still refuses, one at a time."""
    litellm = import_litellm()
    params = dict(params)
    for _ in range(len(OPTIONAL) + 1):
        try:
            optional_params_check(litellm, params, caps)
            return params
        except litellm.UnsupportedParamsError as err:
            culprit = refused_param(str(err), params)
            if culprit is None:
                raise
            notes.append(f"{culprit}: left out, litellm refuses it for {params['model']}")
            params.pop(culprit)
        except Exception:  # a provider litellm cannot check offline: completion() checks again
            return params
    return params


def optional_params_check(litellm: Any, params: dict[str, Any], caps: ModelCaps) -> dict[str, Any]:
    """litellm's ``get_optional_params`` on the keyword arguments ``completion`` would get."""
    from litellm.utils import get_optional_params

    keys = ("temperature", "seed", "max_tokens", "response_format", "reasoning_effort",
            "thinking", "n", "stream", "stream_options", "drop_params")
    given = {k: params[k] for k in keys if k in params}
    return dict(get_optional_params(model=caps.name, custom_llm_provider=caps.provider, **given))


def refused_param(message: str, params: dict[str, Any]) -> str | None:
    """The optional parameter a refusal names (``"Unsupported parameter: 'seed'"``, "does not
    support parameters: ['seed']", "temperature=0.0 ... Only temperature=1", "response_format
    is not supported"), or None when it names none of those sent."""
    text = message.lower()
    named = [p for p in OPTIONAL if p in params and re.search(rf"\b{p}\b", text)]
    if not named and "json_schema" in text and "response_format" in params:
        named = ["response_format"]
    if not named and "thinking" in text and "thinking" in params:
        named = ["thinking"]
    return named[0] if named else None
