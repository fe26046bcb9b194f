"""LLMAgent over real HTTP: generation, repair from feedback, analysis, recorded failures."""

from __future__ import annotations

import base64
import json

import pytest

from kforge.agents.llm_agent import LLMAgent, parse_recommendation, recommendation_response_format
from kforge.llm import LLMAuthError
from kforge.schema import Action, Recommendation, Transcript
from kforge.store import Store

from .helpers import (
    BROKEN_KERNEL,
    GOOD_KERNEL,
    agent_config,
    analysis_request,
    feedback,
    fenced,
    generation_request,
)
from .server import ScriptedServer, fail, ok

COMPILE_ERROR = (
    'Traceback (most recent call last):\n  File "/tmp/kf-123/candidate.py", line 9\n'
    "    relu_kernel(x, out\n               ^\nSyntaxError: '(' was never closed"
)

RECOMMENDATION = {
    "bottleneck": "memory",
    "evidence": {"achieved_gbps": 0.04, "peak_gbps": 20.0},
    "actions": [
        {
            "kind": "vectorize",
            "params": {"width": 8},
            "expected_gain": 1.7,
            "rationale": "the loop is scalar; use AVX2 loads",
        }
    ],
    "summary": "Scalar loads leave bandwidth unused.",
}


def agent(srv: ScriptedServer, store: Store, **overrides: object) -> LLMAgent:
    return LLMAgent("llm", agent_config(srv, **overrides), store)


def test_a_good_kernel(server: ScriptedServer, store: Store) -> None:
    server.script(ok(fenced(GOOD_KERNEL)))
    result = agent(server, store).generate(generation_request())
    assert result.source == GOOD_KERNEL and result.extraction == "ok"
    assert result.transcript.role == "generate" and result.transcript.error is None
    prompt = server.received[0].user_text
    assert "class Model(nn.Module)" in prompt  # the problem
    assert "Write C++ and call it through ctypes." in prompt  # the platform's one-shot example
    assert "atol = rtol = 0.0001" in prompt  # the policy
    assert result.plan["llm"]["request"] == result.transcript.request_digest
    assert Transcript.model_validate(store.get_json(store.put_json(result.transcript)))


def test_a_broken_kernel_then_its_fix_carries_the_compile_error(
    server: ScriptedServer, store: Store
) -> None:
    server.script(ok(fenced(BROKEN_KERNEL)), ok(fenced(GOOD_KERNEL)))
    llm = agent(server, store)
    first = llm.generate(generation_request())
    assert first.source == BROKEN_KERNEL
    second = llm.generate(
        generation_request(
            round=1,
            previous_source=first.source,
            previous_plan=first.plan,
            feedback=[feedback(COMPILE_ERROR, reason="syntax_error")],
        )
    )
    assert second.source == GOOD_KERNEL
    prompt = server.received[1].user_text
    assert "SyntaxError: '(' was never closed" in prompt and "syntax_error" in prompt
    assert 'File "candidate.py", line 9' in prompt and "/tmp/kf-123" not in prompt
    assert "relu_kernel(x, out\n" in prompt  # the previous candidate is shown too
    assert "SyntaxError" not in server.received[0].user_text


def test_feedback_is_truncated_and_scrubbed_of_external_paths(
    server: ScriptedServer, store: Store
) -> None:
    noise = "\n".join(f"warning {i}: something long " * 3 for i in range(400))
    detail = (
        'File "/usr/lib/python3.11/site-packages/torch/nn/functional.py", line 3, in relu\n'
        "    secret_library_line = 1\n" + noise
    )
    server.script(ok(fenced(GOOD_KERNEL)))
    agent(server, store).generate(
        generation_request(round=1, feedback=[feedback(detail, stage="verify")])
    )
    prompt = server.received[0].user_text
    assert "characters cut" in prompt and "secret_library_line" not in prompt
    assert "/usr/lib" not in prompt and "<external>/nn/functional.py" in prompt


