"""The search skills (search_web, user skill search_tavily) end to end against a local Tavily.

Each call goes through the real gate (schema, audit rows in PostgreSQL) and the runner (a real
`bash -c` + `$IAS_PYTHON` subprocess with the environment built from scratch); the script talks
HTTP to tests/servers/tavily.py.
"""
from __future__ import annotations

import unittest

from tests.servers import closed_port
from tests.servers.tavily import KEY, TavilyServer
from tests.support import REPO, SkillsTestCase, load_script

SEARCH_SCRIPT = REPO / "resources/skills/search_web/scripts/search.py"
NEWS_SCRIPT = REPO / "skills/search_tavily/scripts/news.py"


class SearchCase(SkillsTestCase):
    async def asyncSetUp(self) -> None:
        self.tv = TavilyServer().start()
        self.addCleanup(self.tv.close)
        await super().asyncSetUp()

    def runner_environ(self, **env: str | None) -> dict[str, str]:
        """The runner's environment, with `env` set (None: unset) over the usual Tavily set-up."""
        environ = {**super().runner_environ(), "TAVILY_API_KEY": KEY, "TAVILY_BASE_URL": self.tv.base_url,
                   "QWEATHER_API_KEY": "not-for-search", **env}
        return {k: v for k, v in environ.items() if v is not None}

    async def call(self, name: str, params, **env: str | None) -> dict:
        gate = self.gate
        if env:
            gate = self.build(environ=self.runner_environ(**env)).gate
        return await gate.call("owner", name, params)

    def assert_error(self, result: dict, *needles: str) -> None:
        self.assertIs(result["success"], False, result)
        self.assertNotIn("exit_code", result)           # an expected failure: exit 0, success false
        for needle in needles:
            self.assertIn(needle, result["error"])
        self.assertNotIn("Traceback", result["error"])


