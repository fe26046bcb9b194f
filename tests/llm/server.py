"""A scripted OpenAI-compatible chat server for tests: real HTTP on 127.0.0.1.

``ScriptedServer`` listens on a free port and answers ``POST /v1/chat/completions`` with the
scripted replies in order (one reply per request, retries included), recording every request
it receives. When the script runs out, an optional responder answers from the request itself;
without one the server answers 500 saying so, so a test that makes more calls than it scripted
fails loudly rather than hanging.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One scripted answer: a chat completion (``content``) or an error (``status`` != 200)."""

    content: str | None = ""
    status: int = 200
    error: str = ""
    error_code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    prompt_tokens: int = 120
    completion_tokens: int = 40
    finish_reason: str = "stop"


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def user_text(self) -> str:
        """All text of the user messages (text parts of multi-part messages included)."""
        out: list[str] = []
        for message in self.body.get("messages", []):
            if message.get("role") != "user":
                continue
            content = message.get("content")
            if isinstance(content, str):
                out.append(content)
            else:
                out.extend(p.get("text", "") for p in content if p.get("type") == "text")
        return "\n".join(out)


def ok(content: str | None, **kw: Any) -> Reply:
    return Reply(content=content, **kw)


def fail(status: int, message: str, code: str | None = None, **kw: Any) -> Reply:
    return Reply(status=status, error=message, error_code=code, **kw)


class ScriptedServer:
    """Context manager: ``with ScriptedServer([ok("...")]) as srv: srv.api_base``."""

    def __init__(
        self,
        replies: list[Reply] | None = None,
        responder: Callable[[Received], Reply] | None = None,
    ) -> None:
        """``replies`` are answered in order; once they are spent, ``responder`` (if any)
        answers from the request itself (for runs whose call order is not fixed)."""
        self.replies: list[Reply] = list(replies or [])
        self.responder = responder
        self.received: list[Received] = []
        self.in_flight = 0
        self.max_in_flight = 0  # most requests being answered at one moment
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"_unparsed": raw.decode(errors="replace")}
                received = Received(self.path, dict(self.headers), body)
                with server._lock:
                    server.received.append(received)
                    reply = server.replies.pop(0) if server.replies else None
                    if reply is None and server.responder is not None:
                        reply = server.responder(received)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    self._answer(reply, body)
                finally:
                    with server._lock:
                        server.in_flight -= 1

            def _answer(self, reply: Reply | None, body: dict[str, Any]) -> None:
                if reply is None:
                    reply = fail(500, "scripted server: no reply left for this request")
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    reply = fail(404, f"scripted server: no route {self.path}")
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                if body.get("stream") and reply.status == 200:
                    self._stream(reply, body.get("model", "unknown"))
                else:
                    self._send(reply, body.get("model", "unknown"))

            def _stream(self, reply: Reply, model: str) -> None:
                """Server-sent events, as OpenAI streams: the content in two chunks, the
                finish reason, a usage chunk, then ``[DONE]``."""
                text = reply.content or ""
                half = len(text) // 2
                base = {"id": "chatcmpl-s", "object": "chat.completion.chunk",
                        "created": 1700000000, "model": model}
                events = [
                    {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text[:half]},
                                          "finish_reason": None}]},
                    {**base, "choices": [{"index": 0, "delta": {"content": text[half:]},
                                          "finish_reason": None}]},
                    {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": reply.finish_reason}]},
                    {**base, "choices": [], "usage": {
                        "prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
                        "total_tokens": reply.prompt_tokens + reply.completion_tokens}},
                ]
                data = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Content-Length", str(len(data.encode())))
                    self.end_headers()
                    self.wfile.write(data.encode())
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _send(self, reply: Reply, model: str) -> None:
                if reply.status == 200:
                    payload: dict[str, Any] = {
                        "id": f"chatcmpl-{len(server.received)}",
                        "object": "chat.completion",
                        "created": 1700000000,
                        "model": model,
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": reply.content},
                                "finish_reason": reply.finish_reason,
                            }
                        ],
                        "usage": {
                            "prompt_tokens": reply.prompt_tokens,
                            "completion_tokens": reply.completion_tokens,
                            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
                        },
                    }
                else:
                    payload = {
                        "error": {
                            "message": reply.error,
                            "type": "invalid_request_error",
                            "code": reply.error_code,
                        }
                    }
                data = json.dumps(payload).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for key, value in reply.headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.api_base = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self.replies.extend(replies)

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
