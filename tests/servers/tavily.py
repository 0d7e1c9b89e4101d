"""A local Tavily search API: `POST /search`.

Written from the protocol notes (shared/reference/web-apis.md):
- auth is `Authorization: Bearer <key>`; otherwise 401 `{"detail": {"error": "…"}}`;
- the JSON body is checked: `query` (required, non-empty), `search_depth` basic|advanced,
  `max_results` 0–20, `topic` general|news|finance, `time_range` day|week|month|year,
  `include_domains`/`exclude_domains` arrays of strings, `include_answer` boolean; a bad
  body answers 400 with a `detail.error`;
- results honour `max_results`, `include_domains` and `exclude_domains`; `content` is long
  (so clients must cut it); news results carry `published_date`;
- the answer is gzip-compressed when the client sends `Accept-Encoding: gzip`.

`script(status, error=…)` queues one canned HTTP error (e.g. 429, 432) for the next
request (after the auth check). Every request is recorded in `requests` (path, headers,
parsed body).
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

from tests.servers import JSONHandler, JSONServer

KEY = "tvly-test-0123456789abcdef"
CONTENT = ("这是一段很长的网页正文，用来检验技能会不会截断摘要。" * 30
           + " Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 10)
DOMAINS = ("example.com", "news.example.org", "reuters.com", "xinhuanet.com", "bbc.co.uk")
TOPICS = ("general", "news", "finance")
TIME_RANGES = ("day", "week", "month", "year", "d", "w", "m", "y")


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]        # names lower-cased
    body: object                   # parsed JSON (None if it was not JSON)


class TavilyServer(JSONServer):
    """`with TavilyServer() as tv:` — `tv.base_url` for TAVILY_BASE_URL, `tv.key` for TAVILY_API_KEY."""

    def __init__(self, key: str = KEY, delay: float = 0.0):
        self.key = key
        self.delay = delay
        self.requests: list[Request] = []
        self._scripted: list[tuple[int, dict]] = []
        self._lock = threading.Lock()
        server = self

        class Handler(JSONHandler):
            def _reply(self, status: int, body: dict) -> None:
                if server.delay:
                    time.sleep(server.delay)
                try:
                    self.send_json(status, body, gzipped="gzip" in self.headers.get("Accept-Encoding", ""))
                except (BrokenPipeError, ConnectionResetError):
                    pass            # the client gave up (a timeout test)

            def do_POST(self):
                raw = self.read_body()
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                self._reply(*server._answer(Request("POST", self.path, self.lowered_headers(), body)))

            def do_GET(self):
                request = Request("GET", self.path, self.lowered_headers(), None)
                with server._lock:
                    server.requests.append(request)
                self._reply(405, {"detail": {"error": "Method Not Allowed"}})

        self.listen(Handler)

    def script(self, status: int, error: str = "scripted failure", body: dict | None = None) -> None:
        """Answer the next request with HTTP `status` and `{"detail": {"error": error}}` (or `body`)."""
        with self._lock:
            self._scripted.append((status, body if body is not None else {"detail": {"error": error}}))

    def bodies(self) -> list[object]:
        return [r.body for r in self.requests]

    def _answer(self, request: Request) -> tuple[int, dict]:
        with self._lock:
            self.requests.append(request)
            if request.path != "/search":
                return 404, {"detail": {"error": f"Not Found: {request.path}"}}
            if request.headers.get("authorization") != f"Bearer {self.key}":
                return 401, {"detail": {"error": "Unauthorized: missing or invalid API key."}}
            if self._scripted:
                return self._scripted.pop(0)
        problem = _check(request.body)
        if problem:
            return 400, {"detail": {"error": problem}}
        return 200, _results(request.body)


def _check(body: object) -> str | None:
    """What Tavily would refuse with 400, or None."""
    if not isinstance(body, dict):
        return "Invalid JSON body."
    query = body.get("query")
    if not isinstance(query, str) or not query.strip():
        return "Query is missing."
    if body.get("search_depth", "basic") not in ("basic", "advanced"):
        return "Invalid search depth."
    n = body.get("max_results", 5)
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= 20:
        return "max_results must be between 0 and 20."
    if body.get("topic", "general") not in TOPICS:
        return "Invalid topic."
    if "time_range" in body and body["time_range"] not in TIME_RANGES:
        return "Invalid time_range."
    for name in ("include_domains", "exclude_domains"):
        value = body.get(name, [])
        if not isinstance(value, list) or not all(isinstance(d, str) for d in value):
            return f"{name} must be a list of strings."
    if not isinstance(body.get("include_answer", False), (bool, str)):
        return "include_answer must be a boolean."
    return None


def _results(body: dict) -> dict:
    include = body.get("include_domains") or list(DOMAINS)
    exclude = set(body.get("exclude_domains") or [])
    domains = [d for d in include if d not in exclude] or ["example.net"]
    news = body.get("topic") == "news"
    results = []
    for i in range(body.get("max_results", 5)):
        domain = domains[i % len(domains)]
        item = {"title": f"{body['query']} — result {i + 1}", "url": f"https://{domain}/article/{i + 1}",
                "content": f"[{i + 1}] {CONTENT}", "score": round(0.9 - i * 0.05, 2), "raw_content": None}
        if news:
            item["published_date"] = f"Wed, {15 - i:02d} Jan 2025 08:00:00 GMT"
        results.append(item)
    answer = f"Answer about {body['query']}." if body.get("include_answer") else None
    return {"query": body["query"], "follow_up_questions": None, "answer": answer, "images": [],
            "results": results, "response_time": 0.42}
