"""Provider-correct requests: the parameters built for each model family, checked against
litellm's support tables and run through litellm's own parameter check; a server refusing a
parameter with 400; streaming. No hosted model is called: building a request is offline."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kforge.agents.llm_agent import LLMAgent, recommendation_response_format
from kforge.config import AgentConfig
from kforge.llm import LLMRequest, complete
from kforge.llm_request import (
    REASONING_MAX_TOKENS,
    build_params,
    default_max_tokens,
    default_timeout_s,
    model_caps,
    optional_params_check,
    refused_param,
    sees_images,
    wants_json_schema,
)
from kforge.llm_transport import import_litellm
from kforge.store import Store

from .helpers import GOOD_KERNEL, agent_config, analysis_request, fenced, generation_request
from .server import Received, Reply, ScriptedServer, fail, ok

LOCAL = "http://127.0.0.1:8000/v1"
# (family, config overrides, parameters that must be sent, parameters that must not)
MATRIX: list[tuple[str, dict[str, Any], set[str], set[str]]] = [
    ("openai-gpt", {"model": "openai/gpt-4.1"}, {"temperature", "seed", "response_format"}, set()),
    ("openai-o", {"model": "openai/o3", "reasoning_effort": "high"},
     {"reasoning_effort", "seed"}, {"temperature"}),
    ("openai-gpt5", {"model": "gpt-5"}, {"seed"}, {"temperature", "reasoning_effort"}),
    ("anthropic", {"model": "anthropic/claude-sonnet-4-5-20250929"},
     {"temperature", "response_format"}, {"seed", "thinking"}),
    ("anthropic-thinking",
     {"model": "anthropic/claude-sonnet-4-5-20250929", "thinking_budget_tokens": 8000},
     {"thinking"}, {"seed", "temperature"}),
    ("gemini", {"model": "gemini/gemini-2.5-pro", "reasoning_effort": "low"},
     {"temperature", "seed", "reasoning_effort"}, set()),
    ("deepseek", {"model": "deepseek/deepseek-chat"}, {"temperature", "seed"}, set()),
    ("deepseek-reasoner", {"model": "deepseek/deepseek-reasoner"}, {"seed"}, set()),
    ("mistral", {"model": "mistral/mistral-large-latest"}, {"temperature", "seed"}, set()),
    ("vllm", {"model": "hosted_vllm/Qwen/Qwen2.5-Coder-32B-Instruct", "api_base": LOCAL},
     {"temperature", "seed", "response_format"}, {"reasoning_effort"}),
    ("ollama", {"model": "ollama_chat/qwen2.5-coder:32b", "api_base": "http://127.0.0.1:11434"},
     {"temperature", "seed", "response_format"}, set()),
]
ALWAYS = {"model", "messages", "api_base", "max_tokens"}


def config_for(**overrides: Any) -> AgentConfig:
    return AgentConfig.model_validate({"kind": "litellm", **overrides})


def built(config: AgentConfig) -> tuple[dict[str, Any], list[str]]:
    caps = model_caps(config.model)
    schema = recommendation_response_format() if wants_json_schema(config, caps) else None
    request = LLMRequest.for_agent(
        config, agent="a", role="analyze", messages=[{"role": "user", "content": "hi"}],
        prompt_digest="p", response_schema=schema,
    )
    request = request.model_copy(update={"max_tokens": default_max_tokens(config, caps)})
    return build_params(request, config, caps)


@pytest.mark.parametrize(("family", "overrides", "sent", "left_out"), MATRIX, ids=[m[0] for m in MATRIX])
def test_each_family_gets_only_what_its_table_supports(
    family: str, overrides: dict[str, Any], sent: set[str], left_out: set[str]
) -> None:
    config = config_for(**overrides)
    caps = model_caps(config.model)
    params, notes = built(config)
    for name in set(params) - ALWAYS:
        assert name in caps.supported, f"{family}: {name} is not in litellm's supported params"
    assert sent <= set(params), f"{family}: missing {sent - set(params)} ({notes})"
    assert not (left_out & set(params)), f"{family}: sent {left_out & set(params)}"
    # litellm's own check, the one completion() runs before anything is sent, accepts it
    optional_params_check(import_litellm(), params, caps)
    if "thinking" in params:
        assert params["max_tokens"] > params["thinking"]["budget_tokens"]
    assert ("response_format" in params) == wants_json_schema(config, caps)


def test_the_old_fixed_request_is_refused_where_the_new_one_is_not() -> None:
    """temperature=0 + seed=0 for everyone: what litellm refuses before sending anything."""
    litellm = import_litellm()
    for model in ("openai/o3", "anthropic/claude-sonnet-4-5-20250929", "gpt-5"):
        caps = model_caps(model)
        naive = {"model": model, "temperature": 0.0, "seed": 0, "max_tokens": 8192}
        with pytest.raises(litellm.UnsupportedParamsError):
            optional_params_check(litellm, naive, caps)
        params, notes = built(config_for(model=model))
        optional_params_check(litellm, params, caps)
        assert notes  # and says what it left out


def test_reasoning_models_get_room_and_time() -> None:
    o3, gpt = config_for(model="openai/o3"), config_for(model="openai/gpt-4.1")
    assert default_max_tokens(o3, model_caps(o3.model)) == REASONING_MAX_TOKENS
    assert default_max_tokens(gpt, model_caps(gpt.model)) == 8192
    assert default_timeout_s(o3, model_caps(o3.model)) >= 600
    assert default_timeout_s(gpt, model_caps(gpt.model)) == 120
    fixed = config_for(model="openai/o3", max_tokens=4000, timeout_s=30)
    assert default_max_tokens(fixed, model_caps(fixed.model)) == 4000
    assert default_timeout_s(fixed, model_caps(fixed.model)) == 30


def test_images_follow_supports_vision_unless_set() -> None:
    assert sees_images(config_for(model="openai/gpt-4.1"), model_caps("openai/gpt-4.1"))
    assert not sees_images(config_for(model="deepseek/deepseek-chat"), model_caps("deepseek/deepseek-chat"))
    forced = config_for(model="deepseek/deepseek-chat", supports_images=True)
    assert sees_images(forced, model_caps(forced.model))


def test_config_validation_of_reasoning_keys() -> None:
    with pytest.raises(ValueError, match="thinking_budget_tokens"):
        config_for(model="anthropic/x", thinking_budget_tokens=8000, max_tokens=4000)
    with pytest.raises(ValueError, match="not both"):
        config_for(model="anthropic/x", thinking_budget_tokens=2048, reasoning_effort="low")
    with pytest.raises(ValueError):
        config_for(model="openai/o3", reasoning_effort="extreme")


def test_refused_param_reads_the_usual_wordings() -> None:
    params = {"seed": 0, "temperature": 0.0, "response_format": {}}
    assert refused_param("Unsupported parameter: 'seed' is not supported with this model.", params) == "seed"
    assert refused_param("anthropic does not support parameters: ['seed']", params) == "seed"
    assert refused_param("O-series models don't support temperature=0.0.", params) == "temperature"
    assert refused_param("json_schema response format is not supported", params) == "response_format"
    assert refused_param("model not found", params) is None


def _refuse(name: str, message: str) -> Any:
    """A provider that answers 400 to any request carrying ``name``."""

    def responder(received: Received) -> Reply:
        if name in received.body:
            return fail(400, message, "unsupported_parameter")
        if "performance analyst" in received.user_text:
            return ok(json.dumps({"bottleneck": "memory", "summary": "ok"}))
        return ok(fenced(GOOD_KERNEL))

    return responder


def test_a_400_on_an_unsupported_parameter_is_retried_without_it(store: Store) -> None:
    with ScriptedServer(responder=_refuse("seed", "Unsupported parameter: 'seed' is not supported with this model.")) as srv:
        result = LLMAgent("llm", agent_config(srv, num_retries=0), store).generate(generation_request())
        assert result.source == GOOD_KERNEL
        assert "seed" in srv.received[0].body and "seed" not in srv.received[1].body
        assert len(srv.received) == 2
        assert any("seed" in note for note in result.plan["llm"]["left_out"])


def test_a_refused_json_schema_falls_back_to_json_in_the_prompt(store: Store) -> None:
    message = "response_format json_schema is not supported by this server"
    with ScriptedServer(responder=_refuse("response_format", message)) as srv:
        llm = LLMAgent("llm", agent_config(srv, num_retries=0, samples=1), store)
        result = llm.analyze(analysis_request())
        assert result.recommendation.bottleneck == "memory" and result.transcript.error is None
        assert "response_format" in srv.received[0].body
        assert "response_format" not in srv.received[1].body
        assert "Reply with only a JSON object" in srv.received[1].user_text


def test_a_streamed_reply_is_assembled_with_its_usage(server: ScriptedServer, store: Store) -> None:
    server.script(ok(fenced(GOOD_KERNEL), prompt_tokens=300, completion_tokens=90))
    config = agent_config(server, stream=True)
    request = LLMRequest.for_agent(config, agent="llm", role="generate",
                                   messages=[{"role": "user", "content": "go"}], prompt_digest="p")
    result = complete(request, store=store, config=config)
    assert server.received[0].body["stream"] is True
    assert result.content == fenced(GOOD_KERNEL) and result.finish_reason == "stop"
    assert (result.transcript.usage.prompt_tokens, result.transcript.usage.completion_tokens) == (300, 90)