class SearchWebTest(SearchCase):
    async def test_search_with_defaults(self):
        result = await self.call("search_web", {"query": "iAs 天气"})
        self.assertIs(result["success"], True, result)
        self.assertEqual(result["answer"], "Answer about iAs 天气.")
        self.assertEqual(len(result["results"]), 5)
        first = result["results"][0]
        self.assertEqual(set(first), {"title", "url", "snippet"})
        self.assertEqual(first["title"], "iAs 天气 — result 1")
        self.assertTrue(first["url"].startswith("https://"))
        self.assertLessEqual(len(first["snippet"]), 501)
        self.assertTrue(first["snippet"].endswith("…"))
        self.assertTrue(first["snippet"].startswith("[1] 这是一段很长的网页正文"))

        (request,) = self.tv.requests
        self.assertEqual((request.method, request.path), ("POST", "/search"))
        self.assertEqual(request.headers["authorization"], f"Bearer {KEY}")
        self.assertIn("gzip", request.headers["accept-encoding"])          # the answer came back gzipped
        self.assertEqual(request.headers["content-type"], "application/json")
        self.assertEqual(request.body, {"query": "iAs 天气", "max_results": 5, "topic": "general",
                                        "include_answer": True, "search_depth": "basic"})
        rows = self.sql("SELECT event, exit_code FROM audit_log WHERE skill_name = 'search_web' ORDER BY id")
        self.assertEqual(rows, [("skill_started", None), ("skill_finished", 0)])

    async def test_max_results_and_topic(self):
        result = await self.call("search_web", {"query": "A股", "max_results": 2, "topic": "news"})
        self.assertEqual(len(result["results"]), 2)
        self.assertIn("published_date", result["results"][0])
        body = self.tv.requests[0].body
        self.assertEqual((body["max_results"], body["topic"]), (2, "news"))
        await self.call("search_web", {"query": "A股", "max_results": 10, "topic": "finance"})
        self.assertEqual((self.tv.requests[1].body["max_results"], self.tv.requests[1].body["topic"]), (10, "finance"))

    async def test_malformed_input_is_rejected_before_anything_runs(self):
        for params in ({}, {"max_results": 50}, {"query": "x", "max_results": 50}, {"query": "x", "max_results": 0},
                       {"query": ""}, {"query": "x", "topic": "sports"}, {"query": "x", "max_results": "5"},
                       {"query": "x", "max_results": True}, {"query": "x", "site": "a.com"}, "not json"):
            with self.subTest(params=params):
                result = await self.call("search_web", params)
                self.assertIs(result["success"], False)
                self.assertTrue(result["error"].startswith("参数错误："), result)
        self.assertEqual(self.tv.requests, [])
        self.assertEqual(self.sql("SELECT count(*) FROM audit_log WHERE event = 'skill_started'"), [(0,)])

    async def test_wrong_key_401(self):
        result = await self.call("search_web", {"query": "x"}, TAVILY_API_KEY="tvly-wrong")
        self.assert_error(result, "401", "TAVILY_API_KEY")

    async def test_rate_limited_429(self):
        self.tv.script(429, "Rate limit exceeded")
        self.assert_error(await self.call("search_web", {"query": "x"}), "429", "稍后")

    async def test_http_errors_are_explained(self):
        cases = [(432, "This request exceeds your plan's set usage limit.", ("432", "套餐", "usage limit")),
                 (433, "Pay-as-you-go limit exceeded.", ("433", "套餐")),
                 (403, "Forbidden", ("403",)),
                 (400, "Query is too long.", ("400", "Query is too long.")),
                 (500, "Internal error", ("500", "稍后")),
                 (502, "Bad gateway", ("502",))]
        for status, error, needles in cases:
            with self.subTest(status=status):
                self.tv.script(status, error)
                self.assert_error(await self.call("search_web", {"query": "x"}), *needles)
        self.tv.script(502, body={"not": "the usual shape"})
        self.assert_error(await self.call("search_web", {"query": "x"}), "502")

    async def test_missing_key_names_the_variable(self):
        self.assert_error(await self.call("search_web", {"query": "x"}, TAVILY_API_KEY=None), "TAVILY_API_KEY")
        self.assert_error(await self.call("search_web", {"query": "x"}, TAVILY_API_KEY=" "), "TAVILY_API_KEY")
        self.assertEqual(self.tv.requests, [])

    async def test_bad_base_url_names_the_variable(self):
        self.assert_error(await self.call("search_web", {"query": "x"}, TAVILY_BASE_URL="ftp://x"), "TAVILY_BASE_URL")

    async def test_unreachable_service(self):
        result = await self.call("search_web", {"query": "x"}, TAVILY_BASE_URL=f"http://127.0.0.1:{closed_port()}")
        self.assert_error(result, "无法连接 Tavily")

    async def test_the_key_reaches_only_the_header(self):
        result = await self.call("search_web", {"query": "x"})
        self.assertTrue(result["success"])
        self.assertNotIn(KEY, str(result))
        self.assertNotIn(KEY, str(self.tv.requests[0].body))


