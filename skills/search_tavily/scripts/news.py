#!/usr/bin/env python3
"""search_tavily: news search through Tavily (topic "news"), with time range and domain filters.

A user skill: no imports from the system skills, only the ias_skill helper shipped with
iAs (on PYTHONPATH from the runner), so the directory can be copied to another iAs as is.

Input (stdin, JSON): {"query": "...", "time_range": "week", "include_domains": ["..."],
                      "exclude_domains": ["..."], "max_results": 5}     (all but query optional)
Output (stdout): exactly one JSON object with "success"; results carry published_date.
Environment: TAVILY_API_KEY (Bearer token), TAVILY_BASE_URL (default https://api.tavily.com).
Expected failures print {"success": false, "error": "..."} and exit 0.
"""
from __future__ import annotations

import os

import ias_skill
from ias_skill import SkillError, tavily

TIMEOUT = 15.0                      # seconds; the answer takes a few; the skill's ## Timeout is 30
TIME_RANGES = ("day", "week", "month", "year")


def main(stdin_text: str, environ=os.environ) -> dict:
    params = ias_skill.params(stdin_text)
    body = tavily.query_params(params)
    time_range = params.get("time_range")
    if time_range is not None:
        if time_range not in TIME_RANGES:
            raise SkillError(f"参数 time_range 只能是 {' / '.join(TIME_RANGES)}")
        body["time_range"] = time_range
    for name in ("include_domains", "exclude_domains"):
        domains = params.get(name)
        if domains is None:
            continue
        if not isinstance(domains, list) or not all(isinstance(d, str) for d in domains):
            raise SkillError(f"参数 {name} 必须是字符串数组")
        domains = [d.strip() for d in domains if d.strip()]
        if domains:
            body[name] = domains
    return tavily.search({**body, "topic": "news"}, environ, TIMEOUT)


if __name__ == "__main__":
    ias_skill.run(main, "新闻搜索失败")
