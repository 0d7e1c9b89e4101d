"""Tool selection: the BM25 ranker, the catalog's choice per request, find_skills, and an endpoint
that refuses more than 128 tools (as OpenAI's does)."""
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from ias.agent import TOOLS_REFUSED, system_prompt
from ias.app import build
from ias.config import Config
from ias.limits import MAX_TOOLS_CEILING
from ias.llm import LLM
from ias.catalog import Catalog, tokens, untitled
from ias.registry import load_registry
from tests import skillset
from tests.servers.llm import LLMServer, calls, text
from tests.support import REPO, StoreTestCase, capture_logs, drop_schema, fresh_schema_dsn, slow

SYSTEM = REPO / "resources" / "skills"
REQUEST_MAX = 16 * 1024
HIT_RATE_MIN = 0.95


def request_body(tools: list[dict], message: str) -> bytes:
    """A chat request as the client sends it: model, a system prompt, the owner's message, the tools."""
    from datetime import datetime, timezone
    body = {"model": "gpt-4o-mini", "tools": tools,
            "messages": [{"role": "system", "content": system_prompt(datetime.now(timezone.utc))},
                         {"role": "user", "content": message}]}
    return json.dumps(body, ensure_ascii=False).encode("utf-8")


class TokensTest(unittest.TestCase):
    def test_chinese_by_bigrams_and_characters_english_by_stemmed_words(self):
        self.assertEqual(tokens("打开空调"), ["打", "开", "空", "调", "打开", "开空", "空调"])
        self.assertEqual(tokens("Turning the Lights on"), ["turn", "light", "on"])
        self.assertEqual(tokens("bedroom_ac_off"), ["bedroom", "ac", "off"])
        self.assertEqual(tokens("查询 weather 天气"), ["查", "询", "查询", "weather", "天", "气", "天气"])


class ToolSpecTest(unittest.TestCase):
    def test_titles_are_for_the_owner_not_sent_to_the_model(self):
        schema = {"type": "object", "title": "T", "properties": {
            "title": {"title": "标题", "type": "string", "description": "kept"},
            "items": {"type": "array", "items": {"title": "x", "type": "integer"}},
            "choice": {"anyOf": [{"title": "a", "type": "string"}, {"type": "null"}]},
            "more": {"type": "object", "additionalProperties": {"title": "v", "type": "string"}}}}
        self.assertEqual(untitled(schema), {"type": "object", "properties": {
            "title": {"type": "string", "description": "kept"},
            "items": {"type": "array", "items": {"type": "integer"}},
            "choice": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "more": {"type": "object", "additionalProperties": {"type": "string"}}}})
        self.assertEqual(schema["properties"]["title"]["title"], "标题", "the skill's own schema is untouched")