class SearchTavilyTest(SearchCase):
    """The user skill: news search with time range and domain filters."""

    def test_registered_as_a_user_skill(self):
        skill = self.registry.get("search_tavily")
        self.assertEqual((skill.source, skill.risk, skill.overrides), ("user", "low", False))
        self.assertEqual(self.registry.get("search_web").source, "system")
        self.assertEqual(skill.env, ("TAVILY_API_KEY", "TAVILY_BASE_URL"))
        self.assertNotIn("search_web", NEWS_SCRIPT.read_text())     # no import of the system skill
        self.assertEqual([p for p in self.registry.problems if "search" in p], [])

    async def test_filters_reach_the_server(self):
        result = await self.call("search_tavily", {"query": "芯片 出口", "time_range": "week",
                                                   "include_domains": ["reuters.com", "xinhuanet.com"],
                                                   "exclude_domains": ["xinhuanet.com"]})
        self.assertIs(result["success"], True, result)
        self.assertEqual(self.tv.requests[0].body, {
            "query": "芯片 出口", "max_results": 5, "time_range": "week",
            "include_domains": ["reuters.com", "xinhuanet.com"], "exclude_domains": ["xinhuanet.com"],
            "topic": "news", "include_answer": True, "search_depth": "basic"})
        self.assertEqual(len(result["results"]), 5)
        self.assertTrue(all(r["url"].startswith("https://reuters.com/") for r in result["results"]))
        self.assertTrue(all(r["published_date"] for r in result["results"]))
        self.assertTrue(result["answer"])

    async def test_no_filters_sends_none(self):
        result = await self.call("search_tavily", {"query": "今日新闻", "max_results": 3})
        self.assertEqual(len(result["results"]), 3)
        self.assertEqual(self.tv.requests[0].body, {"query": "今日新闻", "max_results": 3, "topic": "news",
                                                    "include_answer": True, "search_depth": "basic"})
        await self.call("search_tavily", {"query": "今日新闻", "include_domains": [], "exclude_domains": [" "]})
        self.assertNotIn("include_domains", self.tv.requests[1].body)
        self.assertNotIn("exclude_domains", self.tv.requests[1].body)

    async def test_schema(self):
        for params in ({}, {"query": "x", "time_range": "decade"}, {"query": "x", "include_domains": "a.com"},
                       {"query": "x", "exclude_domains": [1]}, {"query": "x", "max_results": 11},
                       {"query": "x", "topic": "general"}):
            with self.subTest(params=params):
                result = await self.call("search_tavily", params)
                self.assertTrue(result["error"].startswith("参数错误："), result)
        self.assertEqual(self.tv.requests, [])

    async def test_failures(self):
        self.assert_error(await self.call("search_tavily", {"query": "x"}, TAVILY_API_KEY=None), "TAVILY_API_KEY")
        self.assertEqual(self.tv.requests, [])
        self.assert_error(await self.call("search_tavily", {"query": "x"}, TAVILY_API_KEY="bad"), "401",
                          "TAVILY_API_KEY")
        self.tv.script(429)
        self.assert_error(await self.call("search_tavily", {"query": "x"}), "429")
        self.tv.script(432, "Plan limit")
        self.assert_error(await self.call("search_tavily", {"query": "x"}), "432", "Plan limit")


class ScriptInternalsTest(unittest.TestCase):
    """What a subprocess test cannot reach: the default base URL and the request timeout."""

    def test_base_url(self):
        tavily = load_script(SEARCH_SCRIPT, "skill_search").tavily       # shared by both scripts
        self.assertEqual(tavily.base_url(None), "https://api.tavily.com")
        self.assertEqual(tavily.base_url(""), "https://api.tavily.com")
        self.assertEqual(tavily.base_url("http://127.0.0.1:9000/"), "http://127.0.0.1:9000")
        self.assertEqual(tavily.base_url("tavily.proxy.example"), "https://tavily.proxy.example")
        for path, name in ((SEARCH_SCRIPT, "skill_search"), (NEWS_SCRIPT, "skill_news")):
            module = load_script(path, name)
            self.assertIs(module.tavily, tavily)
            self.assertLess(module.TIMEOUT, 30)         # below the skill's ## Timeout

    def test_timeout_is_a_clear_error(self):
        module = load_script(NEWS_SCRIPT, "skill_news_timeout")
        module.TIMEOUT = 0.3
        with TavilyServer(delay=1.5) as tv:
            with self.assertRaises(module.SkillError) as caught:
                module.main('{"query": "x"}', {"TAVILY_API_KEY": KEY, "TAVILY_BASE_URL": tv.base_url})
        self.assertIn("超时", str(caught.exception))

    def test_snippet(self):
        module = load_script(SEARCH_SCRIPT, "skill_search_snippet").tavily
        self.assertEqual(module.snippet("  a\n\n b\tc "), "a b c")
        self.assertEqual(module.snippet(None), "")
        self.assertEqual(len(module.snippet("字" * 2000)), module.SNIPPET_MAX + 1)


if __name__ == "__main__":
    unittest.main()