def test_recommendations_reach_the_next_generation_prompt(
    server: ScriptedServer, store: Store
) -> None:
    server.script(ok(json.dumps(RECOMMENDATION)), ok(fenced(GOOD_KERNEL)))
    llm = agent(server, store)
    analysis = llm.analyze(analysis_request())
    assert analysis.recommendation == Recommendation.model_validate(RECOMMENDATION)
    assert analysis.transcript.role == "analyze" and analysis.transcript.error is None
    llm.generate(
        generation_request(
            round=2, previous_source=GOOD_KERNEL, recommendation=analysis.recommendation
        )
    )
    prompt = server.received[1].user_text
    assert "Bottleneck: memory" in prompt and "the loop is scalar; use AVX2 loads" in prompt
    assert "vectorize {'width': 8}" in prompt


def test_a_transfer_kernel_is_shown_when_the_request_carries_one(
    server: ScriptedServer, store: Store
) -> None:
    server.script(ok(fenced(GOOD_KERNEL)))
    request = generation_request(
        transfer_source="# verified triton kernel\n", transfer_platform="triton"
    )
    agent(server, store).generate(request)
    assert "# verified triton kernel" in server.received[0].user_text
    assert "`triton`" in server.received[0].user_text


def test_analysis_asks_for_the_schema_when_served_from_an_api_base(
    server: ScriptedServer, store: Store
) -> None:
    server.script(ok(json.dumps(RECOMMENDATION)))
    agent(server, store).analyze(analysis_request())
    body = server.received[0].body
    assert body["response_format"]["type"] == "json_schema"
    assert (
        body["response_format"]["json_schema"]["schema"]
        == recommendation_response_format()["json_schema"]["schema"]
    )


def test_analysis_without_response_format_parses_json_from_text(
    server: ScriptedServer, store: Store
) -> None:
    reply = "Here is my analysis:\n```json\n" + json.dumps(RECOMMENDATION) + "\n```\nGood luck."
    server.script(ok(reply))
    result = agent(server, store, response_format=False).analyze(analysis_request())
    assert "response_format" not in server.received[0].body
    assert result.recommendation.actions[0] == Action.model_validate(RECOMMENDATION["actions"][0])


@pytest.mark.parametrize(
    "reply",
    [
        '{"bottleneck": "memory", "actions": [',  # cut-off JSON
        "I think it is memory bound.",  # no JSON at all
    ],
)
def test_malformed_analysis_is_reasked_once_then_a_recorded_failure(
    server: ScriptedServer, store: Store, reply: str
) -> None:
    server.script(ok(reply), ok(reply))
    result = agent(server, store).analyze(analysis_request())
    assert result.recommendation.bottleneck == "unknown" and result.recommendation.actions == []
    assert result.transcript.error and result.transcript.response == reply
    assert store.has(store.put_json(result.transcript))
    assert len(server.received) == 2  # one bounded re-ask, carrying the parse error
    reask = server.received[1].body["messages"]
    assert reask[-2] == {"role": "assistant", "content": reply}
    assert "could not be used" in reask[-1]["content"] and result.transcript.error in reask[-1]["content"]
    assert result.transcript.usage.prompt_tokens == 240  # both calls counted


def test_a_reask_repairs_a_malformed_analysis(server: ScriptedServer, store: Store) -> None:
    server.script(ok("Memory bound, I think."), ok(json.dumps(RECOMMENDATION)))
    result = agent(server, store).analyze(analysis_request())
    assert result.recommendation == Recommendation.model_validate(RECOMMENDATION)
    assert result.transcript.error is None and len(server.received) == 2


def test_an_image_part_is_sent_when_the_model_sees_images(
    server: ScriptedServer, store: Store
) -> None:
    server.script(ok(json.dumps(RECOMMENDATION)))
    agent(server, store, supports_images=True).analyze(analysis_request())
    user = [m for m in server.received[0].body["messages"] if m["role"] == "user"][-1]
    parts = {p["type"]: p for p in user["content"]}
    url = parts["image_url"]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]).startswith(b"\x89PNG\r\n\x1a\n")
    texts = [p["text"] for p in user["content"] if p["type"] == "text"]
    assert "relu_kernel" in texts[0] and "picture" in texts[1]  # the prompt, then the caption
    assert [p["type"] for p in user["content"]] == ["text", "text", "image_url"]


def test_no_image_part_for_text_only_models(server: ScriptedServer, store: Store) -> None:
    server.script(ok(json.dumps(RECOMMENDATION)))
    agent(server, store).analyze(analysis_request())
    assert all(isinstance(m["content"], str) for m in server.received[0].body["messages"])