class GeneratedSkillsTest(unittest.TestCase):
    """1,000 generated user skills over the shipped system skills, default limits."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp(prefix="ias-ranker-"))
        skillset.write(cls.tmp)
        cls.registry = load_registry(SYSTEM, cls.tmp)
        assert len(cls.registry) >= 1000 and not cls.registry.problems, cls.registry.problems[:3]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_every_request_fits_and_the_right_skill_is_offered_for_95_percent(self):
        catalog = Catalog(self.registry, 32, 12288)
        self.assertFalse(catalog.fits())
        labelled = skillset.requests()
        self.assertEqual(len(labelled), 200)
        self.assertEqual(sum(any("\u4e00" <= c <= "\u9fff" for c in t) for t, _ in labelled), 100)   # half Chinese
        hits = 0
        for message, wanted in labelled:
            tools = catalog.select(message)
            names = [t["function"]["name"] for t in tools]
            self.assertLessEqual(len(tools), MAX_TOOLS_CEILING)
            self.assertLessEqual(len(tools), 32)
            self.assertLessEqual(len(request_body(tools, message)), REQUEST_MAX, message)
            self.assertTrue({s.name for s in self.registry if s.source == "system"} <= set(names))
            hits += wanted in names
        self.assertGreaterEqual(hits / len(labelled), HIT_RATE_MIN, f"{hits}/{len(labelled)}")

    def test_requests_are_worded_differently_from_the_descriptions(self):
        for message, wanted in skillset.requests():
            skill = self.registry.get(wanted)
            self.assertNotIn(message.lower(), skill.description.lower())
            self.assertNotIn(skill.title, message)

    def test_kept_skills_come_before_ranked_ones_and_the_byte_budget_holds(self):
        catalog = Catalog(self.registry, 32, 12288)
        names = [t["function"]["name"] for t in catalog.select("卧室空调关掉", keep=["jinan_jobs"])]
        self.assertIn("jinan_jobs", names)
        self.assertIn("bedroom_ac_off", names)
        small = Catalog(self.registry, 128, 8000)
        tools = small.select("卧室空调关掉")
        size = sum(len(json.dumps(t, ensure_ascii=False, separators=(",", ":")).encode()) for t in tools)
        self.assertLessEqual(size, 8000)

    def test_below_the_cap_every_skill_is_offered_in_name_order(self):
        registry = load_registry(SYSTEM, REPO / "skills")
        catalog = Catalog(registry, 32, 12288)
        self.assertTrue(catalog.fits())
        self.assertEqual([t["function"]["name"] for t in catalog.select("anything")], [s.name for s in registry])

    def test_search_ranks_by_meaning_words(self):
        catalog = Catalog(self.registry, 32, 12288)
        self.assertEqual(catalog.search("杭州高铁票", 1), ["hangzhou_trains"])
        self.assertEqual(catalog.search("kitchen robot vacuum status", 1), ["kitchen_vacuum_status"])
        self.assertEqual(catalog.search("zzzz qqqq", 5), [])


class EndpointTest(StoreTestCase):
    """The agent against a local endpoint that refuses more than `max_tools` tools."""

    user_count = 130          # more than 128 together with the system skills

    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-endpoint-"))
        for name in skillset.write(self.tmp / "skills")[self.user_count:]:
            shutil.rmtree(self.tmp / "skills" / name)
        self.server = LLMServer(max_tools=128).__enter__()
        self.llm = LLM("sk-test", self.server.base_url, "test-model", retry_delays=(0.01,))

    async def asyncTearDown(self):
        await self.llm.close()
        await asyncio.to_thread(self.server.__exit__)
        shutil.rmtree(self.tmp, ignore_errors=True)
        await super().asyncTearDown()

    def app(self, **settings):
        config = Config(data_dir=self.tmp / "data", system_skills_dir=SYSTEM, skills_dir=self.tmp / "skills",
                        environ={"PATH": "/usr/bin:/bin"}, **settings)
        return build(config, self.store, key=b"k" * 32, llm=self.llm)

    def offered(self, request: int) -> list[str]:
        return [t["function"]["name"] for t in self.server.requests[request]["tools"]]

    async def test_every_turn_works_past_128_tools_and_a_found_skill_is_offered_next_call(self):
        app = self.app()
        self.assertGreater(len(app.registry), 128)
        self.server.script(
            calls(("find_skills", {"query": "厨房 风扇 定时"})),
            calls(("kitchen_fan_timer", {})),
            text("好的，已设定。"),
            text("第二轮。"))
        self.assertEqual(await app.agent.turn("owner", "你好，帮个忙", None), "好的，已设定。")
        self.assertNotIn("kitchen_fan_timer", self.offered(0))
        found = json.loads(self.server.requests[1]["messages"][-1]["content"])
        self.assertTrue(found["success"])
        self.assertIn("kitchen_fan_timer", [s["name"] for s in found["skills"]])
        self.assertIn("kitchen_fan_timer", self.offered(1))          # the next model call of the same turn
        ran = json.loads(self.server.requests[2]["messages"][-1]["content"])
        self.assertEqual(ran, {"success": True, "output": "ok\n"})
        self.assertEqual(await app.agent.turn("owner", "谢谢", None), "第二轮。")
        self.assertIn("kitchen_fan_timer", self.offered(3))          # used recently in this conversation
        for raw in self.server.raw:
            self.assertLessEqual(len(raw), REQUEST_MAX)
        self.assertTrue(all(len(r["tools"]) <= 32 for r in self.server.requests))
        self.assertEqual(self.server.refused, 0)
        self.server.assert_complete()

    async def test_a_400_naming_the_tools_is_explained_in_one_line(self):
        self.server.max_tools = 20          # an endpoint stricter than the 32 tools offered
        app = self.app()
        records = capture_logs(self)
        reply = await app.agent.turn("owner", "帮我定时关闭客厅的电器", None)
        self.assertEqual(reply, TOOLS_REFUSED)
        self.assertNotIn("\n", reply)
        self.assertEqual(self.server.refused, 1)          # a 400 is not retried
        self.assertEqual(len(self.server.requests), 0)
        self.assertTrue(any("refused the tools" in r.getMessage() for r in records))


if __name__ == "__main__":
    unittest.main()


def ias(*args: str, env: dict) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("IAS_", "OPENAI_"))}
    return subprocess.run([sys.executable, str(REPO / "ias.py"), *args], capture_output=True, text=True,
                          env={**environ, **env}, timeout=120)


@slow
class CommandsTest(unittest.TestCase):
    """`skills check` and `doctor` warn when the skills exceed one request; `skills` lists from a cache."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-limits-"))
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.env = {"IAS_SKILLS_DIR": str(self.tmp / "skills"), "IAS_DATA_DIR": str(self.tmp / "data")}

    def test_check_and_doctor_warn_past_one_request(self):
        for name in skillset.write(self.tmp / "skills")[40:]:
            shutil.rmtree(self.tmp / "skills" / name)
        check = ias("skills", "check", env=self.env)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
        self.assertRegex(check.stdout, r"(?m)^warning: 51 skills make \d+ bytes of tool definitions, more than one "
                                       r"model request carries \(IAS_MAX_TOOLS=32, IAS_TOOLS_BYTES=12288\)")
        roomy = ias("skills", "check", env={**self.env, "IAS_MAX_TOOLS": "128", "IAS_TOOLS_BYTES": "65536"})
        self.assertNotIn("warning:", roomy.stdout)
        dsn, schema_name = fresh_schema_dsn()
        self.addCleanup(drop_schema, schema_name)
        doctor = ias("doctor", env={**self.env, "IAS_DATABASE_URL": dsn})
        self.assertRegex(doctor.stdout, r"(?m)^warn  tools: 51 skills make \d+ bytes")

    def test_bad_limits_are_refused(self):
        for value, why in (("0", "between 1 and 128"), ("129", "between 1 and 128"), ("many", "an integer")):
            result = ias("skills", env={**self.env, "IAS_MAX_TOOLS": value})
            self.assertNotEqual(result.returncode, 0)
            self.assertIn(f"IAS_MAX_TOOLS must be {why}", result.stderr)
        self.assertIn("IAS_TOOLS_BYTES must be between 1024",
                      ias("skills", env={**self.env, "IAS_TOOLS_BYTES": "10"}).stderr)

    def test_limits_from_ias_toml_and_the_environment(self):
        from ias.config import load
        from ias.errors import ConfigError
        file = self.tmp / "ias.toml"
        file.write_text("max_tools = 64\ntools_bytes = 20000\n", encoding="utf-8")
        config = load(file, {"IAS_TOOLS_BYTES": "30000"})
        self.assertEqual((config.max_tools, config.tools_bytes), (64, 30000))
        self.assertEqual((load(None, {}).max_tools, load(None, {}).tools_bytes), (32, 12288))
        for toml in ("max_tools = true\n", "max_tools = 200\n", 'max_tools = "lots"\n', "tools_bytes = 1.5\n"):
            file.write_text(toml, encoding="utf-8")
            with self.subTest(toml=toml), self.assertRaisesRegex(ConfigError, "must be (an integer|between)"):
                load(file, {})

    def test_listing_cache_follows_edits_and_survives_damage(self):
        skillset.write(self.tmp / "skills")
        first = ias("skills", "--json", env=self.env)
        self.assertEqual(len(json.loads(first.stdout)), 1011)
        cached = json.loads((self.tmp / "data" / "skills.cache.json").read_bytes())    # written in batches
        self.assertEqual(len(cached["entries"]), 1011)
        again = ias("skills", "--json", env=self.env)
        self.assertEqual(again.stdout, first.stdout)
        skill = self.tmp / "skills" / "jinan_jobs" / "SKILL.md"
        skill.write_text(skill.read_text(encoding="utf-8").replace("Search job", "Search many job"), encoding="utf-8")
        shutil.rmtree(self.tmp / "skills" / "jinan_rent")
        rows = {r["name"]: r for r in json.loads(ias("skills", "--json", env=self.env).stdout)}
        self.assertEqual(rows["jinan_jobs"]["description"], "Search many job openings in Jinan.")
        self.assertNotIn("jinan_rent", rows)
        (self.tmp / "data" / "skills.cache.json").write_text("{damaged", encoding="utf-8")
        self.assertEqual(len(json.loads(ias("skills", "--json", env=self.env).stdout)), 1010)


class OnceRefusedTest(StoreTestCase):
    def test_once_explains_the_refusal_and_exits_1(self):
        with tempfile.TemporaryDirectory(prefix="ias-once-") as tmp, LLMServer([], max_tools=2) as server:
            result = ias("--once", "你好", env={"IAS_DATABASE_URL": self.dsn, "IAS_DATA_DIR": tmp,
                                               "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": server.base_url})
        self.assertEqual((result.returncode, result.stdout), (1, TOOLS_REFUSED + "\n"), result.stderr)
        self.assertEqual(server.refused, 1)
