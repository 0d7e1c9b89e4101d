"""Local receivers for the fallback notifiers: a WeCom group robot and a generic JSON webhook.

- WeComServer: `POST /cgi-bin/webhook/send?key=KEY` as the robot documentation describes:
  JSON `{"msgtype": "text", "text": {"content": "…"}}`; answers `{"errcode": 0, "errmsg": "ok"}`,
  or errcode 93000 (invalid key) / 40008 (bad message type) / 44004 (empty content), each of which
  is also listed in `problems` (a test expects it to stay empty).
- WebhookServer: any POST path; records the JSON bodies and headers; `status` (default 200) is
  the HTTP status it answers with, so a failing endpoint is one attribute away.
Both record every request in `requests` as (path, query, headers, body).
"""
from __future__ import annotations

import json
import threading
from urllib.parse import parse_qs

from tests.servers import JSONHandler, JSONServer


class _Recording(JSONServer):
    def __init__(self):
        self.requests: list[tuple[str, dict, dict, object]] = []
        self.problems: list[str] = []
        self.lock = threading.Lock()
        server = self

        class Handler(JSONHandler):
            def do_POST(self):
                path, _, query = self.path.partition("?")
                raw = self.read_body()
                try:
                    body = json.loads(raw.decode("utf-8"))
                except (UnicodeDecodeError, ValueError):
                    body = raw
                headers = self.lowered_headers()
                with server.lock:
                    server.requests.append((path, {k: v[0] for k, v in parse_qs(query).items()}, headers, body))
                self.send_json(*server.answer(path, parse_qs(query), headers, body))

        self.listen(Handler)

    def bodies(self) -> list:
        with self.lock:
            return [request[3] for request in self.requests]

    def answer(self, path: str, query: dict, headers: dict, body) -> tuple[int, dict]:
        raise NotImplementedError


class WeComServer(_Recording):
    def __init__(self, key: str = "wecom-key-1"):
        self.key = key
        super().__init__()

    @property
    def url(self) -> str:
        return f"{self.base_url}/cgi-bin/webhook/send?key={self.key}"

    def answer(self, path, query, headers, body):
        def refuse(code: int, text: str) -> tuple[int, dict]:
            with self.lock:
                self.problems.append(text)
            return 200, {"errcode": code, "errmsg": text}
        if path != "/cgi-bin/webhook/send" or query.get("key") != [self.key]:
            return refuse(93000, f"invalid webhook url: {path} {query}")
        if not headers.get("content-type", "").startswith("application/json"):
            return refuse(40008, f"content type {headers.get('content-type')!r}")
        if not isinstance(body, dict) or body.get("msgtype") != "text" or set(body) != {"msgtype", "text"}:
            return refuse(40008, f"invalid message type: {body!r}")
        content = body["text"].get("content") if isinstance(body["text"], dict) else None
        if not isinstance(content, str) or not content.strip() or len(content.encode("utf-8")) > 2048:
            return refuse(44004, f"text content empty or over 2048 bytes: {body!r}")
        return 200, {"errcode": 0, "errmsg": "ok"}


class WebhookServer(_Recording):
    def __init__(self, status: int = 200):
        self.status = status
        super().__init__()

    @property
    def url(self) -> str:
        return f"{self.base_url}/hook"

    def answer(self, path, query, headers, body):
        return self.status, {"ok": self.status == 200}
