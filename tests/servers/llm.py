"""A local OpenAI-compatible endpoint: chat completions (with tools) scripted per test.

Each POST to /v1/chat/completions takes the next scripted step: a reply (text and/or tool
calls, with 1 + 1 tokens of `usage` or what `counted` gives), an HTTP error status, or a
misbehaving endpoint: one that never answers (`stall`), one that sends its reply a byte at a
time without end (`drip`), a 200 whose body is not JSON (`broken`), or any body as given
(`raw`, e.g. a recorded reply of llama.cpp's server). Every request body is recorded, so tests
can check what the model was sent.
`assert_complete()` fails when scripted steps were left unused.

The fake's own errors (called more often than scripted, a step it cannot serve) are answered with a
500 and listed in `problems`, never printed from the handler thread; leaving the `with` block (or
`check()`) fails the test when any were met. A client that hangs up mid-request or mid-reply is
not a problem (`hangups` counts the requests cut short).
"""
from __future__ import annotations

import json
import threading

from tests.servers import JSONHandler, JSONServer


def text(content: str) -> dict:
    return {"content": content}


def calls(*tool_calls: tuple[str, dict | str]) -> dict:
    """A reply asking for tool calls: (name, arguments) pairs; arguments may be raw text."""
    return {"tool_calls": [(name, args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))
                           for name, args in tool_calls]}


def counted(step: dict, usage) -> dict:
    """`step` (a `text` or `calls` reply) with this `usage` in place of the default (1 + 1 tokens): a dict as
    the endpoint reports it (any values, hostile ones too), or None for a completion without `usage`."""
    return {**step, "usage": usage}


def error(status: int) -> dict:
    return {"status": status}


def stall() -> dict:
    """Take the request and never answer (until the server closes)."""
    return {"stall": True}


def drip(interval: float) -> dict:
    """A 200 whose body comes one byte (JSON whitespace) every `interval` seconds and never ends: each
    read succeeds well within any per-read timeout."""
    return {"drip": interval}


def raw(body: bytes | dict) -> dict:
    """A 200 with Content-Type application/json and exactly this body (a dict: as JSON), e.g. a recorded
    completion of another server."""
    return {"raw": body if isinstance(body, bytes) else json.dumps(body, ensure_ascii=False).encode()}


def broken() -> dict:
    """A 200 whose JSON body is cut short: not JSON at all."""
    return raw(b'{"id": "chatcmpl-1", "object": "chat.completion", "choices": [{"index": 0, "mess')


