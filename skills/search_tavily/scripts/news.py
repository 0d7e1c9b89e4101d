#!/usr/bin/env python3
"""search_tavily: news search through Tavily (topic "news"), with time range and domain filters.

A user skill: self-contained (no imports from the system skills), so the directory
can be copied to another iAs as is.

Input (stdin, JSON): {"query": "...", "time_range": "week", "include_domains": ["..."],
                      "exclude_domains": ["..."], "max_results": 5}     (all but query optional)
Output (stdout): exactly one JSON object with "success":
  {"success": true, "query", "answer", "results": [{"title", "url", "snippet"[, "published_date"]}]}
Environment: TAVILY_API_KEY (Bearer token), TAVILY_BASE_URL (default https://api.tavily.com).

Snippets are cut to SNIPPET_MAX characters: the result goes back to the model on every
later round of the turn. Expected failures (no key, HTTP errors, network) print
{"success": false, "error": "..."} and exit 0. Stdlib only.
"""
from __future__ import annotations

import gzip
import http.client
import json
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request

TIMEOUT = 15.0                      # seconds; the answer takes a few; the skill's ## Timeout is 30
DEFAULT_BASE = "https://api.tavily.com"
USER_AGENT = "iAs-skill/1.0 (search_tavily)"
SNIPPET_MAX = 500
TIME_RANGES = ("day", "week", "month", "year")
_SPACE = re.compile(r"\s+")


class SkillError(Exception):
    """An expected failure; its text is what the model sees."""


def base_url(value: str | None) -> str:
    value = (value or "").strip() or DEFAULT_BASE
    if "://" not in value:
        value = "https://" + value.strip("/")
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in value):
        raise SkillError(f"TAVILY_BASE_URL 无效：{value!r}（应为 http(s):// 开头的地址）")
    return value.rstrip("/")


def _decode(raw: bytes, headers) -> object:
    encoding = (headers.get("Content-Encoding") or "").lower() if headers is not None else ""
    if "gzip" in encoding or raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise SkillError(f"Tavily 返回的数据无法解压：{exc}") from None
    try:
        return json.loads(raw.decode("utf-8"))
    except ValueError:
        return None


def post(url: str, body: dict, key: str) -> tuple[int, object]:
    """POST JSON; returns (HTTP status, parsed JSON or None). Network problems raise SkillError."""
    request = urllib.request.Request(url, data=json.dumps(body, ensure_ascii=False).encode("utf-8"), method="POST",
                                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json",
                                              "Accept": "application/json", "Accept-Encoding": "gzip",
                                              "User-Agent": USER_AGENT})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return response.status, _decode(response.read(), response.headers)
    except urllib.error.HTTPError as exc:
        try:
            raw = exc.read()
        except (OSError, http.client.HTTPException):
            raw = b""
        return exc.code, _decode(raw, exc.headers)
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise SkillError(f"Tavily 请求超时（{TIMEOUT:g} 秒），请稍后再试") from None
        raise SkillError(f"无法连接 Tavily（{urllib.parse.urlsplit(url).netloc}）：{exc.reason}") from None
    except TimeoutError:
        raise SkillError(f"Tavily 请求超时（{TIMEOUT:g} 秒），请稍后再试") from None
    except (OSError, http.client.HTTPException) as exc:
        raise SkillError(f"Tavily 网络错误：{type(exc).__name__}: {exc}") from None


def error_text(status: int, data: object) -> str:
    """A clear message for a Tavily HTTP error; the body is {"detail": {"error": "..."}}."""
    detail = ""
    if isinstance(data, dict):
        inner = data.get("detail", data.get("error"))
        if isinstance(inner, dict):
            inner = inner.get("error") or inner.get("message")
        if isinstance(inner, str):
            detail = inner.strip()[:300]
    if status == 401:
        return "Tavily 认证失败（401）：请检查 TAVILY_API_KEY"
    if status == 429:
        return "Tavily 请求过于频繁（429），请稍后再试"
    if status in (403, 432, 433):
        text = f"Tavily 套餐额度已用完或无权限（{status}）"
    elif status == 400:
        text = "Tavily 请求参数无效（400）"
    elif status >= 500:
        text = f"Tavily 服务暂时不可用（{status}），请稍后再试"
    else:
        text = f"Tavily 返回错误（HTTP {status}）"
    return f"{text}：{detail}" if detail else text


def snippet(text: object) -> str:
    text = _SPACE.sub(" ", text if isinstance(text, str) else "").strip()
    return text if len(text) <= SNIPPET_MAX else text[:SNIPPET_MAX].rstrip() + "…"


def read_params(text: str) -> dict:
    try:
        params = json.loads(text or "{}")
    except ValueError:
        raise SkillError("参数不是有效的 JSON") from None
    if not isinstance(params, dict):
        raise SkillError("参数必须是 JSON 对象")
    query = params.get("query")
    if not isinstance(query, str) or not query.strip():
        raise SkillError("缺少参数 query（搜索内容）")
    max_results = params.get("max_results", 5)
    if isinstance(max_results, float) and max_results.is_integer():
        max_results = int(max_results)
    if not isinstance(max_results, int) or isinstance(max_results, bool) or not 1 <= max_results <= 10:
        raise SkillError("参数 max_results 必须是 1 到 10 的整数")
    result = {"query": query.strip(), "max_results": max_results}
    time_range = params.get("time_range")
    if time_range is not None:
        if time_range not in TIME_RANGES:
            raise SkillError(f"参数 time_range 只能是 {' / '.join(TIME_RANGES)}")
        result["time_range"] = time_range
    for name in ("include_domains", "exclude_domains"):
        domains = params.get(name)
        if domains is None:
            continue
        if not isinstance(domains, list) or not all(isinstance(d, str) for d in domains):
            raise SkillError(f"参数 {name} 必须是字符串数组")
        domains = [d.strip() for d in domains if d.strip()]
        if domains:
            result[name] = domains
    return result


def main(stdin_text: str, environ=os.environ) -> dict:
    params = read_params(stdin_text)
    key = (environ.get("TAVILY_API_KEY") or "").strip()
    if not key:
        raise SkillError("未配置 TAVILY_API_KEY：请在环境变量中设置 Tavily API Key（tvly-…）")
    base = base_url(environ.get("TAVILY_BASE_URL"))
    body = {**params, "topic": "news", "include_answer": True, "search_depth": "basic"}
    status, data = post(f"{base}/search", body, key)
    if status != 200:
        raise SkillError(error_text(status, data))
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise SkillError("Tavily 返回了无法识别的响应")
    results = []
    for item in data["results"]:
        if not isinstance(item, dict):
            continue
        entry = {"title": str(item.get("title") or ""), "url": str(item.get("url") or ""),
                 "snippet": snippet(item.get("content"))}
        if item.get("published_date"):
            entry["published_date"] = str(item["published_date"])
        results.append(entry)
    return {"success": True, "query": params["query"], "answer": data.get("answer") or "", "results": results}


def run() -> None:
    try:
        result = main(sys.stdin.read())
    except SkillError as exc:
        result = {"success": False, "error": str(exc)}
    except Exception as exc:        # never a traceback: the model gets one line
        result = {"success": False, "error": f"新闻搜索失败：{type(exc).__name__}: {exc}"}
    sys.stdout.buffer.write(json.dumps(result, ensure_ascii=False).encode("utf-8") + b"\n")


if __name__ == "__main__":
    run()
