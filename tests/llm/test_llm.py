"""kforge.llm.complete over real HTTP: cache, retries, typed errors, accounting, concurrency."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kforge import llm
from kforge.llm import (
    LLMAuthError,
    LLMContextWindowError,
    LLMNotFoundError,
    LLMRequest,
    LLMResponseError,
    LLMTimeoutError,
    LLMUnavailableError,
    api_base_kind,
    cache_key,
    complete,
    concurrency_slot,
)
from kforge.schema import Transcript
from kforge.store import Store

from .helpers import agent_config
from .server import ScriptedServer, fail, ok

pytestmark = pytest.mark.exclusive  # timings or wall-clock bounds: alone under xdist (tests/conftest.py)

CONTEXT_MESSAGE = (
    "This model's maximum context length is 4096 tokens. However, your messages resulted in "
    "9000 tokens. Please reduce the length of the messages."
)


def request(srv: ScriptedServer, text: str = "write a kernel", **kw: object) -> LLMRequest:
    config = agent_config(srv)
    return LLMRequest.for_agent(
        config,
        agent=str(kw.pop("agent", "llm")),
        role="generate",
        messages=[{"role": "user", "content": text}],
        prompt_digest="p" * 64,
    )


def test_a_good_reply_is_parsed_and_recorded(server: ScriptedServer, store: Store) -> None:
    server.script(ok("hello", prompt_tokens=1000, completion_tokens=200))
    config = agent_config(server, input_cost_per_token=2e-6, output_cost_per_token=1e-5)
    result = complete(request(server), store=store, config=config)
    assert result.content == "hello" and not result.cached and result.attempts == 1
    usage = result.transcript.usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (1000, 200)
    assert usage.cost_usd == pytest.approx(1000 * 2e-6 + 200 * 1e-5)
    stored = Transcript.model_validate(store.get_json(result.transcript_digest))
    assert stored == result.transcript and stored.litellm_version and stored.latency_s > 0
    assert stored.request_digest == result.cache_key
    assert store.get_json(result.response_digest)["choices"][0]["message"]["content"] == "hello"
    body = server.received[0].body
    assert body["model"] == "kforge-test" and body["temperature"] == 0.0 and body["seed"] == 0


def test_local_model_costs_zero_not_none(server: ScriptedServer, store: Store) -> None:
    server.script(ok("x"))
    result = complete(request(server), store=store, config=agent_config(server))
    assert result.transcript.usage.cost_usd == 0.0 and result.cost_known


def test_the_same_request_is_paid_once_even_on_another_port(store: Store) -> None:
    with ScriptedServer([ok("paid once")]) as first:
        complete(request(first), store=store, config=agent_config(first))
    with ScriptedServer() as second:  # a restarted local server: another port, same model
        again = complete(request(second), store=store, config=agent_config(second))
        assert second.received == []
    assert again.cached and again.content == "paid once"
    assert len(first.received) == 1


def test_a_replayed_call_writes_the_identical_transcript(
    server: ScriptedServer, store: Store
) -> None:
    server.script(ok("same"))
    a = complete(request(server), store=store, config=agent_config(server))
    b = complete(request(server), store=store, config=agent_config(server))
    assert b.cached and a.transcript_digest == b.transcript_digest and len(server.received) == 1


def test_the_api_key_is_sent_but_never_part_of_the_key(
    server: ScriptedServer, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KFORGE_TEST_KEY", "sk-secret-1")
    server.script(ok("a"))
    config = agent_config(server, api_key_env="KFORGE_TEST_KEY")
    result = complete(request(server), store=store, config=config)
    assert server.received[0].headers["authorization"] == "Bearer sk-secret-1"
    monkeypatch.setenv("KFORGE_TEST_KEY", "sk-secret-2")
    assert complete(request(server), store=store, config=config).cached
    assert not any(b"sk-secret" in p.read_bytes() for p in store.root.rglob("*") if p.is_file())
    assert result.cache_key == cache_key(request(server))


def test_an_unset_key_variable_fails_before_any_request(
    server: ScriptedServer, store: Store
) -> None:
    config = agent_config(server, api_key_env="KFORGE_TEST_NO_SUCH_KEY")
    with pytest.raises(LLMAuthError, match="KFORGE_TEST_NO_SUCH_KEY"):
        complete(request(server), store=store, config=config)
    assert server.received == []


def test_429_three_times_then_success(server: ScriptedServer, store: Store) -> None:
    busy = fail(429, "Rate limit reached", headers={"retry-after-ms": "20"})
    server.script(busy, busy, busy, ok("finally"))
    result = complete(request(server), store=store, config=agent_config(server, num_retries=3))
    assert result.content == "finally" and result.attempts == 4 and len(server.received) == 4


def test_5xx_retries_are_bounded(server: ScriptedServer, store: Store) -> None:
    down = fail(503, "overloaded", headers={"retry-after": "0"})
    server.script(down, down, down, ok("never reached"))
    with pytest.raises(LLMUnavailableError, match="gave up after 3 attempts") as info:
        complete(request(server), store=store, config=agent_config(server, num_retries=2))
    assert len(server.received) == 3 and "openai/kforge-test" in str(info.value)


@pytest.mark.parametrize(
    ("status", "error", "hint"),
    [(401, LLMAuthError, "key"), (403, LLMAuthError, "key"), (404, LLMNotFoundError, "model name")],
)
def test_auth_and_not_found_fail_at_once_naming_the_model(
    server: ScriptedServer, store: Store, status: int, error: type[Exception], hint: str
) -> None:
    server.script(fail(status, "nope"), ok("must not be fetched"))
    start = time.monotonic()
    with pytest.raises(error) as info:
        complete(request(server), store=store, config=agent_config(server, num_retries=3))
    message = str(info.value)
    assert "'openai/kforge-test'" in message and server.api_base in message and hint in message
    assert len(server.received) == 1 and time.monotonic() - start < 3


def test_context_window_exceeded_fails_at_once(server: ScriptedServer, store: Store) -> None:
    server.script(fail(400, CONTEXT_MESSAGE, "context_length_exceeded"), ok("no"))
    with pytest.raises(LLMContextWindowError, match="context window") as info:
        complete(request(server), store=store, config=agent_config(server))
    assert "openai/kforge-test" in str(info.value) and len(server.received) == 1


def test_a_timeout_on_every_attempt_is_bounded(server: ScriptedServer, store: Store) -> None:
    server.script(*[ok("late", delay_s=3.0) for _ in range(3)])
    config = agent_config(server, timeout_s=0.4, num_retries=1)
    start = time.monotonic()
    with pytest.raises(LLMTimeoutError, match="2 attempts"):
        complete(request(server), store=store, config=config)
    elapsed = time.monotonic() - start
    # two attempts of 0.4 s plus one backoff of at most BACKOFF_BASE_S, with slack
    assert elapsed < 2 * 0.4 + llm.BACKOFF_BASE_S + 1.5
    assert len(server.received) == 2


def test_a_connection_refused_is_retried_then_typed(store: Store) -> None:
    with ScriptedServer() as gone:
        config = agent_config(gone, num_retries=1)
    with pytest.raises(LLMUnavailableError, match="gave up after 2 attempts"):
        complete(request(gone), store=store, config=config)


def test_an_empty_reply_is_stored_but_never_replayed(server: ScriptedServer, store: Store) -> None:
    server.script(ok(None), ok("now an answer"))  # a 200 with no message content, then one
    with pytest.raises(LLMResponseError, match="no message content"):
        complete(request(server), store=store, config=agent_config(server))
    entry = store.action_get(cache_key(request(server)))
    assert entry is not None and entry["incomplete"] == "empty"
    assert store.get_json(entry["response"])["choices"]  # the raw response is kept
    again = complete(request(server), store=store, config=agent_config(server))
    assert again.content == "now an answer" and not again.cached and len(server.received) == 2
    assert complete(request(server), store=store, config=agent_config(server)).cached


def test_a_truncated_reply_is_returned_marked_and_asked_again(
    server: ScriptedServer, store: Store
) -> None:
    server.script(ok("```python\nclass ModelNew", finish_reason="length"), ok("whole"))
    first = complete(request(server), store=store, config=agent_config(server))
    assert first.incomplete == "truncated" and first.finish_reason == "length"
    second = complete(request(server), store=store, config=agent_config(server))
    assert second.content == "whole" and second.incomplete is None and len(server.received) == 2


def test_api_base_kind() -> None:
    assert api_base_kind(None) == "default"
    assert (
        api_base_kind("http://127.0.0.1:8000/v1")
        == api_base_kind("http://localhost:9/v1")
        == "local"
    )
    assert api_base_kind("http://10.0.0.5:8000/v1") == "local"
    assert api_base_kind("https://api.example.com/v1/") == "api.example.com/v1"


def test_concurrency_limit_holds_across_threads(server: ScriptedServer, store: Store) -> None:
    server.script(*[ok(f"r{i}", delay_s=0.3) for i in range(3)])
    config = agent_config(server, concurrency=1)
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            complete(request(server, f"prompt {i}"), store=store, config=config)
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(server.received) == 3 and server.max_in_flight == 1


def test_concurrency_slots_hold_across_processes(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from kforge.llm import concurrency_slot\n"
            "with concurrency_slot(Path(sys.argv[1]), 'agent', 1):\n"
            "    print('held', flush=True); time.sleep(1.0)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    start = time.monotonic()
    with concurrency_slot(tmp_path, "agent", 1):
        waited = time.monotonic() - start
    holder.wait(timeout=10)
    assert waited > 0.3  # had to wait for the other process to let go
    start = time.monotonic()
    with concurrency_slot(tmp_path, "agent", 2), concurrency_slot(tmp_path, "agent", 2):
        assert time.monotonic() - start < 0.3  # two slots: two holders at once


def test_importing_kforge_llm_does_not_import_litellm() -> None:
    code = (
        "import sys, kforge.llm, kforge.agents.llm_agent, kforge.agents.registry\n"
        "assert 'litellm' not in sys.modules, 'litellm imported at module level'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