class LLMServer(JSONServer):
    """Start with `with LLMServer() as server:`; `server.base_url` is for OPENAI_BASE_URL."""

    def __init__(self, steps: list[dict] | None = None, repeat_last: bool = False, max_tools: int | None = None,
                 models: tuple[str, ...] | None = ("test-model",)):
        self.steps = list(steps or [])
        self.models = models                # GET /models lists these; None: no such endpoint (a 404), as some servers
        self.max_tools = max_tools          # refuse more tools with OpenAI's 400, as api.openai.com does (128)
        self.repeat_last = repeat_last
        self.requests: list[dict] = []
        self.raw: list[bytes] = []
        self._lock = threading.Lock()
        self._calls = 0
        self.refused = 0                    # requests refused for their tools
        self.problems: list[str] = []       # the fake's own errors, answered with a 500
        self.hangups = 0                    # requests whose client went away before sending all of the body
        self.released = threading.Event()   # set on close: stalled and dripping requests end
        server = self

        class Handler(JSONHandler):
            ensure_ascii = True

            def do_GET(self):
                if self.path.rstrip("/").endswith("/models") and server.models is not None:
                    if self.headers.get("Authorization", "") != "Bearer sk-test":
                        return self.send_json(401, {"error": {"message": "bad key", "type": "invalid_request_error"}})
                    self.send_json(200, {"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                                                     "owned_by": "test"} for name in server.models]})
                else:
                    self.send_json(404, {"error": {"message": "not found"}})

            def do_POST(self):
                try:
                    self.answer()
                except (BrokenPipeError, ConnectionResetError):      # the client went away (killed, or gave up)
                    self.close_connection = True
                except Exception as exc:
                    with server._lock:
                        server.problems.append(f"{type(exc).__name__}: {exc}")
                    try:
                        self.send_json(500, {"error": {"message": f"the test's model failed: {exc}",
                                                       "type": "server_error"}})
                    except OSError:
                        self.close_connection = True

            def answer(self):
                length = int(self.headers.get("Content-Length", 0))
                raw = self.rfile.read(length)
                if len(raw) < length:           # the client hung up mid-request (e.g. a daemon stopped in a turn)
                    with server._lock:
                        server.hangups += 1
                    self.close_connection = True
                    return
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    return self.send_json(404, {"error": {"message": "not found"}})
                if self.headers.get("Authorization", "") != "Bearer sk-test":
                    return self.send_json(401, {"error": {"message": "bad key", "type": "invalid_request_error"}})
                tools = (json.loads(raw).get("tools") or []) if server.max_tools is not None else []
                if server.max_tools is not None and len(tools) > server.max_tools:
                    with server._lock:
                        server.raw.append(raw)
                        server.refused += 1
                    return self.send_json(400, {"error": {
                        "message": f"Invalid 'tools': array too long. Expected an array with maximum length "
                                   f"{server.max_tools}, but got an array with length {len(tools)} instead.",
                        "type": "invalid_request_error", "param": "tools", "code": "array_above_max_length"}})
                step = server._next(raw)
                if "stall" in step or "drip" in step:
                    return self.misbehave(step)
                if "raw" in step:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(step["raw"])))
                    self.end_headers()
                    return self.wfile.write(step["raw"])
                if "status" in step:
                    return self.send_json(step["status"], {"error": {"message": "scripted failure",
                                                                     "type": "server_error"}})
                self.send_json(200, server._completion(step))

            def misbehave(self, step: dict) -> None:
                """Never finish a reply: say nothing, or drip whitespace, until the server closes or the
                client hangs up."""
                self.close_connection = True
                if "stall" in step:
                    server.released.wait()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(1 << 30))
                self.end_headers()
                try:
                    while not server.released.wait(step["drip"]):
                        self.wfile.write(b" ")
                        self.wfile.flush()
                except OSError:         # the client gave up
                    pass

        self.listen(Handler)
        self.base_url = f"http://{self.host}/v1"

    def close(self) -> None:
        self.released.set()
        super().close()

    def check(self) -> None:
        """Fail if the fake met errors of its own (e.g. more requests than scripted)."""
        with self._lock:
            if self.problems:
                raise AssertionError("the test's model server: " + "; ".join(self.problems))

    def __exit__(self, exc_type=None, *exc) -> None:
        self.close()
        if exc_type is None:
            self.check()

    def _next(self, raw: bytes) -> dict:
        with self._lock:
            self.raw.append(raw)
            self.requests.append(json.loads(raw))
            if not self.steps:
                raise AssertionError("the model was called more often than scripted")
            step = self.steps[0] if (self.repeat_last and len(self.steps) == 1) else self.steps.pop(0)
            self._calls += 1
            return step

    def _completion(self, step: dict) -> dict:
        message: dict = {"role": "assistant", "content": step.get("content")}
        finish = "stop"
        if step.get("tool_calls"):
            message["tool_calls"] = [{"id": f"call_{self._calls}_{i}", "type": "function",
                                      "function": {"name": name, "arguments": args}}
                                     for i, (name, args) in enumerate(step["tool_calls"])]
            finish = "tool_calls"
        body = {"id": f"chatcmpl-{self._calls}", "object": "chat.completion", "created": 0, "model": "test-model",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}]}
        usage = step.get("usage", {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2})
        if usage is not None:
            body["usage"] = usage
        return body

    def script(self, *steps: dict) -> None:
        with self._lock:
            self.steps.extend(steps)

    def assert_complete(self) -> None:
        if self.steps and not self.repeat_last:
            raise AssertionError(f"{len(self.steps)} scripted model replies were never requested")
