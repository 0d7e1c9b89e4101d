"""Tavily search for skill scripts: configuration, the shared parameters, one search and its result.

Shared by the system skill search_web and the user skill search_tavily; each script adds its own
parameters (topic, or the news filters) to the request body. TAVILY_API_KEY goes in the
Authorization header (and nowhere else); TAVILY_BASE_URL defaults to DEFAULT_BASE. Snippets are
cut to SNIPPET_MAX characters: the result goes back to the model on every later round of the turn.
"""
from __future__ import annotations

import re

import ias_skill
from ias_skill import SkillError

SERVICE = "Tavily"
DEFAULT_BASE = "https://api.tavily.com"
SNIPPET_MAX = 500
_SPACE = re.compile(r"\s+")


def base_url(value: str | None) -> str:
    return ias_skill.base_url(value, "TAVILY_BASE_URL", default=DEFAULT_BASE)


def query_params(params: dict) -> dict:
    """The request body's `query` (required) and `max_results` (1-10, default 5)."""
    query = params.get("query")
    if not isinstance(query, str) or not query.strip():
        raise SkillError("缺少参数 query（搜索内容）")
    max_results = params.get("max_results", 5)
    if isinstance(max_results, float) and max_results.is_integer():
        max_results = int(max_results)
    if not isinstance(max_results, int) or isinstance(max_results, bool) or not 1 <= max_results <= 10:
        raise SkillError("参数 max_results 必须是 1 到 10 的整数")
    return {"query": query.strip(), "max_results": max_results}


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


def search(body: dict, environ, timeout: float) -> dict:
    """POST /search with `body` (basic depth, with an answer); the skill's result."""
    key = ias_skill.require("TAVILY_API_KEY", "请在环境变量中设置 Tavily API Key（tvly-…）", environ)
    base = base_url(environ.get("TAVILY_BASE_URL"))
    status, data = ias_skill.request_json(f"{base}/search", body={**body, "include_answer": True,
                                                                    "search_depth": "basic"},
                                          headers={"Authorization": f"Bearer {key}"}, timeout=timeout,
                                          service=SERVICE)
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
    return {"success": True, "query": body["query"], "answer": data.get("answer") or "", "results": results}
