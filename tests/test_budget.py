"""Token accounting, the daily budget and /status (SPEC §12): the usage rule on its own, the agent with the
model in process (`ScriptedLLM`), and the real `openai` client against a local endpoint reporting `usage`."""
import asyncio
import json
import tempfile
import unittest
from datetime import date, datetime, timezone
from types import SimpleNamespace

from ias.app import build
from ias.budget import SPENT, beijing_day
from ias.channels.base import Window
from ias.config import Config, Endpoint, load
from ias.errors import ConfigError, StoreError
from ias.limits import ESTIMATE_BYTES_PER_TOKEN, USAGE_TOKENS_MAX
from ias.llm import LLM, Models, Usage, _reply
from ias.slash import HELP
from ias.status import UNAVAILABLE
from tests.servers.llm import LLMServer, calls, counted, error, raw, text
from tests.support import FakeChannel, FakeClock, FlakyStore, GateTestCase, ScriptedLLM, answer, ask, capture_logs

EVENING = datetime(2026, 12, 3, 15, 30, tzinfo=timezone.utc)     # 23:30 in Beijing; Beijing's day turns at 16:00 UTC


def completion(content: str | None, usage) -> SimpleNamespace:
    """A chat completion as the SDK hands it over, with `usage` as given (None: the attribute is absent)."""
    message = SimpleNamespace(content=content, tool_calls=None)
    response = SimpleNamespace(choices=[SimpleNamespace(message=message)])
    if usage is not None:
        response.usage = usage
    return response