def test_context_window_exceeded_is_a_recorded_failure(
    server: ScriptedServer, store: Store
) -> None:
    # llama.cpp's wording, which litellm does not map to its own context-window error
    message = "the request exceeds the available context size, try increasing it"
    server.script(fail(400, message, "exceed_context_size_error"))
    result = agent(server, store).generate(generation_request())
    assert result.source is None and result.extraction == "context_window"
    assert result.transcript.error and "context window" in result.transcript.error
    assert len(server.received) == 1


def test_a_bad_key_is_not_swallowed(server: ScriptedServer, store: Store) -> None:
    server.script(fail(401, "Incorrect API key provided"))
    with pytest.raises(LLMAuthError, match="openai/kforge-test"):
        agent(server, store).generate(generation_request())


@pytest.mark.parametrize(
    ("reply", "reason", "finish"),
    [
        ("I am sorry, I cannot help with that.", "no_code_block", "stop"),
        (
            "```python\nimport torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return (",
            "truncated",
            "length",
        ),
        (
            "```python\nimport torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return (",
            "truncated",
            "stop",
        ),
    ],
)
def test_unusable_replies_are_recorded_failures(
    server: ScriptedServer, store: Store, reply: str, reason: str, finish: str
) -> None:
    server.script(ok(reply, finish_reason=finish), ok(reply, finish_reason=finish))
    result = agent(server, store).generate(generation_request())
    assert result.source is None and result.extraction == reason
    assert result.transcript.error and reason in result.transcript.error
    assert result.transcript.response == reply
    # prose is re-asked once with the reason; a cut-off reply is not (it would be cut again)
    assert len(server.received) == (2 if reason == "no_code_block" else 1)


def test_two_blocks_pick_the_one_defining_model_new(server: ScriptedServer, store: Store) -> None:
    reply = 'First the C++:\n```cpp\nextern "C" void relu(float* x) {}\n```\n' + fenced(
        GOOD_KERNEL, "Then the module:"
    )
    server.script(ok(reply))
    result = agent(server, store).generate(generation_request())
    assert result.source == GOOD_KERNEL and result.extraction == "multiple_blocks"
    assert result.plan["extraction"]["blocks"] == 2 and result.plan["extraction"]["picked"] == 1


def test_the_same_generation_twice_is_one_request(server: ScriptedServer, store: Store) -> None:
    server.script(ok(fenced(GOOD_KERNEL)))
    first = agent(server, store).generate(generation_request())
    second = agent(server, store).generate(generation_request())
    assert first == second and len(server.received) == 1


def test_parse_recommendation_reports_what_is_wrong() -> None:
    rec, problem = parse_recommendation('{"bottleneck": "memory", "evidence": {"x": 1,}')
    assert rec is None and problem and "does not parse" in problem
    rec, problem = parse_recommendation("[1, 2]")
    assert rec is None and problem == "no JSON object in the reply"
    rec, problem = parse_recommendation(json.dumps(RECOMMENDATION))
    assert problem is None and rec is not None and rec.bottleneck == "memory"


def test_parse_recommendation_is_lenient() -> None:
    reply = json.dumps({
        "bottleneck": "Memory-bound", "confidence": "high",  # an extra key, a synonym
        "evidence": {"bandwidth_utilisation": "85%", "note": "lots", "achieved_gbps": "41 GB/s"},
        "actions": {"kind": "Fuse", "params": "bias+relu", "expected_gain": "1.4x", "extra": 1},
        "summary": "fuse",
    })
    rec, problem = parse_recommendation(reply)
    assert problem is None and rec is not None and rec.bottleneck == "memory"
    assert rec.evidence == {"bandwidth_utilisation": 85.0, "achieved_gbps": 41.0}
    assert rec.actions[0].kind == "fuse" and rec.actions[0].expected_gain == 1.4
    assert rec.actions[0].params == {"value": "bias+relu"}
    other, _ = parse_recommendation('{"bottleneck": "gpu-ish", "summary": "x",}')
    assert other is not None and other.bottleneck == "other"
    percent, _ = parse_recommendation('{"bottleneck": "compute", "actions": [{"kind": "tile", "expected_gain": "+30%"}]}')
    assert percent is not None and percent.actions[0].expected_gain == pytest.approx(1.3)
