#!/usr/bin/env python3
"""search_web: web search through Tavily.

Input (stdin, JSON): {"query": "...", "max_results": 5, "topic": "general"}
Output (stdout): exactly one JSON object with "success":
  {"success": true, "query", "answer", "results": [{"title", "url", "snippet"[, "published_date"]}]}
Environment: TAVILY_API_KEY (Bearer token), TAVILY_BASE_URL (default https://api.tavily.com).

The Tavily request and result (snippets cut short) are in ias_skill.tavily, on PYTHONPATH from
the runner. Expected failures (no key, HTTP errors, network) print
{"success": false, "error": "..."} and exit 0.
"""
from __future__ import annotations

import os

import ias_skill
from ias_skill import SkillError, tavily

TIMEOUT = 15.0                      # seconds; the answer takes a few; the skill's ## Timeout is 30
TOPICS = ("general", "news", "finance")


def main(stdin_text: str, environ=os.environ) -> dict:
    params = ias_skill.params(stdin_text)
    body = tavily.query_params(params)
    body["topic"] = params.get("topic", "general")
    if body["topic"] not in TOPICS:
        raise SkillError(f"参数 topic 只能是 {' / '.join(TOPICS)}")
    return tavily.search(body, environ, TIMEOUT)


if __name__ == "__main__":
    ias_skill.run(main, "搜索失败")