class UsageRuleTest(unittest.TestCase):
    messages = [{"role": "user", "content": "北京天气怎么样"}]

    def test_the_endpoints_count_is_taken_as_is(self):
        reply = _reply(completion("晴。", SimpleNamespace(prompt_tokens=120, completion_tokens=8)), self.messages, [],
                       "model-a")
        self.assertEqual((reply.model, reply.usage), ("model-a", Usage(120, 8, estimated=False)))
        self.assertEqual(reply.usage.total, 128)

    def test_without_usage_the_tokens_are_estimated_from_utf8_bytes(self):
        reply = _reply(completion("晴，二十度。", None), self.messages, [], "model-a")
        sent = len(json.dumps(self.messages, ensure_ascii=False).encode())
        self.assertEqual(reply.usage, Usage(-(-sent // ESTIMATE_BYTES_PER_TOKEN), 6, estimated=True))   # 18 bytes / 3

    def test_hostile_counts_are_estimated_never_trusted(self):
        for prompt, done in ((-5, 3), (10 ** 30, 3), (USAGE_TOKENS_MAX + 1, 0), ("12", 3), (True, 3), (1.5, 3),
                             (None, 3), (3, [1]), (3, float("nan"))):
            with self.subTest(prompt=prompt, completion=done):
                reply = _reply(completion("好", SimpleNamespace(prompt_tokens=prompt, completion_tokens=done)),
                               self.messages, [], "m")
                self.assertTrue(reply.usage.estimated)
                self.assertEqual(reply.usage.completion, 1)
                self.assertGreater(reply.usage.prompt, 0)
        for usage in ("lots", 42, {"prompt_tokens": 1, "completion_tokens": 1}):      # not an object with fields
            with self.subTest(usage=usage):
                self.assertTrue(_reply(completion("好", usage), self.messages, [], "m").usage.estimated)

    def test_the_day_is_beijings(self):
        self.assertEqual(beijing_day(datetime(2026, 12, 3, 15, 59, tzinfo=timezone.utc)), date(2026, 12, 3))
        self.assertEqual(beijing_day(datetime(2026, 12, 3, 16, 0, tzinfo=timezone.utc)), date(2026, 12, 4))


class DailyTokensSettingTest(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory(prefix="ias-budget-")
        self.addCleanup(tmp.cleanup)
        self.data = tmp.name

    def test_unset_is_no_limit_and_a_whole_number_is_the_budget(self):
        self.assertIsNone(load(environ={"IAS_DATA_DIR": self.data}).daily_tokens)
        self.assertEqual(load(environ={"IAS_DATA_DIR": self.data, "IAS_DAILY_TOKENS": " 100000 "}).daily_tokens,
                         100000)

    def test_a_bad_value_is_one_clear_error(self):
        for value in ("abc", "0", "-5", "1.5", "100,000", "1e6"):
            with self.subTest(value=value), self.assertRaisesRegex(ConfigError, "^IAS_DAILY_TOKENS must be"):
                load(environ={"IAS_DATA_DIR": self.data, "IAS_DAILY_TOKENS": value})


class BudgetTestCase(GateTestCase):
    """The app over this test's store with IAS_DAILY_TOKENS = `daily`, its clock `self.clock` (Beijing 23:30)."""
    daily: int | None = None
    fallback_models: tuple[Endpoint, ...] = ()

    def model_for_test(self):
        self.model = ScriptedLLM()
        return self.model

    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.clock = FakeClock(EVENING)
        self.llm = self.model_for_test()
        self.use(self.build(llm=self.llm, now=self.clock.now))

    async def asyncTearDown(self):
        await self.llm.close()
        await super().asyncTearDown()
        self.model.assert_complete()

    def build(self, *, llm=None, store=None, **options):
        config = Config(data_dir=self.tmp, system_skills_dir=self.system_skills, skills_dir=self.user_skills,
                        approval_timeout=self.approval_timeout, environ=self.runner_environ(), daily_tokens=self.daily,
                        fallback_models=self.fallback_models)
        return build(config, store or self.store, key=self.key, llm=llm, **options)

    async def today(self, day: date | None = None) -> list[tuple]:
        rows = await self.store.usage_on("owner", day or beijing_day(self.clock.now()))
        return [(r.model, r.prompt_tokens, r.completion_tokens, r.requests, r.estimated_requests) for r in rows]


class BudgetTest(BudgetTestCase):
    daily = 100

    async def test_a_turn_that_crosses_the_budget_stops_before_its_next_round(self):
        self.model.script(ask(("echo_low", {"text": "a"}), usage=Usage(60, 50)))
        self.assertEqual(await self.agent.turn("owner", "echo", None), SPENT.format(budget=100))
        self.assertEqual(len(self.model.requests), 1)           # the tool ran, no second request was made
        self.assertEqual(await self.today(), [("test-model", 60, 50, 1, 0)])
        self.assertEqual(await self.agent.turn("owner", "还在吗", None), "今日大模型额度已用完（100 tokens），明天恢复或调高 IAS_DAILY_TOKENS。")
        self.assertEqual(len(self.model.requests), 1)
        self.assertEqual(await self.agent.turn("owner", "/help", None), HELP)      # /commands need no model

    async def test_the_budget_is_per_beijing_day(self):
        self.model.script(answer("一", Usage(90, 20)), answer("二", Usage(5, 5)))
        self.assertEqual(await self.agent.turn("owner", "hi", None), "一")
        self.assertEqual(await self.agent.turn("owner", "hi", None), SPENT.format(budget=100))
        self.clock.advance(3600)                    # 00:30 in Beijing: a new day
        self.assertEqual(await self.agent.turn("owner", "hi", None), "二")
        self.assertEqual(await self.today(date(2026, 12, 3)), [("test-model", 90, 20, 1, 0)])
        self.assertEqual(await self.today(date(2026, 12, 4)), [("test-model", 5, 5, 1, 0)])

    async def test_the_budget_is_per_user(self):
        self.model.script(answer("一", Usage(200, 0)), answer("二", Usage(1, 1)))
        await self.agent.turn("owner", "hi", None)
        self.assertEqual(await self.agent.turn("other", "hi", None), "二")

    async def test_the_total_is_read_from_the_store_at_each_turn(self):
        """Another process's counts (or an earlier start's) count too."""
        await self.store.record_usage(date(2026, 12, 3), "owner", "elsewhere", 70, 30, False)
        self.assertEqual(await self.agent.turn("owner", "hi", None), SPENT.format(budget=100))
        self.assertEqual(self.model.requests, [])

    async def test_a_scheduled_prompt_task_past_the_budget_gets_the_message_without_the_model(self):
        channel = FakeChannel("wechat")
        self.use(self.build(llm=self.llm, now=self.clock.now, channels=[channel], primary=channel))
        await self.store.record_usage(date(2026, 12, 3), "owner", "test-model", 100, 0, False)
        task = await self.store.add_task("owner", "晚报", "30 23 * * *", "prompt", "总结今天的新闻", self.clock.now(),
                                         self.clock.now())
        self.assertEqual(await self.router.run_task(task), SPENT.format(budget=100))
        await channel.wait_for("今日大模型额度已用完")
        self.assertEqual(self.model.requests, [])

    async def test_a_count_the_store_refuses_is_logged_and_still_counted(self):
        logs = capture_logs(self)

        async def refuse(*args):
            raise StoreError("database error: the disk is full")
        self.store.record_usage = refuse
        self.model.script(ask(("echo_low", {"text": "a"}), usage=Usage(80, 30)))
        self.assertEqual(await self.agent.turn("owner", "echo", None), SPENT.format(budget=100))
        self.assertTrue(any("were not stored" in r.getMessage() for r in logs if r.levelname == "ERROR"))


class StatusTest(BudgetTestCase):
    daily = 100_000

    async def status(self, user: str = "owner") -> str:
        return await self.agent.turn(user, "/status", None)

    def with_channel(self, channel) -> None:
        self.use(self.build(llm=self.llm, now=self.clock.now, channels=[channel], primary=channel))

    async def test_status_shows_the_figures(self):
        channel = WindowChannel(self.clock, opened_ago=3600, length=12 * 3600, left=5)
        self.with_channel(channel)
        await self.store.record_usage(date(2026, 12, 3), "owner", "test-model", 10_000, 2_000, False)
        await self.store.record_usage(date(2026, 12, 3), "owner", "backup-model", 300, 45, True)
        await self.store.record_usage(date(2026, 12, 2), "owner", "test-model", 99_999, 0, False)    # yesterday
        await self.store.enqueue("owner", "wechat", "reply", [("稍后发送", "c-1")], self.clock.now(), self.clock.now())
        asking = self.call_high()
        await self.owner.code()
        level = await asyncio.to_thread(self.runner.sandbox.level)
        lines = (await self.status()).splitlines()
        self.assertEqual(lines, [
            "iAs 状态：",
            "模型：gpt-4o-mini",
            "今日用量：12,345 / 100,000 tokens（backup-model 345；test-model 12,000；含估算）",
            f"沙箱级别：{level}" + (f"（{level.missing}）" if level.name == "none" else ""),
            "微信窗口：还剩 11 小时 0 分（至 2026-12-04 10:30 CST），本窗口还可发 5 条",
            "待发送消息：1 条",
            "待确认：mark_high",
            "有效授权：0 个",
        ])
        self.assertEqual(await self.approvals.redeem("owner", "取消"), "已取消：mark_high")
        await asking
        self.assertIn("待确认：无", await self.status())

    async def test_the_fallback_models_are_named_after_the_model(self):
        self.fallback_models = (Endpoint(None, "deepseek-chat", "sk-x", "OPENAI_API_KEY"),
                                Endpoint("http://127.0.0.1:1/v1", "qwen-plus", "sk-y", "IAS_FALLBACK_KEY_2"))
        self.use(self.build(llm=self.llm, now=self.clock.now))
        self.assertIn("\n模型：gpt-4o-mini（备用：deepseek-chat、qwen-plus）\n", await self.status())

    async def test_the_window_closed_or_never_opened(self):
        self.with_channel(WindowChannel(self.clock, opened_ago=13 * 3600, length=12 * 3600, left=0))
        self.assertIn("微信窗口：已关闭（2026-12-03 22:30 CST），在微信上发一条消息即重新打开", await self.status())
        self.with_channel(WindowChannel(self.clock, opened_ago=None, length=12 * 3600, left=0))
        self.assertIn("微信窗口：未打开（在微信上发一条消息即打开）", await self.status())

    async def test_on_the_console_without_a_model_or_budget(self):
        self.daily = None
        self.use(self.build(now=self.clock.now))            # no API key: no model
        report = await self.status()
        self.assertIn("模型：未配置（运行 python ias.py setup 或设置 OPENAI_API_KEY）", report)
        self.assertIn("今日用量：0 tokens\n", report)
        self.assertIn("微信窗口：console\n", report)
        console = FakeChannel("console")
        self.with_channel(console)
        self.assertIn("微信窗口：console\n", await self.status())

    async def test_without_the_database_status_is_one_line(self):
        flaky = await FlakyStore.open(self.dsn, self.chain)
        self.addAsyncCleanup(flaky.store.close)
        self.use(self.build(llm=self.llm, now=self.clock.now, store=flaky.store))
        flaky.lose()
        self.assertEqual(await self.status(), UNAVAILABLE)


class WindowChannel(FakeChannel):
    """A channel with a send window like WeChat's: opened `opened_ago` seconds before the clock's now (None:
    never), `length` seconds long, `left` messages left in it."""

    def __init__(self, clock: FakeClock, opened_ago: float | None, length: float, left: int):
        super().__init__("wechat")
        self.clock, self.opened_ago, self.length, self.left = clock, opened_ago, length, left

    async def window(self, user_id: str) -> Window:
        if self.opened_ago is None:
            return Window(None, None, self.length, self.left, False)
        opened = self.clock.timestamp() - self.opened_ago
        return Window(opened, opened + self.length, self.length, self.left, False)


class WireBudgetTest(BudgetTestCase):
    """The real client against a local endpoint that reports `usage` (or not, or nonsense)."""

    def model_for_test(self):
        """The endpoint (also `self.model`, checked complete at the end); its own problems fail the test."""
        self.server = self.model = LLMServer().start()
        self.addCleanup(self.server.close)
        self.addCleanup(self.server.check)
        return LLM("sk-test", self.server.base_url, "test-model", retry_delays=(0.01, 0.01))

    async def test_tokens_are_recorded_per_beijing_day_and_model(self):
        usage = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
        self.server.script(counted(calls(("echo_low", {"text": "a"})), usage), counted(text("好了。"), usage),
                           counted(text("早。"), {"prompt_tokens": 7, "completion_tokens": 3}))
        self.assertEqual(await self.agent.turn("owner", "echo", None), "好了。")
        self.clock.advance(3600)            # 16:30 UTC: the next day in Beijing
        self.assertEqual(await self.agent.turn("owner", "早", None), "早。")
        self.assertEqual(await self.today(date(2026, 12, 3)), [("test-model", 200, 40, 2, 0)])
        self.assertEqual(await self.today(date(2026, 12, 4)), [("test-model", 7, 3, 1, 0)])

    async def test_a_response_without_usage_is_recorded_as_estimated(self):
        self.server.script(counted(text("你好，主人。"), None))
        self.assertEqual(await self.agent.turn("owner", "你好", None), "你好，主人。")
        [(model, prompt, done, requests, estimated)] = await self.today()
        self.assertEqual((model, done, requests, estimated), ("test-model", 6, 1, 1))     # 18 bytes / 3
        self.assertGreater(prompt, 100)     # the system prompt and the tools, by their bytes

    async def test_hostile_usage_is_estimated_and_never_crashes(self):
        hostile = [{"prompt_tokens": -50, "completion_tokens": 5}, {"prompt_tokens": 10 ** 30, "completion_tokens": 5},
                   {"prompt_tokens": "12", "completion_tokens": "3"}, "lots", [1, 2], {"prompt_tokens": None}]
        for usage in hostile:
            self.server.script(counted(text("好。"), usage))
        self.server.script(raw(b'{"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": '
                               b'[{"index": 0, "message": {"role": "assistant", "content": "\\u597d\\u3002"}, '
                               b'"finish_reason": "stop"}], "usage": {"prompt_tokens": 1e400, "completion_tokens": 1}}'))
        for usage in [*hostile, "1e400"]:
            with self.subTest(usage=usage):
                self.assertEqual(await self.agent.turn("owner", "hi", None), "好。")
        [(_, prompt, done, requests, estimated)] = await self.today()
        self.assertEqual((done, requests, estimated), (14, 7, 7))      # "好。": 6 bytes, 2 tokens each time
        self.assertLess(prompt, 10 ** 6)            # estimates of a few kB each, nothing the endpoint claimed

    async def test_a_fallbacks_tokens_are_recorded_under_its_model(self):
        backup = LLMServer().start()
        self.addCleanup(backup.close)
        self.addCleanup(backup.check)
        chain = Models(self.llm, (LLM("sk-test", backup.base_url, "backup-model", retry_delays=(0.01,)),))
        self.addAsyncCleanup(chain.close)
        self.use(self.build(llm=chain, now=self.clock.now))
        self.server.script(error(500), error(500), error(500))
        backup.script(counted(text("备用模型在。"), {"prompt_tokens": 30, "completion_tokens": 4}))
        self.assertEqual(await self.agent.turn("owner", "在吗", None), "备用模型在。")
        self.assertEqual(await self.today(), [("backup-model", 30, 4, 1, 0)])

    async def test_past_the_budget_no_request_reaches_the_endpoint(self):
        self.daily = 1000
        self.use(self.build(llm=self.llm, now=self.clock.now))
        self.server.script(counted(text("一"), {"prompt_tokens": 900, "completion_tokens": 150}))
        self.assertEqual(await self.agent.turn("owner", "hi", None), "一")
        for message in ("再来", "还有吗"):
            self.assertEqual(await self.agent.turn("owner", message, None),
                             "今日大模型额度已用完（1000 tokens），明天恢复或调高 IAS_DAILY_TOKENS。")
        self.assertEqual(len(self.server.requests), 1)
        self.assertIn("今日用量：1,050 / 1,000 tokens", await self.agent.turn("owner", "/status", None))


if __name__ == "__main__":
    unittest.main()
